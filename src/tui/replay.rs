//! Replay: a cursor on a run's timeline. While it is set, every view shows the run as of that
//! point (the dashboard draws the points recorded until then and reads the values there, samples
//! show that step, workers and events stop at its time). It steps by hand or plays at a chosen
//! speed.
//!
//! The timeline is every (stage, step) the run recorded, in the order of their wall time, so an
//! SFT stage followed by RL replays as one sequence. A step's time is the run's start plus the
//! step's wall time (seconds the run has been working; a resumed run's pause is not in it, so
//! events of a resumed run line up approximately).

use crate::metrics::Series;

/// A point on a run's timeline: a step, and when that step was recorded (Unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub step: u64,
    pub at_ms: i64,
}

/// One recorded step of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Tick {
    pub stage: String,
    pub step: u64,
    /// Seconds since the run started (the series' wall time).
    pub wall: f64,
}

/// Every step of a run, in time order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    pub ticks: Vec<Tick>,
    pub start_ms: i64,
}

impl Timeline {
    pub fn from_series(series: &[Series], start_ms: i64) -> Timeline {
        let mut ticks: Vec<Tick> = vec![];
        for s in series {
            for (&step, &wall) in s.steps.iter().zip(&s.wall_time) {
                ticks.push(Tick {
                    stage: s.stage.clone(),
                    step,
                    wall,
                });
            }
        }
        // One tick per (stage, step), at the earliest time any of its series was recorded.
        ticks.sort_by(|a, b| {
            (&a.stage, a.step)
                .cmp(&(&b.stage, b.step))
                .then(a.wall.total_cmp(&b.wall))
        });
        ticks.dedup_by(|b, a| a.stage == b.stage && a.step == b.step);
        ticks.sort_by(|a, b| a.wall.total_cmp(&b.wall).then(a.step.cmp(&b.step)));
        Timeline { ticks, start_ms }
    }

    pub fn len(&self) -> usize {
        self.ticks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ticks.is_empty()
    }

    pub fn cursor(&self, index: usize) -> Option<Cursor> {
        let t = self.ticks.get(index)?;
        Some(Cursor {
            step: t.step,
            at_ms: self.start_ms + (t.wall * 1000.0).round() as i64,
        })
    }
}

/// Play speeds, in steps per second.
pub const SPEEDS: [f64; 5] = [1.0, 2.0, 5.0, 10.0, 25.0];

#[derive(Debug, Clone, PartialEq)]
pub struct Replay {
    /// Index into the timeline.
    pub index: usize,
    pub playing: bool,
    /// Index into [`SPEEDS`].
    pub speed: usize,
    /// Fractional steps of play not yet taken.
    carry: f64,
}

impl Replay {
    /// Replay from the newest step; `None` when the run has recorded nothing.
    pub fn start(timeline: &Timeline) -> Option<Replay> {
        (!timeline.is_empty()).then(|| Replay {
            index: timeline.len() - 1,
            playing: false,
            speed: 0,
            carry: 0.0,
        })
    }

    pub fn tick<'a>(&self, timeline: &'a Timeline) -> Option<&'a Tick> {
        timeline.ticks.get(self.index)
    }

    /// Move by `delta` steps, clamped to the timeline; stepping by hand pauses play.
    pub fn step_by(&mut self, timeline: &Timeline, delta: i64) {
        self.playing = false;
        self.carry = 0.0;
        self.move_by(timeline, delta);
    }

    fn move_by(&mut self, timeline: &Timeline, delta: i64) {
        let last = timeline.len().saturating_sub(1) as i64;
        self.index = (self.index as i64 + delta).clamp(0, last) as usize;
    }

    /// Play or pause; playing from the last step starts again from the first.
    pub fn toggle_play(&mut self, timeline: &Timeline) {
        self.playing = !self.playing;
        self.carry = 0.0;
        if self.playing && self.index + 1 >= timeline.len() {
            self.index = 0;
        }
    }

    pub fn next_speed(&mut self) {
        self.speed = (self.speed + 1) % SPEEDS.len();
    }

    /// Advance play by `seconds`; stops at the end. Whether the cursor moved.
    pub fn advance(&mut self, timeline: &Timeline, seconds: f64) -> bool {
        if !self.playing {
            return false;
        }
        self.carry += seconds * SPEEDS[self.speed];
        let whole = self.carry.floor();
        self.carry -= whole;
        let before = self.index;
        self.move_by(timeline, whole as i64);
        if self.index + 1 >= timeline.len() {
            self.playing = false;
        }
        self.index != before
    }

    /// The same place (stage and step) on a timeline that grew, e.g. after a reload.
    pub fn keep_on(&mut self, old: &Timeline, new: &Timeline) {
        if let Some(t) = old.ticks.get(self.index)
            && let Some(i) = new
                .ticks
                .iter()
                .position(|n| n.stage == t.stage && n.step == t.step)
        {
            self.index = i;
        }
        self.index = self.index.min(new.len().saturating_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(stage: &str, steps: &[u64], walls: &[f64]) -> Series {
        Series {
            stage: stage.into(),
            key: "k".into(),
            steps: steps.to_vec(),
            wall_time: walls.to_vec(),
            values: vec![0.0; steps.len()],
        }
    }

    #[test]
    fn the_timeline_orders_both_stages_by_time_once_per_step() {
        let s = [
            series("rl", &[1, 2], &[10.0, 12.0]),
            series("sft", &[1, 2, 3], &[1.0, 2.0, 3.0]),
            // Another rl series of the same steps, recorded a little later.
            series("rl", &[1, 2], &[10.5, 12.5]),
        ];
        let t = Timeline::from_series(&s, 1_000);
        let order: Vec<(&str, u64, f64)> = t
            .ticks
            .iter()
            .map(|x| (x.stage.as_str(), x.step, x.wall))
            .collect();
        assert_eq!(
            order,
            [
                ("sft", 1, 1.0),
                ("sft", 2, 2.0),
                ("sft", 3, 3.0),
                ("rl", 1, 10.0),
                ("rl", 2, 12.0)
            ]
        );
        assert_eq!(
            t.cursor(3),
            Some(Cursor {
                step: 1,
                at_ms: 11_000
            })
        );
        assert_eq!(t.cursor(5), None);
    }

    #[test]
    fn stepping_clamps_and_play_advances_at_its_speed_then_stops_at_the_end() {
        let t = Timeline::from_series(&[series("rl", &[1, 2, 3, 4, 5, 6], &[0.0; 6])], 0);
        let mut r = Replay::start(&t).unwrap();
        assert_eq!(r.index, 5);
        r.step_by(&t, 10);
        assert_eq!(r.index, 5);
        r.step_by(&t, -10);
        assert_eq!(r.index, 0);
        r.toggle_play(&t);
        // 1 step/s: a quarter second moves nothing, four of them move one step.
        assert!(!r.advance(&t, 0.25));
        for _ in 0..3 {
            r.advance(&t, 0.25);
        }
        assert_eq!(r.index, 1);
        r.next_speed(); // 2 steps/s
        r.advance(&t, 1.0);
        assert_eq!(r.index, 3);
        r.advance(&t, 10.0);
        assert_eq!((r.index, r.playing), (5, false));
        // Playing from the end starts over.
        r.toggle_play(&t);
        assert_eq!((r.index, r.playing), (0, true));
        r.step_by(&t, 1);
        assert!(!r.playing, "stepping by hand pauses");
    }

    #[test]
    fn the_cursor_stays_on_its_step_when_the_timeline_grows() {
        let old = Timeline::from_series(&[series("rl", &[1, 2], &[1.0, 2.0])], 0);
        let new = Timeline::from_series(
            &[
                series("sft", &[1], &[0.5]),
                series("rl", &[1, 2, 3], &[1.0, 2.0, 3.0]),
            ],
            0,
        );
        let mut r = Replay::start(&old).unwrap();
        r.keep_on(&old, &new);
        assert_eq!(r.tick(&new).map(|t| t.step), Some(2));
        assert_eq!(r.index, 2);
        assert!(Replay::start(&Timeline::default()).is_none());
    }
}
