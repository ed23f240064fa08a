//! The shapes of events as the store records them (trajectories are in `metrics`, where pipelines
//! produce them).

use serde::{Deserialize, Serialize};

pub use crate::metrics::{TrajectoryRecord, TurnRecord};
use crate::metrics::{WorkerNote, WorkerNotice, transfer_parts};
use crate::names::{Direction, Transfer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    RunStarted,
    RunResumed,
    RunEnded,
    /// The store found a running run's process gone and marked it interrupted.
    RunMarkedInterrupted,
    WorkerStarted,
    WorkerExited,
    WorkerFailed,
    Offload,
    Reload,
    Info,
    Warning,
    Error,
}

impl EventKind {
    pub const ALL: [EventKind; 12] = [
        EventKind::RunStarted,
        EventKind::RunResumed,
        EventKind::RunEnded,
        EventKind::RunMarkedInterrupted,
        EventKind::WorkerStarted,
        EventKind::WorkerExited,
        EventKind::WorkerFailed,
        EventKind::Offload,
        EventKind::Reload,
        EventKind::Info,
        EventKind::Warning,
        EventKind::Error,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::RunStarted => "run_started",
            EventKind::RunResumed => "run_resumed",
            EventKind::RunEnded => "run_ended",
            EventKind::RunMarkedInterrupted => "run_marked_interrupted",
            EventKind::WorkerStarted => "worker_started",
            EventKind::WorkerExited => "worker_exited",
            EventKind::WorkerFailed => "worker_failed",
            EventKind::Offload => "offload",
            EventKind::Reload => "reload",
            EventKind::Info => "info",
            EventKind::Warning => "warning",
            EventKind::Error => "error",
        }
    }
}

/// A scheduler, worker or run event. Its facts are fields — the role and worker index of a worker
/// event or a transfer, the pid, the call phase of a failure, the devices, bytes and seconds of an
/// offload or reload — and `message` is the line people read; readers never parse it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    pub kind: EventKind,
    #[serde(default)]
    pub role: Option<String>,
    #[serde(default)]
    pub worker_index: Option<u32>,
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub phase: Option<String>,
    /// How the run ended, on the event that says so: `finished`, `interrupted` or `failed`.
    #[serde(default)]
    pub run_status: Option<String>,
    /// The worker's name (`reward-0`), or the role of a transfer.
    pub worker: Option<String>,
    pub device: Option<String>,
    pub bytes: Option<u64>,
    pub duration_s: Option<f64>,
    /// The node a worker runs on (a cluster's host), on its `worker_started` event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub message: String,
}

impl EventRecord {
    /// A worker process event as the store records it.
    pub fn of_worker(note: &WorkerNote) -> Self {
        let kind = match note.notice {
            WorkerNotice::Started => EventKind::WorkerStarted,
            WorkerNotice::Exited => EventKind::WorkerExited,
            WorkerNotice::Failed => EventKind::WorkerFailed,
            WorkerNotice::Log => EventKind::Info,
            WorkerNotice::Restarted | WorkerNotice::Refused => EventKind::Warning,
        };
        EventRecord {
            role: Some(note.role.as_str().into()),
            worker_index: u32::try_from(note.index).ok(),
            pid: note.pid,
            phase: note.phase.map(String::from),
            worker: Some(note.worker()),
            node: note.node.clone(),
            ..EventRecord::message(kind, &note.text)
        }
    }

    /// An offload or reload as the store records it.
    pub fn of_transfer(transfer: &Transfer) -> Self {
        let (direction, role, devices, message) = transfer_parts(transfer);
        let kind = match direction {
            Direction::Offload => EventKind::Offload,
            Direction::Reload => EventKind::Reload,
        };
        EventRecord {
            role: Some(role.clone()),
            phase: Some(transfer.phase.to_string()),
            worker: Some(role),
            device: Some(devices),
            bytes: Some(transfer.bytes),
            duration_s: Some(transfer.seconds),
            ..EventRecord::message(kind, message)
        }
    }

    pub fn message(kind: EventKind, message: impl Into<String>) -> Self {
        EventRecord {
            kind,
            role: None,
            worker_index: None,
            pid: None,
            phase: None,
            run_status: None,
            worker: None,
            device: None,
            bytes: None,
            duration_s: None,
            node: None,
            message: message.into(),
        }
    }
}
