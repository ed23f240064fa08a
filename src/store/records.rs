//! The shapes of events and agentic trajectories as the store records them.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    RunStarted,
    RunResumed,
    RunEnded,
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
    pub const ALL: [EventKind; 11] = [
        EventKind::RunStarted,
        EventKind::RunResumed,
        EventKind::RunEnded,
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

/// A scheduler, worker or run event (offload/reload carry bytes and duration).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    pub kind: EventKind,
    pub worker: Option<String>,
    pub device: Option<String>,
    pub bytes: Option<u64>,
    pub duration_s: Option<f64>,
    pub message: String,
}

impl EventRecord {
    pub fn message(kind: EventKind, message: impl Into<String>) -> Self {
        EventRecord {
            kind,
            worker: None,
            device: None,
            bytes: None,
            duration_s: None,
            message: message.into(),
        }
    }
}

/// One turn of an agentic episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    pub observation: String,
    pub action_text: String,
    /// `None` when the action text could not be parsed.
    pub parsed_action: Option<String>,
    pub reward: f64,
    pub done: bool,
    pub prompt_tokens: usize,
    pub response_tokens: usize,
}

/// One agentic episode, turn by turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryRecord {
    pub stage: String,
    pub step: usize,
    pub env: String,
    pub env_seed: u64,
    pub policy_version: usize,
    pub success: bool,
    pub turns: Vec<TurnRecord>,
}
