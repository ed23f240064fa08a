//! Test fixtures of the store's shapes, shared by the tests of every module that reads them
//! (the health rules, the workbench's views).

use super::reads::StoredEvent;
use super::records::{EventKind, EventRecord};
use super::{RunId, RunInfo, RunStatus};

/// An event with the fields the store's writers put beside its text: a worker's role and
/// index (from its `role-index` name), the pid of a start or an exit (`started, pid 4000`,
/// `pid 4000 died …`), the status a run ended with.
pub fn ev(at: i64, kind: EventKind, worker: Option<&str>, message: &str) -> StoredEvent {
    let named = worker.and_then(|w| w.rsplit_once('-'));
    let pid = match kind {
        EventKind::WorkerStarted | EventKind::WorkerExited | EventKind::WorkerFailed => message
            .split_once("pid ")
            .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|digits| digits.parse().ok()),
        _ => None,
    };
    let run_status = match kind {
        EventKind::RunMarkedInterrupted => Some("interrupted"),
        EventKind::RunEnded if message.starts_with("run finished") => Some("finished"),
        EventKind::RunEnded => Some("interrupted"),
        EventKind::Error if message.starts_with("run failed") => Some("failed"),
        _ => None,
    };
    StoredEvent {
        at,
        event: EventRecord {
            role: named.map(|(role, _)| role.to_string()),
            worker_index: named.and_then(|(_, index)| index.parse().ok()),
            pid,
            run_status: run_status.map(String::from),
            worker: worker.map(String::from),
            ..EventRecord::message(kind, message)
        },
    }
}

/// An offload or reload as the store sink writes it (see `metrics::transfer_parts`).
pub fn transfer(
    at: i64,
    reload: bool,
    role: &str,
    devices: &str,
    bytes: u64,
    phase: &str,
) -> StoredEvent {
    let (kind, dir) = if reload {
        (EventKind::Reload, "reload")
    } else {
        (EventKind::Offload, "offload")
    };
    let seconds = 0.125;
    StoredEvent {
        at,
        event: EventRecord {
            role: Some(role.into()),
            phase: Some(phase.into()),
            worker: Some(role.into()),
            device: Some(devices.into()),
            bytes: Some(bytes),
            duration_s: Some(seconds),
            ..EventRecord::message(
                kind,
                format!("{dir} {role} {bytes} bytes in {seconds:.3} s (phase {phase})"),
            )
        },
    }
}

pub fn info(id: i64, name: &str, status: RunStatus, created_at: i64) -> RunInfo {
    RunInfo {
        id: RunId(id),
        name: name.into(),
        status,
        created_at,
        updated_at: created_at,
        heartbeat_at: created_at,
        config_json: String::new(),
        config_hash: String::new(),
        git_revision: None,
        seed: 0,
        output_dir: String::new(),
        notes: String::new(),
        tags: vec![],
        last_stage: Some("rl".into()),
        last_step: id as u64 * 10,
        error: None,
        host: None,
        pid: None,
        process_token: None,
    }
}
