//! Worker processes: each role of a run (actor_train, actor_infer, reference, critic, reward, env) can
//! run as a child process `roll-tui worker ROLE`, spawned from the current executable so parent and
//! worker are always the same build.
//!
//! [`protocol`] defines the typed control messages and their framing over a local socket, with a
//! version handshake and heartbeats; [`process`] spawns and supervises a worker from the parent side
//! (own process group, killed with the parent, exits and silence reported as events, calls with
//! deadlines that name the role and phase); [`serve`] is the worker side. Bulk tensors never travel
//! here. This module knows nothing about the store or any front-end: it reports [`WorkerEvent`]s.
//!
//! Roles move into worker processes one at a time; today reward, actor_infer, actor_train and reference run out of process.

pub mod infer;
pub mod process;
pub mod protocol;
pub mod reference;
pub mod serve;
pub mod train;

use serde::{Deserialize, Serialize};

pub use process::{WorkerEvent, WorkerProcess, WorkerSpec};
pub use protocol::{ProtocolError, Reply, Request, ScoreItem};

/// A role of ROLL's multi-role architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Role {
    ActorTrain,
    ActorInfer,
    Reference,
    Critic,
    Reward,
    Env,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::ActorTrain => "actor_train",
            Role::ActorInfer => "actor_infer",
            Role::Reference => "reference",
            Role::Critic => "critic",
            Role::Reward => "reward",
            Role::Env => "env",
        }
    }

    /// Whether the role holds a model on a device (and so has a `device_mapping`).
    pub fn uses_device(self) -> bool {
        matches!(
            self,
            Role::ActorTrain | Role::ActorInfer | Role::Reference | Role::Critic
        )
    }

    /// Whether this build can run the role in a worker process.
    pub fn runs_out_of_process(self) -> bool {
        !matches!(self, Role::Env)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

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
