//! Health as a run goes: fed each step's metrics, worker events and transfers as they happen, the
//! monitor keeps the few series and events the rules read and evaluates [`super::alarms`] — the
//! same rules the workbench and `runs show` apply to the store — after every step, returning each
//! alarm the first time it fires (by kind and place).

use std::collections::HashSet;

use super::{Alarm, AlarmKind, RunState, alarm_series_keys, alarms};
use crate::config::Stage;
use crate::metrics::{Metrics, Series, WorkerNote};
use crate::scheduler::Transfer;
use crate::store::RunStatus;
use crate::store::reads::StoredEvent;
use crate::store::records::EventRecord;

pub struct HealthMonitor {
    start_ms: i64,
    series: Vec<Series>,
    events: Vec<StoredEvent>,
    raised: HashSet<(AlarmKind, String)>,
}

impl HealthMonitor {
    /// A monitor of a run that started (or resumed) at `start_ms` (Unix ms).
    pub fn new(start_ms: i64) -> Self {
        HealthMonitor {
            start_ms,
            series: vec![],
            events: vec![],
            raised: HashSet::new(),
        }
    }

    /// A worker event at `at_ms`.
    pub fn worker(&mut self, note: &WorkerNote, at_ms: i64) {
        self.events.push(StoredEvent {
            at: at_ms,
            event: EventRecord::of_worker(note),
        });
    }

    /// An offload or reload at `at_ms`.
    pub fn transfer(&mut self, transfer: &Transfer, at_ms: i64) {
        self.events.push(StoredEvent {
            at: at_ms,
            event: EventRecord::of_transfer(transfer),
        });
    }

    /// Step `step` of `stage` finished at `at_ms` with `metrics`: the alarms that fire for the
    /// first time.
    pub fn step(&mut self, stage: Stage, step: usize, metrics: &Metrics, at_ms: i64) -> Vec<Alarm> {
        let wall = (at_ms - self.start_ms) as f64 / 1000.0;
        for key in alarm_series_keys() {
            let Some(&value) = metrics.get(key) else {
                continue;
            };
            let at = self
                .series
                .iter()
                .position(|s| s.stage == stage.as_str() && s.key == key);
            let s = match at {
                Some(at) => &mut self.series[at],
                None => {
                    self.series.push(Series {
                        stage: stage.as_str().into(),
                        key: key.into(),
                        steps: vec![],
                        wall_time: vec![],
                        values: vec![],
                    });
                    let last = self.series.len() - 1;
                    &mut self.series[last]
                }
            };
            s.steps.push(step as u64);
            s.wall_time.push(wall);
            s.values.push(value);
        }
        let run = RunState {
            start_ms: self.start_ms,
            status: RunStatus::Running,
            heartbeat_at: at_ms,
            pid: None,
        };
        alarms(&run, &self.events, &self.series, None, at_ms)
            .into_iter()
            .filter(|a| self.raised.insert((a.kind, a.place.clone())))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Role;
    use crate::metrics::WorkerNotice;

    fn metrics(pairs: &[(&str, f64)]) -> Metrics {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn an_alarm_is_returned_once_when_it_first_fires() {
        let mut m = HealthMonitor::new(0);
        // Entropy 2.0 for three steps (the early mean), then 0.1 < max(0.05, 0.1 · 2.0) = 0.2.
        for step in 1..=3 {
            let got = m.step(
                Stage::Rl,
                step,
                &metrics(&[("actor/entropy", 2.0)]),
                step as i64,
            );
            assert!(got.is_empty(), "step {step}: {got:?}");
        }
        let got = m.step(Stage::Rl, 4, &metrics(&[("actor/entropy", 0.1)]), 4);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].kind, AlarmKind::EntropyCollapse);
        assert_eq!(got[0].since.as_ref().map(|s| s.step), Some(4));
        // Still collapsed: already reported.
        assert!(
            m.step(Stage::Rl, 5, &metrics(&[("actor/entropy", 0.1)]), 5)
                .is_empty()
        );
    }

    #[test]
    fn worker_failures_and_flat_groups_fire_from_what_was_fed() {
        let mut m = HealthMonitor::new(0);
        let died = WorkerNote {
            role: Role::Reward,
            index: 1,
            pid: Some(42),
            notice: WorkerNotice::Failed,
            phase: None,
            node: None,
            text: "pid 42 died (killed by signal 9)".into(),
        };
        m.worker(&died, 500);
        let got = m.step(
            Stage::Rl,
            1,
            &metrics(&[("group/frac_zero_std", 1.0)]),
            1000,
        );
        assert_eq!(
            got.iter()
                .map(|a| (a.kind, a.place.as_str()))
                .collect::<Vec<_>>(),
            [(AlarmKind::WorkerFailed, "reward-1")]
        );
        // All-equal groups for FLAT_STEPS (3) steps in a row.
        assert!(
            m.step(
                Stage::Rl,
                2,
                &metrics(&[("group/frac_zero_std", 0.95)]),
                2000
            )
            .is_empty()
        );
        let got = m.step(
            Stage::Rl,
            3,
            &metrics(&[("group/frac_zero_std", 0.9)]),
            3000,
        );
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].kind, AlarmKind::FlatRewards);
        assert_eq!(got[0].since.as_ref().map(|s| s.step), Some(1));
    }
}
