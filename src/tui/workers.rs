//! The Workers view: the run's alarms at the top ([`alarms`]), a table of the run and its worker
//! processes (pid, state, last sign of life, restarts: [`rows`]) and the devices pane ([`devices`]:
//! memory ledger and timeline). Everything is derived from the run row, its events and its series,
//! as of a replay cursor or now; this module only keeps the selection and draws.

use std::sync::Arc;

pub mod devices;
mod render;
pub mod rows;

pub use render::render;

pub use crate::health::{Alarm, AlarmKind, StepRef};

/// The series the view reads: the alarms' (`crate::health::alarm_series`), and each TCP worker's
/// link (`workers/<worker>/rtt_ms`, `.../mirror_mb`: `crate::worker::link`).
pub fn view_series(series: &[Series]) -> Vec<Series> {
    let mut out = crate::health::alarm_series(series);
    out.extend(
        series
            .iter()
            .filter(|s| {
                s.key.starts_with("workers/")
                    && (s.key.ends_with("/rtt_ms") || s.key.ends_with("/mirror_mb"))
            })
            .cloned(),
    );
    out
}

/// The run's alarms as of the replay cursor or now (the core's rules, `health::alarms`).
pub fn alarms(
    info: &RunInfo,
    events: &[StoredEvent],
    series: &[Series],
    until: Option<Cursor>,
    now_ms: i64,
) -> Vec<Alarm> {
    crate::health::alarms(&info.into(), events, series, until, now_ms)
}
pub use rows::{WorkerRow, WorkerState, worker_rows};

use super::action::Action;
use super::replay::Cursor;
use crate::metrics::Series;
use crate::store::reads::StoredEvent;
use crate::store::{RunId, RunInfo};
use devices::ledgers;

/// Which pane the keys move in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Focus {
    #[default]
    Workers,
    Devices,
}

#[derive(Debug, Clone)]
pub struct WorkersView {
    pub run: RunId,
    /// False until the first load answers: the view shows a spinner.
    pub loaded: bool,
    pub focus: Focus,
    pub info: Option<RunInfo>,
    /// The run's events (the app's log, shared).
    pub events: Arc<Vec<StoredEvent>>,
    pub series: Vec<Series>,
    /// The selected row: `None` is the run's own row, else a worker's name (kept across reloads).
    pub selected: Option<String>,
    /// The selected device, by name.
    pub device: Option<String>,
}

/// Rows a page key moves.
const PAGE: usize = 10;

impl WorkersView {
    pub fn new(run: RunId) -> WorkersView {
        WorkersView {
            run,
            loaded: false,
            focus: Focus::Workers,
            info: None,
            events: Arc::default(),
            series: vec![],
            selected: None,
            device: None,
        }
    }

    pub fn set_data(&mut self, info: RunInfo, events: Arc<Vec<StoredEvent>>, series: Vec<Series>) {
        self.info = Some(info);
        self.events = events;
        self.series = series;
        self.loaded = true;
    }

    /// The table's rows: the run (`None`), then each worker by name.
    fn row_keys(&self) -> Vec<Option<String>> {
        std::iter::once(None)
            .chain(
                worker_rows(&self.events, None)
                    .into_iter()
                    .map(|w| Some(w.name)),
            )
            .collect()
    }

    fn device_keys(&self) -> Vec<String> {
        let start = self.info.as_ref().map_or(0, |i| i.created_at);
        ledgers(&self.events, start, None)
            .into_iter()
            .map(|l| l.device)
            .collect()
    }

    pub fn act(&mut self, action: Action) {
        let step = |at: usize, last: usize| match action {
            Action::Up => Some(at.saturating_sub(1)),
            Action::Down => Some((at + 1).min(last)),
            Action::PageUp => Some(at.saturating_sub(PAGE)),
            Action::PageDown => Some((at + PAGE).min(last)),
            Action::Top => Some(0),
            Action::Bottom => Some(last),
            _ => None,
        };
        match (action, self.focus) {
            (Action::NextPane | Action::PrevPane, Focus::Workers) => self.focus = Focus::Devices,
            (Action::NextPane | Action::PrevPane, Focus::Devices) => self.focus = Focus::Workers,
            (_, Focus::Workers) => {
                let keys = self.row_keys();
                let at = keys.iter().position(|k| *k == self.selected).unwrap_or(0);
                if let Some(to) = step(at, keys.len().saturating_sub(1)) {
                    self.selected = keys.get(to).cloned().flatten();
                }
            }
            (_, Focus::Devices) => {
                let keys = self.device_keys();
                let at = keys
                    .iter()
                    .position(|k| Some(k) == self.device.as_ref())
                    .unwrap_or(0);
                if let Some(to) = step(at, keys.len().saturating_sub(1)) {
                    self.device = keys.get(to).cloned();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RunStatus;
    use crate::store::records::{EventKind as K, EventRecord};
    use crate::tui::events::tests::{ev, screen, transfer};
    use crate::tui::runs::tests::info;
    use crate::tui::theme::Theme;

    const MIB: u64 = 1 << 20;
    /// The clock of the snapshots; the run started two minutes before.
    const NOW: i64 = 1_767_225_600_000;
    const START: i64 = NOW - 120_000;

    fn run_info(status: RunStatus) -> RunInfo {
        let mut i = info(7, "grpo-math", status, START);
        i.pid = Some(4000);
        i.heartbeat_at = NOW - 1_000;
        i
    }

    /// Reward and inference workers with a failure and a restart; actor_train and reference in
    /// process, time-sharing device 0 with actor_infer (memory of reference creeping up).
    fn events() -> Vec<StoredEvent> {
        let t = |s: f64| START + (s * 1000.0) as i64;
        vec![
            ev(t(0.0), K::RunStarted, None, "run 'grpo-math' started"),
            ev(
                t(0.5),
                K::WorkerStarted,
                Some("reward-0"),
                "started, pid 4101",
            ),
            ev(
                t(0.5),
                K::WorkerStarted,
                Some("reward-1"),
                "started, pid 4102",
            ),
            ev(
                t(0.6),
                K::WorkerStarted,
                Some("actor_infer-0"),
                "started, pid 4200",
            ),
            transfer(t(10.0), false, "actor_infer", "0", 300 * MIB, "train"),
            transfer(t(20.0), false, "actor_train", "0", 200 * MIB, "generate"),
            transfer(t(20.0), false, "reference", "0", 100 * MIB, "generate"),
            transfer(t(20.0), true, "actor_infer", "0", 300 * MIB, "generate"),
            ev(
                t(25.0),
                K::WorkerFailed,
                Some("reward-1"),
                "pid 4102 died (signal: 9 (SIGKILL))",
            ),
            ev(
                t(25.1),
                K::WorkerStarted,
                Some("reward-1"),
                "started, pid 4103",
            ),
            ev(
                t(25.1),
                K::Warning,
                Some("reward-1"),
                "replaced (worker reward-1 died)",
            ),
            transfer(t(30.0), false, "actor_infer", "0", 300 * MIB, "train"),
            transfer(t(30.0), true, "actor_train", "0", 200 * MIB, "train"),
            transfer(t(30.0), true, "reference", "0", 110 * MIB, "train"),
            transfer(t(40.0), false, "actor_train", "0", 200 * MIB, "generate"),
            transfer(t(40.0), false, "reference", "0", 110 * MIB, "generate"),
            transfer(t(40.0), true, "actor_infer", "0", 300 * MIB, "generate"),
            transfer(t(50.0), false, "actor_infer", "0", 300 * MIB, "train"),
            transfer(t(50.0), true, "actor_train", "0", 200 * MIB, "train"),
            transfer(t(50.0), true, "reference", "0", 120 * MIB, "train"),
            transfer(t(60.0), false, "actor_train", "0", 200 * MIB, "generate"),
            transfer(t(60.0), false, "reference", "0", 120 * MIB, "generate"),
            transfer(t(60.0), true, "actor_infer", "0", 300 * MIB, "generate"),
            transfer(t(70.0), false, "actor_infer", "0", 300 * MIB, "train"),
            transfer(t(70.0), true, "actor_train", "0", 200 * MIB, "train"),
            transfer(t(70.0), true, "reference", "0", 130 * MIB, "train"),
            ev(
                t(80.0),
                K::Info,
                Some("actor_infer-0"),
                "stderr: kv cache\x1b[2K 93% full\n",
            ),
            ev(
                t(90.0),
                K::WorkerExited,
                Some("reward-0"),
                "pid 4101 exited (exit status: 0)",
            ),
        ]
    }

    /// An RL series of `values` at steps 1, 2, … every 10 s.
    fn s(key: &str, values: &[f64]) -> Series {
        Series {
            stage: "rl".into(),
            key: key.into(),
            steps: (1..=values.len() as u64).collect(),
            wall_time: (1..=values.len()).map(|s| 10.0 * s as f64).collect(),
            values: values.to_vec(),
        }
    }

    /// Steps every 10 s; entropy collapsing; groups flat from step 6.
    fn series() -> Vec<Series> {
        vec![
            s("time/step", &[10.0; 9]),
            s(
                "actor/entropy",
                &[2.0, 1.9, 2.1, 1.2, 0.6, 0.3, 0.15, 0.1, 0.08],
            ),
            s(
                "group/frac_zero_std",
                &[0.3, 0.4, 0.5, 0.6, 0.8, 0.92, 1.0, 0.97, 1.0],
            ),
        ]
    }

    fn loaded() -> WorkersView {
        let mut v = WorkersView::new(RunId(7));
        v.set_data(run_info(RunStatus::Running), events().into(), series());
        v
    }

    #[test]
    fn workers_take_their_state_pid_and_restarts_from_events() {
        let rows = worker_rows(&events(), None);
        let names: Vec<&str> = rows.iter().map(|w| w.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "actor_train",
                "actor_infer-0",
                "reference",
                "reward-0",
                "reward-1"
            ]
        );
        let state = |n: &str| {
            let w = rows.iter().find(|w| w.name == n).unwrap();
            (w.state, w.pid, w.restarts)
        };
        assert_eq!(state("actor_train"), (WorkerState::Loaded, None, 0));
        assert_eq!(
            state("actor_infer-0"),
            (WorkerState::Offloaded, Some(4200), 0)
        );
        assert_eq!(state("reward-0"), (WorkerState::Exited, Some(4101), 0));
        assert_eq!(state("reward-1"), (WorkerState::Running, Some(4103), 1));
        // Its last sign of life: its own log line, later than its role's last transfer.
        let infer = &rows[1];
        assert_eq!(infer.last_ms, Some(START + 80_000));
        // At t=25.05 s (replay): reward-1 had failed and not yet restarted.
        let then = worker_rows(&events(), Some(START + 25_050));
        let r1 = then.iter().find(|w| w.name == "reward-1").unwrap();
        assert_eq!(
            (r1.state, r1.pid, r1.restarts),
            (WorkerState::Failed, Some(4102), 0)
        );
    }

    #[test]
    fn keys_select_workers_and_devices() {
        let mut v = loaded();
        assert_eq!((v.focus, v.selected.as_deref()), (Focus::Workers, None));
        v.act(Action::Down);
        assert_eq!(v.selected.as_deref(), Some("actor_train"));
        v.act(Action::Bottom);
        assert_eq!(v.selected.as_deref(), Some("reward-1"));
        v.act(Action::Down); // clamped
        assert_eq!(v.selected.as_deref(), Some("reward-1"));
        v.act(Action::Top);
        assert_eq!(v.selected, None);
        v.act(Action::NextPane);
        assert_eq!(v.focus, Focus::Devices);
        v.act(Action::Down);
        assert_eq!(v.device.as_deref(), Some("0")); // the only device
        v.act(Action::PrevPane);
        assert_eq!(v.focus, Focus::Workers);
        // Reloads keep the selection by name.
        v.act(Action::PageDown);
        v.set_data(run_info(RunStatus::Running), events().into(), series());
        assert_eq!(v.selected.as_deref(), Some("reward-1"));
        let mut empty = WorkersView::new(RunId(1));
        for a in [Action::Down, Action::NextPane, Action::Down, Action::Bottom] {
            empty.act(a);
        }
        assert_eq!(
            (empty.selected.as_deref(), empty.device.as_deref()),
            (None, None)
        );
    }

    #[test]
    fn the_view_raises_every_alarm_of_the_scenario() {
        let v = loaded();
        let info = v.info.as_ref().unwrap();
        let found = alarms(info, &v.events, &v.series, None, NOW);
        let kinds: Vec<AlarmKind> = found.iter().map(|a| a.kind).collect();
        assert_eq!(
            kinds,
            [
                AlarmKind::WorkerFailed,
                AlarmKind::EntropyCollapse,
                AlarmKind::FlatRewards,
                AlarmKind::MemoryCreep
            ]
        );
        // Reference reloads at 30, 50, 70 s: resident 310, 320, 330 MiB, since step 3.
        assert_eq!(found[3].since.as_ref().map(|s| s.step), Some(3));
        // As of step 4 (40 s): only the failure.
        let cursor = Cursor {
            step: 4,
            at_ms: START + 40_000,
        };
        let then = alarms(info, &v.events, &v.series, Some(cursor), NOW);
        assert_eq!(then.len(), 1);
        assert_eq!(then[0].kind, AlarmKind::WorkerFailed);
    }

    /// A run across two nodes: actor_train and actor_infer on node1, the reference on node2,
    /// the reward worker on the head; each TCP worker's heartbeat round trip and mirror traffic.
    #[test]
    fn a_cluster_run_groups_its_workers_by_node_with_their_links() {
        let t = |s: f64| START + (s * 1000.0) as i64;
        let on = |e: StoredEvent, node: &str| StoredEvent {
            event: EventRecord {
                node: Some(node.into()),
                ..e.event
            },
            ..e
        };
        let started = |at: f64, worker: &str, pid: u32| {
            ev(
                t(at),
                K::WorkerStarted,
                Some(worker),
                &format!("started, pid {pid}"),
            )
        };
        let events: Vec<StoredEvent> = vec![
            ev(t(0.0), K::RunStarted, None, "run 'grpo-math' started"),
            started(0.2, "reward-0", 4101),
            on(started(0.3, "reference-0", 51), "node2"),
            on(started(0.4, "actor_train-0", 52), "node1"),
            on(started(0.5, "actor_infer-0", 53), "node1"),
        ];
        let rows = worker_rows(&events, None);
        let placed: Vec<(&str, Option<&str>)> = rows
            .iter()
            .map(|w| (w.name.as_str(), w.node.as_deref()))
            .collect();
        assert_eq!(
            placed,
            [
                ("reward-0", None),
                ("actor_train-0", Some("node1")),
                ("actor_infer-0", Some("node1")),
                ("reference-0", Some("node2")),
            ]
        );
        let series = view_series(&[
            s("time/step", &[10.0, 10.0]),
            s("actor/loss", &[0.5, 0.4]),
            s("workers/actor_train-0/rtt_ms", &[0.42, 0.38]),
            s("workers/actor_train-0/mirror_mb", &[40.0, 80.5]),
            s("workers/actor_infer-0/rtt_ms", &[0.51, 0.47]),
            s("workers/actor_infer-0/mirror_mb", &[25.0, 50.25]),
            s("workers/reference-0/rtt_ms", &[1.2, 1.1]),
        ]);
        let keys: Vec<&str> = series.iter().map(|s| s.key.as_str()).collect();
        assert!(!keys.contains(&"actor/loss"), "{keys:?}");
        assert_eq!(keys.len(), 6, "{keys:?}");
        let mut v = WorkersView::new(RunId(7));
        v.set_data(run_info(RunStatus::Running), events.into(), series);
        insta::assert_snapshot!("workers_cluster_120x16", draw(&v, None, 120, 16));
        // As of step 1 (10 s): the figures of step 1.
        let cursor = Cursor {
            step: 1,
            at_ms: START + 10_000,
        };
        let then = draw(&v, Some(cursor), 120, 16);
        assert!(then.contains("0.4 ms · 40.0 MB"), "{then}");
    }

    fn draw(v: &WorkersView, until: Option<Cursor>, width: u16, height: u16) -> String {
        screen(width, height, |f| {
            render(f, f.area(), v, until, NOW, "⠋", &Theme::default())
        })
    }

    #[test]
    fn snapshots() {
        let mut v = loaded();
        insta::assert_snapshot!("workers_80x24", draw(&v, None, 80, 24));
        v.act(Action::Down);
        v.act(Action::Down);
        v.act(Action::NextPane);
        insta::assert_snapshot!("workers_devices_120x40", draw(&v, None, 120, 40));
        let cursor = Cursor {
            step: 3,
            at_ms: START + 30_000,
        };
        insta::assert_snapshot!("workers_replay_80x24", draw(&v, Some(cursor), 80, 24));
        let mut stale = run_info(RunStatus::Running);
        stale.heartbeat_at = NOW - 95_000;
        v.set_data(stale, Arc::default(), vec![]);
        insta::assert_snapshot!("workers_stale_no_events_80x24", draw(&v, None, 80, 24));
        let v = WorkersView::new(RunId(7));
        insta::assert_snapshot!("workers_loading", draw(&v, None, 80, 24));
    }
}
