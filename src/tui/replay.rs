//! Replay: a cursor on a run's timeline. While it is set, every view shows the run as of that
//! point (the dashboard draws the points recorded until then and reads the values there, samples
//! show that step, workers and events stop at its time). It steps by hand or plays at a chosen
//! speed.
//!
//! The timeline is every (stage, step) the run recorded, in the order of their wall time, so an
//! SFT stage followed by RL replays as one sequence. A step's time is the run's start plus the
//! step's wall time (seconds the run has been working; a resumed run's pause is not in it, so
//! events of a resumed run line up approximately).

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::metrics::Series;

/// A point on a run's timeline: a step, and when that step was recorded (Unix ms).
pub type Cursor = crate::health::AsOf;

/// One recorded step of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct Tick {
    /// Shared by every tick of the stage: a million-step run does not hold a million copies.
    pub stage: Arc<str>,
    pub step: u64,
    /// Seconds since the run started (the series' wall time).
    pub wall: f64,
}

/// Every step of a run, in time order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    pub ticks: Vec<Tick>,
    pub start_ms: i64,
    /// Per stage, its steps in order with the wall time of their tick: what [`Timeline::extend`]
    /// needs to tell a new step from one it has, and an earlier record of a step from a later one,
    /// without a scan (a live run's new steps come last: a push).
    steps: BTreeMap<Arc<str>, Vec<(u64, f64)>>,
}

/// The order of ticks: by wall time, then step, then stage.
fn tick_order(a: &Tick, b: &Tick) -> Ordering {
    a.wall
        .total_cmp(&b.wall)
        .then(a.step.cmp(&b.step))
        .then_with(|| a.stage.cmp(&b.stage))
}

/// The wall of `step` in a stage's steps.
fn wall_of(steps: &[(u64, f64)], step: u64) -> Option<f64> {
    let i = steps.binary_search_by_key(&step, |e| e.0).ok()?;
    Some(steps[i].1)
}

impl Timeline {
    pub fn from_series(series: &[Series], start_ms: i64) -> Timeline {
        // One tick per (stage, step), at the earliest time any of its series was recorded. Each
        // series is sorted by step, so the stable sort merges runs rather than sorting afresh.
        let mut steps: BTreeMap<Arc<str>, Vec<(u64, f64)>> = BTreeMap::new();
        for s in series {
            let list = match steps.get_mut(s.stage.as_str()) {
                Some(list) => list,
                None => steps.entry(Arc::from(s.stage.as_str())).or_default(),
            };
            list.extend(s.steps.iter().copied().zip(s.wall_time.iter().copied()));
        }
        for list in steps.values_mut() {
            list.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
            list.dedup_by_key(|e| e.0);
        }
        let mut ticks: Vec<Tick> = steps
            .iter()
            .flat_map(|(stage, list)| {
                list.iter().map(|&(step, wall)| Tick {
                    stage: stage.clone(),
                    step,
                    wall,
                })
            })
            .collect();
        ticks.sort_by(tick_order);
        Timeline {
            ticks,
            start_ms,
            steps,
        }
    }

    /// Take in `tails`, the points appended to the run's series since the timeline was built (or
    /// last extended), so that it equals [`Timeline::from_series`] over the grown series. Costs
    /// O(new points) when they come after the timeline's last tick, as a live run's do; a point
    /// earlier than that (a late series, or an earlier record of a step it has) re-sorts it.
    pub fn extend(&mut self, tails: &[Series]) {
        let mut fresh: Vec<(Arc<str>, u64)> = vec![];
        let mut moved_back = false;
        for s in tails.iter().filter(|s| !s.steps.is_empty()) {
            let stage: Arc<str> = match self.steps.get_key_value(s.stage.as_str()) {
                Some((stage, _)) => stage.clone(),
                None => Arc::from(s.stage.as_str()),
            };
            let list = self.steps.entry(stage.clone()).or_default();
            for (&step, &wall) in s.steps.iter().zip(&s.wall_time) {
                match list.last() {
                    Some(&(last, _)) if step <= last => {}
                    _ => {
                        list.push((step, wall));
                        fresh.push((stage.clone(), step));
                        continue;
                    }
                }
                match list.binary_search_by_key(&step, |e| e.0) {
                    Err(at) => {
                        list.insert(at, (step, wall));
                        fresh.push((stage.clone(), step));
                    }
                    Ok(at) if wall.total_cmp(&list[at].1) == Ordering::Less => {
                        list[at].1 = wall;
                        moved_back = true;
                    }
                    Ok(_) => {}
                }
            }
        }
        let steps = &self.steps;
        let wall = |stage: &str, step: u64| {
            steps
                .get(stage)
                .and_then(|list| wall_of(list, step))
                .unwrap_or(f64::NAN) // not reached: every tick's step is in `steps`
        };
        if moved_back {
            for t in &mut self.ticks {
                t.wall = wall(&t.stage, t.step);
            }
        }
        let mut new: Vec<Tick> = fresh
            .into_iter()
            .map(|(stage, step)| Tick {
                wall: wall(&stage, step),
                stage,
                step,
            })
            .collect();
        new.sort_by(tick_order);
        let in_order = match (self.ticks.last(), new.first()) {
            (Some(last), Some(first)) => tick_order(last, first) == Ordering::Less,
            _ => true,
        };
        self.ticks.append(&mut new);
        if moved_back || !in_order {
            self.ticks.sort_by(tick_order);
        }
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

    /// Back on `was` (the tick it was on, by stage and step) on a timeline that grew, e.g. after
    /// a poll or a reload.
    pub fn keep_on(&mut self, was: Option<&Tick>, new: &Timeline) {
        if let Some(t) = was
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
pub(crate) mod tests {
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
            .map(|x| (&*x.stage, x.step, x.wall))
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

    /// Points `from..to` of `s`.
    pub(crate) fn slice(s: &Series, from: usize, to: usize) -> Series {
        Series {
            stage: s.stage.clone(),
            key: s.key.clone(),
            steps: s.steps[from..to].to_vec(),
            wall_time: s.wall_time[from..to].to_vec(),
            values: s.values[from..to].to_vec(),
        }
    }

    #[test]
    fn extending_by_tails_is_the_timeline_of_the_grown_series() {
        // SFT steps 1..=40 at wall ≈ step, then RL steps 1..=60 at wall ≈ 50 + step. Some series
        // record every 2nd or 5th step, some a little earlier than others (a lagging series then
        // moves a step back in time), one only shows up in later tails and one ties the SFT walls.
        let every = |stage: &str, n: u64, k: u64, wall: &dyn Fn(u64) -> f64| {
            let steps: Vec<u64> = (1..=n).filter(|s| s % k == 0).collect();
            let walls: Vec<f64> = steps.iter().map(|&s| wall(s)).collect();
            series(stage, &steps, &walls)
        };
        let full = [
            every("sft", 40, 1, &|s| s as f64),
            every("sft", 40, 2, &|s| s as f64 + 0.5),
            every("sft", 40, 5, &|s| s as f64 - 0.25),
            every("rl", 10, 1, &|s| s as f64),
            every("rl", 60, 1, &|s| 50.0 + s as f64),
            every("rl", 60, 2, &|s| 50.1 + s as f64),
            every("rl", 60, 3, &|s| 49.5 + s as f64),
        ];
        // A small linear congruential generator picks how far each series has got by each poll.
        let mut seed: u64 = 1;
        let mut next = |n: usize| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) as usize % (n + 1)
        };
        for run in 0..20 {
            let mut done = vec![0; full.len()];
            let mut grown: Vec<Series> = vec![];
            let mut t = Timeline::default();
            for round in 0..6 {
                let mut tails = vec![];
                for (i, s) in full.iter().enumerate() {
                    // The last series first appears in round 2; the last round takes all.
                    let to = match round {
                        _ if i == full.len() - 1 && round < 2 => 0,
                        5 => s.steps.len(),
                        _ => done[i] + next(s.steps.len() - done[i]),
                    };
                    tails.push(slice(s, done[i], to));
                    done[i] = to;
                }
                tails.rotate_left(run % full.len());
                grown = full
                    .iter()
                    .zip(&done)
                    .map(|(s, &n)| slice(s, 0, n))
                    .collect();
                if round == 0 {
                    t = Timeline::from_series(&tails, 7);
                } else {
                    t.extend(&tails);
                }
                assert_eq!(
                    t,
                    Timeline::from_series(&grown, 7),
                    "run {run}, round {round}"
                );
            }
            assert_eq!(t.len(), 40 + 60, "run {run}");
            let mut from_empty = Timeline::default();
            from_empty.extend(&grown);
            assert_eq!(from_empty, Timeline::from_series(&grown, 0));
        }
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
        r.keep_on(r.tick(&old), &new);
        assert_eq!(r.tick(&new).map(|t| t.step), Some(2));
        assert_eq!(r.index, 2);
        assert!(Replay::start(&Timeline::default()).is_none());
    }
}
