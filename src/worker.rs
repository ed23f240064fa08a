//! Worker processes: each model role of a run (actor_train, actor_infer, reference, critic, reward,
//! teacher) can run as a child process `roll-tui worker ROLE`, spawned from the current executable
//! so parent and worker are always the same build.
//!
//! This module is the transport only: [`protocol`] defines the control messages and their framing
//! over a local socket or TCP, with a version handshake and heartbeats; [`launch`] says who starts a
//! worker (the head, ssh, srun) and how; [`process`] spawns and supervises a
//! worker from the parent side (own process group, killed with the parent, exits and silence
//! reported as events, calls with deadlines that name the role and phase); [`serve`] is the worker
//! side. What a call means is the role layer's (`src/role/`): each role's typed requests travel
//! here as JSON payloads. Bulk tensors never travel here. This module knows nothing about roles'
//! computations, the store or any front-end: it reports [`WorkerEvent`]s.

pub mod auth;
pub mod launch;
pub mod link;
pub mod mirror;
pub mod nodelist;
pub mod process;
pub mod protocol;
pub mod serve;

pub use crate::config::Role;
pub use process::{WorkerEvent, WorkerProcess, WorkerSpec};
pub use protocol::{Payload, ProtocolError};

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("{role} worker {index}: {source}")]
    Protocol {
        role: Role,
        index: usize,
        #[source]
        source: ProtocolError,
    },
    #[error("{role} worker {index}: cannot start '{program}': {source}")]
    Spawn {
        role: Role,
        index: usize,
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{role} worker {index} did not connect within {secs} s{detail}")]
    NoConnection {
        role: Role,
        index: usize,
        secs: u64,
        detail: String,
    },
    #[error(
        "role '{0}' cannot run in a worker process yet (only: reward, actor_infer, actor_train, reference, critic)"
    )]
    Unsupported(Role),
    #[error("{role} worker {index} did not answer '{phase}' within {secs} s")]
    Timeout {
        role: Role,
        index: usize,
        phase: &'static str,
        secs: f64,
    },
    #[error("{role} worker {index} died during '{phase}' ({status})")]
    Died {
        role: Role,
        index: usize,
        phase: &'static str,
        status: String,
    },
    #[error("{role} worker {index} failed '{phase}': {message}")]
    Failed {
        role: Role,
        index: usize,
        phase: &'static str,
        message: String,
    },
}

impl WorkerError {
    /// The call a failure happened in, when it happened in one.
    pub fn phase(&self) -> Option<&'static str> {
        match self {
            WorkerError::Timeout { phase, .. }
            | WorkerError::Died { phase, .. }
            | WorkerError::Failed { phase, .. } => Some(phase),
            _ => None,
        }
    }
}
