//! The KL reference behind one interface: a frozen policy copy in the trainer's process, or in a
//! worker process ([`RemoteReference`]).
//!
//! The worker's host copy (`reference.safetensors` in its shared-memory area) always holds the
//! reference's current weights: it is written at start and at every refresh before the worker is
//! told, so an offload is the worker letting go of its weights. A worker that dies or hangs is
//! therefore replaced from it and the call repeated — nothing is lost — and checkpoints copy it.

pub mod serve;

use std::path::{Path, PathBuf};
use std::time::Duration;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

pub use serve::ReferenceInit;

use super::remote::{ModelReply as Reply, RemoteWorker, moved, worker_lost};
use super::rows::{Rows, response_logprobs};
use super::step_file::write_rows;
use super::{
    HostCopy, Protocol, ResidentRole, RoleCall, RunError, TensorContext, WorkerNote, setup_err,
};
use crate::config::{PlacementMode, RunConfig};
use crate::model::{LoadError, Transformer};
use crate::scheduler::host_copy::{HostArea, read_tensors};
use crate::train::checkpoint::save_vars;
use crate::worker::{Role, WorkerError};

/// The reference's calls to its worker process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ReferenceCall {
    /// Load the model.
    Init(Box<ReferenceInit>),
    /// Score the response tokens of the rows file `rows`; write the log-probs to `out`.
    Logprobs { rows: PathBuf, out: PathBuf },
    /// Take the weights in the host copy at `path` (a refresh).
    SetWeights { path: PathBuf },
    /// Free the weights, which the host copy at `path` holds already (every refresh writes it).
    Offload { path: PathBuf },
    /// Load them back from the host copy at `path`.
    Reload { path: PathBuf },
}

impl RoleCall for ReferenceCall {
    fn phase(&self) -> &'static str {
        match self {
            ReferenceCall::Init(_) => "load",
            ReferenceCall::Logprobs { .. } => "reference_logprobs",
            ReferenceCall::SetWeights { .. } => "weight_sync",
            ReferenceCall::Offload { .. } => "offload",
            ReferenceCall::Reload { .. } => "reload",
        }
    }
}

pub struct ReferenceProtocol;

impl Protocol for ReferenceProtocol {
    const ROLE: Role = Role::Reference;
    type Request = ReferenceCall;
    type Reply = Reply;
}

/// A forward pass over a step's batch that takes longer than this is a hung worker.
const CALL_TIMEOUT: Duration = Duration::from_secs(600);
const HOST_COPY: &str = "reference";
const ROWS: &str = "reference_rows";
const OUT: &str = "reference_logp";

#[allow(clippy::large_enum_variant)] // one per run: its size costs nothing
pub enum Reference {
    Local(Transformer),
    Remote(RemoteReference),
}

pub struct RemoteReference {
    worker: RemoteWorker<ReferenceProtocol>,
    area: HostArea,
    offloaded: bool,
}

impl Reference {
    /// `model` (the reference's weights) where the run places the role.
    pub fn start(run: &RunConfig, model: Transformer, pad_id: u32) -> Result<Self, RunError> {
        if run.workers.reference.mode != PlacementMode::Process {
            return Ok(Reference::Local(model));
        }
        let area = HostArea::new().map_err(|e| {
            RunError::Setup(format!(
                "creating the host-memory area for the reference: {e}"
            ))
        })?;
        area.write(HOST_COPY, &model.params().named_tensors())
            .map_err(setup_err)?;
        let init = ReferenceInit {
            model_config: model.config().to_hf_json(),
            pad_id,
            weights: area.path(HOST_COPY),
            device: run.workers.device_of(Role::Reference, 0),
        };
        let threads = run.worker_threads(Role::Reference);
        let worker = RemoteWorker::start(
            ReferenceCall::Init(Box::new(init)),
            CALL_TIMEOUT,
            threads,
            (area.dir(), &[]),
        )?;
        Ok(Reference::Remote(RemoteReference {
            worker,
            area,
            offloaded: false,
        }))
    }

    /// Log-probabilities of every response token of `rows`, (n, width), on `device`.
    pub fn logprobs(
        &mut self,
        pad_id: u32,
        rows: &Rows<'_>,
        temperature: f64,
        device: &Device,
    ) -> Result<Tensor, RunError> {
        match self {
            Reference::Local(model) => {
                response_logprobs(model, pad_id, rows, temperature).during("reference log-probs")
            }
            Reference::Remote(r) => r.logprobs(rows, temperature, device),
        }
    }

    /// `rl.kl.refresh_every`: the reference becomes `policy`. `offloaded_copy` is where an
    /// offloaded in-process reference keeps its weights (written instead of the tensors).
    pub fn refresh(
        &mut self,
        policy: &Transformer,
        offloaded_copy: Option<(&HostArea, &str)>,
    ) -> Result<(), RunError> {
        // Under LoRA the reference is the policy's own frozen base with a copy of the adapter,
        // which lives in this process whether or not the base is offloaded: only it changes.
        if let Self::Local(model) = self
            && let (Some(mine), Some(theirs)) = (model.lora(), policy.lora())
        {
            return mine
                .copy_from(theirs)
                .during("refreshing the KL reference's adapter");
        }
        let policy = policy.params();
        match self {
            Reference::Local(model) => match offloaded_copy {
                Some((area, name)) => area
                    .overwrite(name, &policy.named_tensors())
                    .map(drop)
                    .map_err(setup_err),
                None => model
                    .params()
                    .copy_from(policy)
                    .during("refreshing the KL reference"),
            },
            // In place: the worker reads the copy only when a call tells it to, after the write.
            Reference::Remote(r) => {
                r.area
                    .overwrite(HOST_COPY, &policy.named_tensors())
                    .map_err(setup_err)?;
                if !r.offloaded {
                    let reply = r.call(|s| ReferenceCall::SetWeights {
                        path: s.area.path(HOST_COPY),
                    })?;
                    moved(Role::Reference, reply)?;
                }
                Ok(())
            }
        }
    }

    /// Write the reference's weights to `path` (a checkpoint's reference file).
    pub fn save(&self, path: &Path) -> Result<(), LoadError> {
        match self {
            // Under LoRA the adapter, the part of the reference that is its own.
            Reference::Local(model) => save_vars(&model.trainable_vars(), path),
            Reference::Remote(r) => std::fs::copy(r.area.path(HOST_COPY), path)
                .map(drop)
                .map_err(|e| LoadError::io(path, e)),
        }
    }
}

impl ResidentRole for Reference {
    fn role(&self) -> Role {
        Role::Reference
    }

    fn offload(&mut self, host: &HostCopy<'_>) -> Result<u64, RunError> {
        match self {
            Reference::Local(model) => host
                .area
                .overwrite(Role::Reference.as_str(), &model.params().named_tensors())
                .map_err(setup_err),
            Reference::Remote(r) => r.offload(),
        }
    }

    fn reload(&mut self, host: &HostCopy<'_>) -> Result<u64, RunError> {
        match self {
            Reference::Local(model) => host
                .area
                .read_into(Role::Reference.as_str(), &model.params().named_vars())
                .map_err(setup_err),
            Reference::Remote(r) => r.reload(),
        }
    }

    fn in_worker_process(&self) -> bool {
        matches!(self, Reference::Remote(_))
    }

    fn drain_events(&mut self) -> Vec<WorkerNote> {
        match self {
            Reference::Local(_) => vec![],
            Reference::Remote(r) => r.worker.drain_events(),
        }
    }

    fn restarts(&self) -> usize {
        match self {
            Reference::Local(_) => 0,
            Reference::Remote(r) => r.worker.restarts,
        }
    }

    fn shutdown(&mut self) -> Vec<WorkerNote> {
        match self {
            Reference::Local(_) => vec![],
            Reference::Remote(r) => r.worker.shutdown(),
        }
    }
}

impl RemoteReference {
    /// A call that survives one lost worker: it is replaced from the host copy, and `make` builds
    /// the call again for the fresh one.
    fn call(&mut self, make: impl Fn(&Self) -> ReferenceCall) -> Result<Reply, RunError> {
        match self.worker.call(make(self)) {
            Err(e) if worker_lost(&e) => {
                self.revive(&e)?;
                self.worker.call(make(self)).map_err(setup_err)
            }
            other => other.map_err(setup_err),
        }
    }

    fn revive(&mut self, lost: &WorkerError) -> Result<(), RunError> {
        let offloaded = self.offloaded.then(|| self.area.path(HOST_COPY));
        let carried = "; weights reloaded from its host copy";
        self.worker
            .revive(lost, carried, offloaded, |path| ReferenceCall::Offload {
                path,
            })
    }

    fn logprobs(
        &mut self,
        rows: &Rows<'_>,
        temperature: f64,
        device: &Device,
    ) -> Result<Tensor, RunError> {
        write_rows(rows, temperature, &self.area.path(ROWS)).map_err(setup_err)?;
        let reply = self.call(|s| ReferenceCall::Logprobs {
            rows: s.area.path(ROWS),
            out: s.area.path(OUT),
        })?;
        moved(Role::Reference, reply)?;
        let out = self.area.path(OUT);
        let mut tensors = read_tensors(&out, device).map_err(setup_err)?;
        tensors.remove("ref_logp").ok_or_else(|| {
            RunError::Setup(format!(
                "the reference worker's output '{}' has no 'ref_logp'",
                out.display()
            ))
        })
    }

    /// Offload: the worker writes its weights to the host copy and frees them. Returns bytes.
    fn offload(&mut self) -> Result<u64, RunError> {
        let reply = self.call(|s| ReferenceCall::Offload {
            path: s.area.path(HOST_COPY),
        })?;
        self.offloaded = true;
        moved(Role::Reference, reply)
    }

    fn reload(&mut self) -> Result<u64, RunError> {
        let reply = self.call(|s| ReferenceCall::Reload {
            path: s.area.path(HOST_COPY),
        })?;
        self.offloaded = false;
        moved(Role::Reference, reply)
    }
}
