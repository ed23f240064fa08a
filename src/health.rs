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

/// What every rule looks at: the run, what had happened by `until`, and how to place a time on a
/// step.
struct Seen<'a> {
    info: &'a RunState,
    events: Vec<&'a StoredEvent>,
    all_events: &'a [StoredEvent],
    series: &'a [Series],
    until: Option<AsOf>,
    now_ms: i64,
}

impl Seen<'_> {
    fn at_step(&self, at: i64) -> Option<StepRef> {
        step_at(self.series, self.info.start_ms, self.until, at)
    }
}

/// The alarms of a run as of `until` (a point on its timeline) or now (`now_ms`), rule by rule.
pub fn alarms(
    info: &RunState,
    events: &[StoredEvent],
    series: &[Series],
    until: Option<AsOf>,
    now_ms: i64,
) -> Vec<Alarm> {
    let seen = Seen {
        info,
        events: events
            .iter()
            .filter(|e| until.is_none_or(|c| e.at <= c.at_ms))
            .collect(),
        all_events: events,
        series,
        until,
        now_ms,
    };
    let mut out = vec![];
    out.extend(stalled(&seen));
    out.extend(failed_workers(&seen));
    out.extend(entropy_collapse(&seen));
    out.extend(flat_rewards(&seen));
    out.extend(memory_creep(&seen));
    out
}

/// Stalled: the store found the process gone, or (now) the heartbeat is old.
fn stalled(seen: &Seen<'_>) -> Option<Alarm> {
    let info = seen.info;
    let run_event = seen.events.iter().rev().find(|e| {
        matches!(
            e.event.kind,
            EventKind::RunStarted
                | EventKind::RunResumed
                | EventKind::RunEnded
                | EventKind::RunMarkedInterrupted
        )
    });
    if let Some(e) = run_event.filter(|e| e.event.kind == EventKind::RunMarkedInterrupted) {
        return Some(Alarm {
            kind: AlarmKind::Stalled,
            place: "run".into(),
            since: seen.at_step(e.at),
            detail: clean(&e.event.message, 200, false),
        });
    }
    let silent_ms = seen.now_ms - info.heartbeat_at;
    (seen.until.is_none() && info.status == RunStatus::Running && silent_ms > STALE_AFTER_MS).then(
        || {
            let pid = info.pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
            Alarm {
                kind: AlarmKind::Stalled,
                place: "run".into(),
                since: seen.at_step(info.heartbeat_at),
                detail: format!("no heartbeat for {:.0} s{pid}", silent_ms as f64 / 1000.0),
            }
        },
    )
}

/// Failed workers, in the order they first failed.
fn failed_workers(seen: &Seen<'_>) -> Vec<Alarm> {
    // (worker, first failure, failures, last message, started again since)
    let mut failed: Vec<(&str, i64, usize, &str, bool)> = vec![];
    for e in &seen.events {
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
    failed
        .into_iter()
        .map(|(worker, first, count, last, restarted)| Alarm {
            kind: AlarmKind::WorkerFailed,
            place: clean(worker, 40, false),
            since: seen.at_step(first),
            detail: format!(
                "failed {count}×, last: {}{}",
                clean(last, 200, false),
                if restarted { "; started again" } else { "" }
            ),
        })
        .collect()
}

/// Entropy collapse: the latest entropy below the floor, or below a fraction of its early mean.
fn entropy_collapse(seen: &Seen<'_>) -> Vec<Alarm> {
    let mut out = vec![];
    for s in seen.series.iter().filter(|s| s.key == ENTROPY_KEY) {
        let pts = points(s, seen.until);
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
    out
}

/// All-equal reward groups for the last steps: no learning signal left.
fn flat_rewards(seen: &Seen<'_>) -> Vec<Alarm> {
    let mut out = vec![];
    for s in seen.series.iter().filter(|s| s.key == FLAT_KEY) {
        let pts = points(s, seen.until);
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
    out
}

/// Memory creeping up across reload cycles of one role on one device.
fn memory_creep(seen: &Seen<'_>) -> Vec<Alarm> {
    let mut out = vec![];
    let until_ms = seen.until.map(|c| c.at_ms);
    for ledger in ledgers(seen.all_events, seen.info.start_ms, until_ms) {
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
            let growing = window
                .windows(2)
                .all(|w| w[1].resident_after > w[0].resident_after);
            if !growing {
                continue;
            }
            let sizes: Vec<String> = window
                .iter()
                .map(|t| human_bytes(t.resident_after))
                .collect();
            let grown = window[CREEP_RELOADS - 1].resident_after - window[0].resident_after;
            out.push(Alarm {
                kind: AlarmKind::MemoryCreep,
                place: format!(
                    "{} on device {}",
                    clean(role, 20, false),
                    clean(&ledger.device, 8, false)
                ),
                since: seen.at_step(window[0].at),
                detail: format!(
                    "resident after its last {CREEP_RELOADS} reloads: {} (+{})",
                    sizes.join(" → "),
                    human_bytes(grown)
                ),
            });
        }
    }
    out
}

#[cfg(test)]
#[path = "health/tests.rs"]
mod tests;
