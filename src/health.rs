//! Run health: the alarms of a run, as pure functions of its state, events and series, as of a
//! point on its timeline or now. Every front-end reports them from here: the workbench's Workers
//! view, `roll-tui run` (a warning line as soon as one fires, through [`monitor::HealthMonitor`])
//! and `roll-tui runs show`.
//!
//! Rules (thresholds are the constants below):
//! - **stalled**: the run is `running` and its heartbeat is older than [`STALE_AFTER_MS`] (only
//!   without a replay cursor: the store keeps the latest heartbeat, not its history), or the
//!   latest run event is the store's "run marked interrupted" (its process was found gone).
//! - **worker failed**: a worker recorded `worker_failed` (died, went silent, failed a call); one
//!   alarm per worker, with the count, the last reason, and whether it was started again.
//! - **entropy collapse**: the last `actor/entropy` point is below [`ENTROPY_FLOOR`] nats, or below
//!   [`ENTROPY_RATIO`] of the mean of its first [`EARLY_POINTS`] points (once it has more).
//! - **all-equal rewards**: `group/frac_zero_std` was at least [`FLAT_FRACTION`] for the last
//!   [`FLAT_STEPS`] steps: almost no group has a reward signal left.
//! - **memory creeping up**: after each of the last [`CREEP_RELOADS`] reloads of one role, the
//!   device held more bytes than after the one before (the ledger of `devices`).
//!
//! "Since" is the step during which the condition began: for a series, the first step of the
//! current streak; for an event, the first step recorded at or after it (wall time of the `time/step`
//! series from the run's start; after a resume this is approximate).

pub mod ledger;
pub mod monitor;

use std::fmt;

use ledger::ledgers;
use serde::Serialize;

use crate::config::Stage;
use crate::metrics::Series;
use crate::store::RunInfo;
use crate::store::RunStatus;
use crate::store::liveness::STALE_AFTER_MS;
use crate::store::reads::StoredEvent;
use crate::store::records::EventKind;
use crate::text::{clean, human_bytes};

/// A point on a run's timeline: a step, and when that step was recorded (Unix ms). Alarms "as of"
/// it see only what had happened by then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsOf {
    pub step: u64,
    pub at_ms: i64,
}

/// What the rules need of the run itself.
#[derive(Debug, Clone, PartialEq)]
pub struct RunState {
    /// When the run was created (Unix ms): event times are placed on steps from here.
    pub start_ms: i64,
    pub status: RunStatus,
    pub heartbeat_at: i64,
    pub pid: Option<u32>,
}

impl From<&RunInfo> for RunState {
    fn from(info: &RunInfo) -> RunState {
        RunState {
            start_ms: info.created_at,
            status: info.status,
            heartbeat_at: info.heartbeat_at,
            pid: info.pid,
        }
    }
}

/// Below this entropy (nats per token) the policy is taken to have collapsed.
pub const ENTROPY_FLOOR: f64 = 0.05;
/// ... or below this fraction of its early value.
pub const ENTROPY_RATIO: f64 = 0.1;
/// The early value is the mean of this many first points.
pub const EARLY_POINTS: usize = 3;
pub const FLAT_FRACTION: f64 = 0.9;
pub const FLAT_STEPS: usize = 3;
pub const CREEP_RELOADS: usize = 3;

pub const ENTROPY_KEY: &str = "actor/entropy";
pub const FLAT_KEY: &str = "group/frac_zero_std";
/// The series whose wall times place an event on a step.
const STEP_KEY: &str = "time/step";

/// The keys of the series the rules read.
pub fn alarm_series_keys() -> [&'static str; 3] {
    [ENTROPY_KEY, FLAT_KEY, STEP_KEY]
}

/// The series the alarms read: the rest of a run's series need not be handed to the rules.
pub fn alarm_series(series: &[Series]) -> Vec<Series> {
    series
        .iter()
        .filter(|s| alarm_series_keys().contains(&s.key.as_str()))
        .cloned()
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlarmKind {
    Stalled,
    WorkerFailed,
    EntropyCollapse,
    FlatRewards,
    MemoryCreep,
}

impl AlarmKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AlarmKind::Stalled => "stalled",
            AlarmKind::WorkerFailed => "worker failed",
            AlarmKind::EntropyCollapse => "entropy collapse",
            AlarmKind::FlatRewards => "all-equal rewards",
            AlarmKind::MemoryCreep => "memory creeping up",
        }
    }
}

/// A step of a stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StepRef {
    pub stage: String,
    pub step: u64,
}

impl fmt::Display for StepRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.stage == Stage::Rl.as_str() {
            write!(f, "step {}", self.step)
        } else {
            write!(f, "{} step {}", self.stage, self.step)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Alarm {
    pub kind: AlarmKind,
    /// Where: `run`, a worker (`reward-1`), a series key, or `<role> on device <d>`.
    pub place: String,
    /// Since when, when the run's steps tell.
    pub since: Option<StepRef>,
    /// What was seen, for a person.
    pub detail: String,
}

/// The points of `s` as of `until` (steps after the cursor's are not there yet), finite ones only.
fn points(s: &Series, until: Option<AsOf>) -> Vec<(u64, f64)> {
    s.steps
        .iter()
        .zip(&s.values)
        .filter(|(step, v)| until.is_none_or(|c| **step <= c.step) && v.is_finite())
        .map(|(s, v)| (*s, *v))
        .collect()
}

/// The step during which `at_ms` fell: the first step recorded at or after it, or the one after
/// the last recorded.
fn step_at(series: &[Series], start_ms: i64, until: Option<AsOf>, at_ms: i64) -> Option<StepRef> {
    let timed: Vec<&Series> = if series.iter().any(|s| s.key == STEP_KEY) {
        series.iter().filter(|s| s.key == STEP_KEY).collect()
    } else {
        series.iter().collect()
    };
    let mut marks: Vec<(i64, &str, u64)> = timed
        .iter()
        .flat_map(|s| {
            s.steps
                .iter()
                .zip(&s.wall_time)
                .filter(|(step, _)| until.is_none_or(|c| **step <= c.step))
                .map(|(step, w)| (start_ms + (w * 1000.0) as i64, s.stage.as_str(), *step))
        })
        .collect();
    marks.sort();
    let (_, stage, step) = match marks.iter().find(|m| m.0 >= at_ms) {
        Some(m) => *m,
        None => {
            let (t, stage, step) = *marks.last()?;
            (t, stage, step + 1)
        }
    };
    Some(StepRef {
        stage: stage.to_string(),
        step,
    })
}

/// The first step of the streak of points at the end that satisfy `bad`, if the last one does.
fn streak_start(pts: &[(u64, f64)], bad: impl Fn(f64) -> bool) -> Option<(u64, usize)> {
    let n = pts.iter().rev().take_while(|(_, v)| bad(*v)).count();
    (n > 0).then(|| (pts[pts.len() - n].0, n))
}

fn step_ref(s: &Series, step: u64) -> Option<StepRef> {
    Some(StepRef {
        stage: s.stage.clone(),
        step,
    })
}

impl fmt::Display for Alarm {
    /// `entropy collapse · actor/entropy · since step 7: entropy 0.080 < 0.200 (early mean 2.000)`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} · {}", self.kind.as_str(), self.place)?;
        if let Some(s) = &self.since {
            write!(f, " · since {s}")?;
        }
        write!(f, ": {}", self.detail)
    }
}

/// The alarms of a run as of `until` (a point on its timeline) or now (`now_ms`).
pub fn alarms(
    info: &RunState,
    events: &[StoredEvent],
    series: &[Series],
    until: Option<AsOf>,
    now_ms: i64,
) -> Vec<Alarm> {
    let start = info.start_ms;
    let seen: Vec<&StoredEvent> = events
        .iter()
        .filter(|e| until.is_none_or(|c| e.at <= c.at_ms))
        .collect();
    let at_step = |at: i64| step_at(series, start, until, at);
    let mut out = vec![];

    // Stalled: the store found the process gone, or (now) the heartbeat is old.
    let run_event = seen.iter().rev().find(|e| {
        let r = &e.event;
        matches!(
            r.kind,
            EventKind::RunStarted
                | EventKind::RunResumed
                | EventKind::RunEnded
                | EventKind::RunMarkedInterrupted
        )
    });
    if let Some(e) = run_event.filter(|e| e.event.kind == EventKind::RunMarkedInterrupted) {
        out.push(Alarm {
            kind: AlarmKind::Stalled,
            place: "run".into(),
            since: at_step(e.at),
            detail: clean(&e.event.message, 200, false),
        });
    } else if until.is_none()
        && info.status == RunStatus::Running
        && now_ms - info.heartbeat_at > STALE_AFTER_MS
    {
        let pid = info.pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
        out.push(Alarm {
            kind: AlarmKind::Stalled,
            place: "run".into(),
            since: at_step(info.heartbeat_at),
            detail: format!(
                "no heartbeat for {:.0} s{pid}",
                (now_ms - info.heartbeat_at) as f64 / 1000.0
            ),
        });
    }

    // Failed workers, in the order they first failed.
    let mut failed: Vec<(&str, i64, usize, &str, bool)> = vec![];
    for e in &seen {
        let (Some(worker), kind) = (e.event.worker.as_deref(), e.event.kind) else {
            continue;
        };
        let known = failed.iter_mut().find(|f| f.0 == worker);
        match (kind, known) {
            (EventKind::WorkerFailed, Some(f)) => {
                f.2 += 1;
                f.3 = &e.event.message;
                f.4 = false;
            }
            (EventKind::WorkerFailed, None) => {
                failed.push((worker, e.at, 1, &e.event.message, false));
            }
            (EventKind::WorkerStarted, Some(f)) => f.4 = true,
            _ => {}
        }
    }
    for (worker, first, count, last, restarted) in failed {
        out.push(Alarm {
            kind: AlarmKind::WorkerFailed,
            place: clean(worker, 40, false),
            since: at_step(first),
            detail: format!(
                "failed {count}×, last: {}{}",
                clean(last, 200, false),
                if restarted { "; started again" } else { "" }
            ),
        });
    }

    // Entropy collapse.
    for s in series.iter().filter(|s| s.key == ENTROPY_KEY) {
        let pts = points(s, until);
        let Some(&(_, last)) = pts.last() else {
            continue;
        };
        let early_n = EARLY_POINTS.min(pts.len());
        let early = pts[..early_n].iter().map(|p| p.1).sum::<f64>() / early_n as f64;
        let threshold = if pts.len() > EARLY_POINTS && early > 0.0 {
            ENTROPY_FLOOR.max(ENTROPY_RATIO * early)
        } else {
            ENTROPY_FLOOR
        };
        if let Some((step, _)) = streak_start(&pts, |v| v < threshold) {
            out.push(Alarm {
                kind: AlarmKind::EntropyCollapse,
                place: s.key.clone(),
                since: step_ref(s, step),
                detail: format!("entropy {last:.3} < {threshold:.3} (early mean {early:.3})"),
            });
        }
    }

    // All-equal reward groups.
    for s in series.iter().filter(|s| s.key == FLAT_KEY) {
        let pts = points(s, until);
        if let Some((step, n)) = streak_start(&pts, |v| v >= FLAT_FRACTION)
            && n >= FLAT_STEPS
        {
            let last = pts.last().map_or(0.0, |p| p.1);
            out.push(Alarm {
                kind: AlarmKind::FlatRewards,
                place: s.key.clone(),
                since: step_ref(s, step),
                detail: format!(
                    "{:.0}% of groups all-equal (≥ {:.0}% for {n} steps): no learning signal",
                    last * 100.0,
                    FLAT_FRACTION * 100.0
                ),
            });
        }
    }

    // Memory creeping up across reload cycles.
    for ledger in ledgers(events, start, until.map(|c| c.at_ms)) {
        for role in ledger.roles() {
            let reloads: Vec<_> = ledger
                .transitions
                .iter()
                .filter(|t| t.reload && t.role == role)
                .collect();
            let Some(last) = reloads.len().checked_sub(CREEP_RELOADS) else {
                continue;
            };
            let window = &reloads[last..];
            if window
                .windows(2)
                .all(|w| w[1].resident_after > w[0].resident_after)
            {
                let sizes: Vec<String> = window
                    .iter()
                    .map(|t| human_bytes(t.resident_after))
                    .collect();
                out.push(Alarm {
                    kind: AlarmKind::MemoryCreep,
                    place: format!(
                        "{} on device {}",
                        clean(role, 20, false),
                        clean(&ledger.device, 8, false)
                    ),
                    since: at_step(window[0].at),
                    detail: format!(
                        "resident after its last {CREEP_RELOADS} reloads: {} (+{})",
                        sizes.join(" → "),
                        human_bytes(
                            window[CREEP_RELOADS - 1].resident_after - window[0].resident_after
                        )
                    ),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fixtures::{ev, transfer};

    const MIB: u64 = 1 << 20;
    const NOW: i64 = 1_000_000;

    /// A series of `key` with steps 1, 2, … recorded `step` seconds after the run's start.
    fn series(key: &str, values: &[f64]) -> Series {
        Series {
            stage: "rl".into(),
            key: key.into(),
            steps: (1..=values.len() as u64).collect(),
            wall_time: (1..=values.len()).map(|s| s as f64).collect(),
            values: values.to_vec(),
        }
    }

    fn info(id: i64, name: &str, status: RunStatus, created_at: i64) -> RunState {
        RunState::from(&crate::store::fixtures::info(id, name, status, created_at))
    }

    fn at_step(step: u64) -> Option<AsOf> {
        Some(AsOf {
            step,
            at_ms: step as i64 * 1000,
        })
    }

    fn kinds(a: &[Alarm]) -> Vec<AlarmKind> {
        a.iter().map(|a| a.kind).collect()
    }

    fn since(a: &Alarm) -> Option<u64> {
        a.since.as_ref().map(|s| s.step)
    }

    #[test]
    fn a_running_run_without_a_fresh_heartbeat_is_stalled() {
        let mut run = info(1, "r", RunStatus::Running, 0);
        run.pid = Some(77);
        run.heartbeat_at = NOW - STALE_AFTER_MS - 1_000;
        let steps = [series(STEP_KEY, &[1.0, 1.0, 1.0])];
        let found = alarms(&run, &[], &steps, None, NOW);
        assert_eq!(kinds(&found), [AlarmKind::Stalled]);
        assert_eq!(found[0].detail, "no heartbeat for 31 s (pid 77)");
        // The heartbeat stopped after step 3 was recorded: during step 4.
        assert_eq!(since(&found[0]), Some(4));
        // A fresh heartbeat, a finished run, or a replay cursor (heartbeats have no history): none.
        run.heartbeat_at = NOW - 10_000;
        assert!(alarms(&run, &[], &steps, None, NOW).is_empty());
        run.heartbeat_at = 0;
        assert!(alarms(&run, &[], &steps, at_step(2), NOW).is_empty());
        run.status = RunStatus::Finished;
        assert!(alarms(&run, &[], &steps, None, NOW).is_empty());
    }

    #[test]
    fn a_run_the_store_marked_interrupted_is_stalled_until_resumed() {
        let mut run = info(1, "r", RunStatus::Interrupted, 0);
        run.heartbeat_at = 0;
        let mut events = vec![
            ev(0, EventKind::RunStarted, None, "run 'r' started"),
            ev(
                5_500,
                EventKind::RunMarkedInterrupted,
                None,
                "run marked interrupted: no heartbeat for 45 s",
            ),
        ];
        let steps = [series(STEP_KEY, &[1.0; 5])];
        let found = alarms(&run, &events, &steps, None, NOW);
        assert_eq!(kinds(&found), [AlarmKind::Stalled]);
        assert_eq!(since(&found[0]), Some(6));
        // Replay before the mark: nothing yet.
        assert!(alarms(&run, &events, &steps, at_step(5), NOW).is_empty());
        events.push(ev(
            7_000,
            EventKind::RunResumed,
            None,
            "resumed from rl step 5",
        ));
        run.status = RunStatus::Finished;
        assert!(alarms(&run, &events, &steps, None, NOW).is_empty());
    }

    #[test]
    fn failed_workers_are_alarms_from_their_first_failure() {
        let run = info(1, "r", RunStatus::Finished, 0);
        let events = vec![
            ev(
                500,
                EventKind::WorkerStarted,
                Some("reward-1"),
                "started, pid 10",
            ),
            ev(
                2_500,
                EventKind::WorkerFailed,
                Some("reward-1"),
                "pid 10 died (signal: 9)",
            ),
            ev(
                2_600,
                EventKind::WorkerStarted,
                Some("reward-1"),
                "started, pid 11",
            ),
            ev(
                3_500,
                EventKind::WorkerFailed,
                Some("reward-1"),
                "no heartbeat answer for 30.0 s",
            ),
            ev(
                3_600,
                EventKind::WorkerExited,
                Some("reward-0"),
                "pid 9 exited (exit status: 0)",
            ),
        ];
        let steps = [series(STEP_KEY, &[1.0; 5])];
        let found = alarms(&run, &events, &steps, None, NOW);
        assert_eq!(kinds(&found), [AlarmKind::WorkerFailed]);
        assert_eq!(found[0].place, "reward-1");
        assert_eq!(since(&found[0]), Some(3));
        assert_eq!(
            found[0].detail,
            "failed 2×, last: no heartbeat answer for 30.0 s"
        );
        // At step 3 (t=3000): one failure, and it was started again.
        let then = alarms(&run, &events, &steps, at_step(3), NOW);
        assert_eq!(
            then[0].detail,
            "failed 1×, last: pid 10 died (signal: 9); started again"
        );
        assert!(alarms(&run, &events, &steps, at_step(2), NOW).is_empty());
    }

    #[test]
    fn entropy_collapse_below_a_tenth_of_its_early_value_or_the_floor() {
        let run = info(1, "r", RunStatus::Finished, 0);
        // Early mean (2.0 + 2.1 + 1.9) / 3 = 2.0, so the threshold is max(0.05, 0.2) = 0.2: the
        // last two points (0.15, 0.1) are below it, from step 6.
        let s = [series(ENTROPY_KEY, &[2.0, 2.1, 1.9, 1.0, 0.5, 0.15, 0.1])];
        let found = alarms(&run, &[], &s, None, NOW);
        assert_eq!(kinds(&found), [AlarmKind::EntropyCollapse]);
        assert_eq!(
            (found[0].place.as_str(), since(&found[0])),
            (ENTROPY_KEY, Some(6))
        );
        assert_eq!(found[0].detail, "entropy 0.100 < 0.200 (early mean 2.000)");
        // At step 5 the entropy (0.5) was still above.
        assert!(alarms(&run, &[], &s, at_step(5), NOW).is_empty());
        // Healthy, and too short for the ratio rule but above the floor: none.
        let healthy = [series(ENTROPY_KEY, &[2.0, 1.8, 1.9, 1.7, 1.8])];
        assert!(alarms(&run, &[], &healthy, None, NOW).is_empty());
        let short = [series(ENTROPY_KEY, &[2.0, 0.1])];
        assert!(alarms(&run, &[], &short, None, NOW).is_empty());
        // Under the floor from the start.
        let floor = [series(ENTROPY_KEY, &[0.01, 0.02])];
        assert_eq!(since(&alarms(&run, &[], &floor, None, NOW)[0]), Some(1));
    }

    #[test]
    fn all_equal_reward_groups_for_the_last_steps() {
        let run = info(1, "r", RunStatus::Finished, 0);
        let s = [series(
            FLAT_KEY,
            &[0.2, 0.95, 0.5, 0.9, 1.0, 0.95, f64::NAN],
        )];
        let found = alarms(&run, &[], &s, None, NOW);
        assert_eq!(kinds(&found), [AlarmKind::FlatRewards]);
        // Steps 4, 5, 6 are at or above 0.9 (the NaN at step 7 is no point).
        assert_eq!(since(&found[0]), Some(4));
        assert_eq!(
            found[0].detail,
            "95% of groups all-equal (≥ 90% for 3 steps): no learning signal"
        );
        // At step 5 only two steps in a row: not yet.
        assert!(alarms(&run, &[], &s, at_step(5), NOW).is_empty());
        let fine = [series(FLAT_KEY, &[0.95, 0.95, 0.95, 0.3])];
        assert!(alarms(&run, &[], &fine, None, NOW).is_empty());
    }

    #[test]
    fn memory_creeping_up_across_reload_cycles() {
        let run = info(1, "r", RunStatus::Finished, 0);
        let cycle = |bytes: [u64; 3]| {
            vec![
                transfer(1_000, true, "reference", "0", bytes[0], "train"),
                transfer(2_000, false, "reference", "0", bytes[0], "generate"),
                transfer(3_000, true, "reference", "0", bytes[1], "train"),
                transfer(4_000, false, "reference", "0", bytes[1], "generate"),
                transfer(5_000, true, "reference", "0", bytes[2], "train"),
            ]
        };
        let steps = [series(STEP_KEY, &[1.0; 6])];
        let events = cycle([100 * MIB, 110 * MIB, 120 * MIB]);
        let found = alarms(&run, &events, &steps, None, NOW);
        assert_eq!(kinds(&found), [AlarmKind::MemoryCreep]);
        assert_eq!(found[0].place, "reference on device 0");
        assert_eq!(since(&found[0]), Some(1));
        assert_eq!(
            found[0].detail,
            "resident after its last 3 reloads: 100.0 MiB → 110.0 MiB → 120.0 MiB (+20.0 MiB)"
        );
        // Replay at step 4: two reloads only.
        assert!(alarms(&run, &events, &steps, at_step(4), NOW).is_empty());
        // Steady, or down again: none.
        for bytes in [[100, 110, 110], [100, 120, 110]] {
            let events = cycle(bytes.map(|b| b * MIB));
            assert!(alarms(&run, &events, &steps, None, NOW).is_empty());
        }
    }

    #[test]
    fn events_fall_on_the_step_they_happened_during() {
        // time/step points at 1 s (step 1) and 2 s (step 2) from a start at 10 s.
        let s = [series(STEP_KEY, &[1.0, 1.0]), series("other", &[5.0; 9])];
        let at = |ms| step_at(&s, 10_000, None, ms).map(|r| r.to_string());
        assert_eq!(at(10_500).as_deref(), Some("step 1"));
        assert_eq!(at(11_000).as_deref(), Some("step 1"));
        assert_eq!(at(11_001).as_deref(), Some("step 2"));
        assert_eq!(at(99_000).as_deref(), Some("step 3"));
        assert_eq!(step_at(&[], 0, None, 5), None);
        let sft = StepRef {
            stage: "sft".into(),
            step: 2,
        };
        assert_eq!(sft.to_string(), "sft step 2");
    }
}
