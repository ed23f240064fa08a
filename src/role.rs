//! The role layer: each of ROLL's roles as one handle that owns the role's state and computation,
//! in this process or in a worker process (`roll-tui worker ROLE`), behind the same calls.
//!
//! - Every role has a file here: [`actor_train`], [`actor_infer`], [`reference`], [`critic`],
//!   [`reward`], [`teacher`]. Its handle (`ActorTrain`, `Infer`, `Reference`, `Critic`,
//!   `RewardScorer`, the teachers') is an in-process value or a worker process
//!   ([`remote::RemoteWorker`]), picked from the run's `workers.<role>.mode`.
//! - A role in a worker process speaks its own typed requests and replies ([`Protocol`]): a call
//!   that the role does not serve does not compile. The worker module only carries them, as JSON.
//! - Every role that is resident on a device implements [`ResidentRole`] (offload, reload, events,
//!   restarts, shutdown), so time-sharing and supervision iterate over roles instead of matching
//!   them.
//! - [`serve_worker`] is the worker process's side: it runs the compute loop of the role it was
//!   started as.
//!
//! Adding a role: a file here with its handle, its `Protocol` and its compute loop; a variant of
//! [`Role`] (in `config`, which places it); an arm in [`serve_worker`]. Pipelines call handles;
//! nothing here knows a pipeline, the store or a front-end.

pub mod actor_infer;
pub mod actor_train;
pub mod critic;
pub mod epochs;
pub mod recipe;
pub mod reference;
pub mod remote;
pub mod reward;
pub mod rows;
pub mod step_file;
pub mod teacher;
mod train_serve;
#[cfg(test)]
mod worker_offload_tests;

pub use train_serve::TrainInit;

use std::fmt::Debug;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

pub use crate::config::Role;
use crate::model::LoadedModel;
use crate::scheduler::host_copy::HostArea;
use crate::worker::serve::CallQueue;
use crate::worker::{Payload, WorkerError};

/// What went wrong in a run's computation: a role's call or a pipeline's step. One type for both
/// layers (the pipeline is plain code over role handles; a role's failure is the pipeline's).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Load(#[from] crate::model::LoadError),
    #[error(transparent)]
    Device(#[from] crate::device::DeviceError),
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error(transparent)]
    Sink(#[from] crate::metrics::SinkError),
    #[error("{0}")]
    Setup(String),
    /// A worker that cannot be replaced without changing the run (its state lived only there).
    #[error("{0}")]
    WorkerLost(String),
    #[error("tensor computation failed in {stage}: {source}")]
    Tensor {
        stage: &'static str,
        #[source]
        source: candle_core::Error,
    },
}

pub(crate) trait TensorContext<T> {
    fn during(self, stage: &'static str) -> Result<T, RunError>;
}

impl<T> TensorContext<T> for candle_core::Result<T> {
    fn during(self, stage: &'static str) -> Result<T, RunError> {
        self.map_err(|source| RunError::Tensor { stage, source })
    }
}

pub(crate) fn setup_err(e: impl std::fmt::Display) -> RunError {
    RunError::Setup(e.to_string())
}

pub use crate::metrics::WorkerNote;

/// One call of a role's protocol.
pub trait RoleCall: Serialize + DeserializeOwned {
    /// The phase the call belongs to, for errors and timeouts (`load`, `train`, `offload`, …).
    fn phase(&self) -> &'static str;
}

/// A role's protocol with its worker process: its own request and reply types.
pub trait Protocol {
    const ROLE: Role;
    type Request: RoleCall + Debug + Clone;
    type Reply: Serialize + DeserializeOwned + Debug;
}

/// Where a resumed role's state comes from: the checkpoint's directory, and the AdamW steps the
/// role had taken when it was written.
#[derive(Debug, Clone, Copy)]
pub struct Restore<'a> {
    pub dir: &'a Path,
    pub optimizer_steps: usize,
}

/// Where offloaded state goes: the run's host-memory area, and the policy whose weights an
/// in-process actor_train trains (the handle holds only its optimizer).
pub struct HostCopy<'a> {
    pub area: &'a HostArea,
    pub policy: &'a LoadedModel,
}

impl HostCopy<'_> {
    /// The file of `role`'s state in the area.
    pub fn path(&self, role: Role) -> std::path::PathBuf {
        self.area.path(role.as_str())
    }
}

/// What every role that lives on a device does, wherever it runs. Time-sharing moves roles
/// through this; the pipeline drains, counts and stops them through it.
pub trait ResidentRole {
    fn role(&self) -> Role;
    /// Move the role's state (weights, and for trainable roles the AdamW moments) to its host
    /// copy and free it; bytes moved. An in-process role writes `host`; a worker its own copy.
    fn offload(&mut self, host: &HostCopy<'_>) -> Result<u64, RunError>;
    /// Bring the state back from the host copy; bytes moved.
    fn reload(&mut self, host: &HostCopy<'_>) -> Result<u64, RunError>;
    /// Whether the role runs in worker processes (its memory is theirs, not this process's).
    fn in_worker_process(&self) -> bool;
    /// Worker events since the last drain (none in-process).
    fn drain_events(&mut self) -> Vec<WorkerNote>;
    /// Worker processes replaced so far (0 in-process).
    fn restarts(&self) -> usize;
    /// Stop the role's worker process, if any, asking it first; the events not drained yet. The
    /// handle must not be called afterwards.
    fn shutdown(&mut self) -> Vec<WorkerNote>;
}

/// The worker process's side: serve `role` to the parent at `at` until it says shutdown or goes.
pub async fn serve_worker(
    role: Role,
    index: usize,
    at: &crate::worker::process::Endpoint,
) -> Result<(), WorkerError> {
    let compute: fn(CallQueue) = match role {
        Role::ActorInfer => actor_infer::serve::serve,
        Role::ActorTrain => |q| {
            let calls = Calls::<actor_train::ActorTrainCall>::new(q);
            train_serve::serve(Role::ActorTrain, &calls)
        },
        Role::Critic => |q| train_serve::serve(Role::Critic, &Calls::<critic::CriticCall>::new(q)),
        Role::Reference => reference::serve::serve,
        Role::Reward => reward::serve,
        Role::Teacher => teacher::serve::serve,
        Role::Env => return Err(WorkerError::Unsupported(role)),
    };
    crate::worker::serve::serve(role, index, at, compute).await
}

/// A worker's call queue with the role's own types: malformed calls are answered with an error
/// here and never reach the role.
pub struct Calls<Req> {
    queue: CallQueue,
    _request: std::marker::PhantomData<fn() -> Req>,
}

impl<Req: DeserializeOwned> Calls<Req> {
    pub fn new(queue: CallQueue) -> Self {
        Calls {
            queue,
            _request: std::marker::PhantomData,
        }
    }

    /// The next well-formed call, or `None` once the parent is gone.
    pub fn recv(&self) -> Option<(u64, Req)> {
        loop {
            let (id, payload) = self.queue.recv()?;
            match serde_json::from_value(payload) {
                Ok(request) => return Some((id, request)),
                Err(e) => self.queue.reply(id, Err(format!("malformed call: {e}"))),
            }
        }
    }

    pub fn reply<Rep: Serialize>(&self, id: u64, result: Result<Rep, String>) {
        let result = result.and_then(|r| {
            serde_json::to_value(r).map_err(|e| format!("cannot encode the reply: {e}"))
        });
        self.queue.reply(id, result);
    }
}

/// Encode a typed call for the wire.
pub(crate) fn payload<T: Serialize>(value: &T) -> Result<Payload, serde_json::Error> {
    serde_json::to_value(value)
}
