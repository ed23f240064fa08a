//! The rows of the Workers table, derived from a run's events: one per worker process (named
//! `role-index` by worker events) and one per in-process role that only offload/reload events name
//! (`actor_train`), plus the run's own row.
//!
//! State: `failed` or `exited` after the worker's latest `worker_failed`/`worker_exited` (until it
//! is started again); otherwise `loaded`/`offloaded` after its role's latest reload/offload, or
//! `running`. The pid is the one its latest `worker_started` ("started, pid 123") names; restarts
//! count its starts after the first. The heartbeat is its latest event, its role's transfers
//! included. Its node is the one its latest `worker_started` names (a cluster's host; none on the
//! head's machine); rows are grouped by node, the head's first.

use ratatui::style::{Color, Style};

use super::devices::role_rank;
use crate::store::liveness::STALE_AFTER_MS;
use crate::store::reads::StoredEvent;
use crate::store::records::EventKind;
use crate::store::{RunInfo, RunStatus};
use crate::tui::events::{row_text, warn_style};
use crate::tui::theme::Theme;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerState {
    Running,
    Loaded,
    Offloaded,
    Exited,
    Failed,
}

impl WorkerState {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Running => "running",
            WorkerState::Loaded => "loaded",
            WorkerState::Offloaded => "offloaded",
            WorkerState::Exited => "exited",
            WorkerState::Failed => "failed",
        }
    }

    pub fn style(self, theme: &Theme) -> Style {
        match self {
            WorkerState::Running | WorkerState::Loaded => theme.good,
            WorkerState::Offloaded => Style::default().fg(Color::Cyan),
            WorkerState::Exited => theme.muted,
            WorkerState::Failed => theme.bad,
        }
    }
}

/// A worker process (or an in-process role that moves between devices) as of some time.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerRow {
    pub name: String,
    pub role: String,
    pub pid: Option<u32>,
    pub state: WorkerState,
    /// Its latest event (its role's transfers included): the last sign of life.
    pub last_ms: Option<i64>,
    pub restarts: u32,
    /// The message of its latest event.
    pub last: String,
    /// The node it runs on, when a launcher started it on one.
    pub node: Option<String>,
}

/// The workers seen in `events` up to `until_ms`, by role (in the workbench's role order), then index.
pub fn worker_rows(events: &[StoredEvent], until_ms: Option<i64>) -> Vec<WorkerRow> {
    // Each worker with its starts and its latest message (copied once, at the end).
    let mut rows: Vec<(WorkerRow, u32, &str)> = vec![];
    // Per role: its latest transfer (time, reload?, text).
    let mut transfers: Vec<(String, i64, bool, String)> = vec![];
    for e in events.iter().filter(|e| until_ms.is_none_or(|u| e.at <= u)) {
        let r = &e.event;
        let Some(worker) = r.worker.as_deref() else {
            continue;
        };
        if matches!(r.kind, EventKind::Offload | EventKind::Reload) {
            let reload = r.kind == EventKind::Reload;
            let text = format!("{} {}", r.kind.as_str(), row_text(e));
            match transfers.iter_mut().find(|t| t.0 == worker) {
                Some(t) => (t.1, t.2, t.3) = (e.at, reload, text),
                None => transfers.push((worker.to_string(), e.at, reload, text)),
            }
            continue;
        }
        let at = match rows.iter().position(|(w, _, _)| w.name == worker) {
            Some(at) => at,
            None => {
                rows.push((
                    WorkerRow {
                        name: worker.to_string(),
                        role: r.role.clone().unwrap_or_else(|| worker.to_string()),
                        pid: None,
                        state: WorkerState::Running,
                        last_ms: None,
                        restarts: 0,
                        last: String::new(),
                        node: None,
                    },
                    0,
                    "",
                ));
                rows.len() - 1
            }
        };
        let (w, starts, last) = &mut rows[at];
        w.last_ms = Some(e.at);
        *last = &r.message;
        match r.kind {
            EventKind::WorkerStarted => {
                *starts += 1;
                w.pid = r.pid.or(w.pid);
                w.state = WorkerState::Running;
                w.node = r.node.clone();
            }
            EventKind::WorkerExited => w.state = WorkerState::Exited,
            EventKind::WorkerFailed => w.state = WorkerState::Failed,
            _ => {}
        }
    }
    let mut rows: Vec<WorkerRow> = rows
        .into_iter()
        .map(|(mut w, starts, last)| {
            w.restarts = starts.saturating_sub(1);
            w.last = last.to_string();
            w
        })
        .collect();
    for (role, at, reload, message) in transfers {
        if !rows.iter().any(|w| w.role == role) {
            rows.push(WorkerRow {
                name: role.clone(),
                role: role.clone(),
                pid: None,
                state: WorkerState::Running,
                last_ms: None,
                restarts: 0,
                last: String::new(),
                node: None,
            });
        }
        for w in rows.iter_mut().filter(|w| w.role == role) {
            if w.state == WorkerState::Running {
                w.state = if reload {
                    WorkerState::Loaded
                } else {
                    WorkerState::Offloaded
                };
            }
            if w.last_ms.is_none_or(|l| l <= at) {
                w.last_ms = Some(at);
                w.last = message.clone();
            }
        }
    }
    let index = |name: &str| {
        name.rsplit_once('-')
            .and_then(|(_, i)| i.parse::<u64>().ok())
    };
    rows.sort_by(|a, b| {
        (
            &a.node,
            role_rank(&a.role),
            &a.role,
            index(&a.name),
            &a.name,
        )
            .cmp(&(
                &b.node,
                role_rank(&b.role),
                &b.role,
                index(&b.name),
                &b.name,
            ))
    });
    rows
}

/// The run's own row: its status as of the cursor, its heartbeat and its resumes.
pub(super) struct RunLine {
    pub status: &'static str,
    pub style: Style,
    pub last_ms: Option<i64>,
    pub resumes: u32,
    pub last: String,
}

pub(super) fn run_line(
    info: &RunInfo,
    events: &[StoredEvent],
    until_ms: Option<i64>,
    now_ms: i64,
    theme: &Theme,
) -> RunLine {
    let mine: Vec<&StoredEvent> = events
        .iter()
        .filter(|e| e.event.worker.is_none() && until_ms.is_none_or(|u| e.at <= u))
        .collect();
    let resumes = mine
        .iter()
        .filter(|e| e.event.kind == EventKind::RunResumed)
        .count() as u32;
    let last = info
        .error
        .clone()
        .filter(|_| until_ms.is_none())
        .or_else(|| mine.last().map(|e| e.event.message.clone()))
        .unwrap_or_default();
    let status_style = |s: RunStatus| match s {
        RunStatus::Running => theme.good,
        RunStatus::Finished => theme.text,
        RunStatus::Failed => theme.bad,
        RunStatus::Interrupted => theme.muted,
    };
    let Some(u) = until_ms else {
        let stale =
            info.status == RunStatus::Running && now_ms - info.heartbeat_at > STALE_AFTER_MS;
        let (status, style) = if stale {
            ("stale", warn_style())
        } else {
            (info.status.as_str(), status_style(info.status))
        };
        return RunLine {
            status,
            style,
            last_ms: Some(info.heartbeat_at),
            resumes,
            last,
        };
    };
    // In replay: the latest run event before the cursor says what the run was doing.
    let state = mine.iter().rev().find_map(|e| match e.event.kind {
        EventKind::RunStarted | EventKind::RunResumed => Some(RunStatus::Running),
        _ => e.event.run_status.as_deref().and_then(RunStatus::parse),
    });
    let status = state.unwrap_or(info.status);
    let last_ms = events.iter().filter(|e| e.at <= u).map(|e| e.at).max();
    RunLine {
        status: status.as_str(),
        style: status_style(status),
        last_ms,
        resumes,
        last,
    }
}
