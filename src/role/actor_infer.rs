//! The actor_infer role behind one interface, whether it runs in the trainer's process (its own
//! weight replica driving an [`Engine`]) or in a worker process ([`RemoteInfer`]).

mod remote;
pub mod serve;
mod sync_route;
mod update;

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use remote::RemoteInfer;
pub use serve::{InferInit, InferOp, WireCompletion};
pub use update::PolicyUpdate;

use super::{
    HostCopy, Protocol, ResidentRole, RoleCall, RunError, TensorContext, WorkerNote, setup_err,
};
use crate::config::{PlacementMode, RlConfig, Role, RunConfig};
use crate::model::{LoadedModel, ParamStore, Transformer};
use crate::rollout::engine::Detokenize;
use crate::rollout::{Completion, Engine, Request};

/// actor_infer's calls to its worker process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum InferCall {
    /// Load the model.
    Init(InferInit),
    /// Apply `ops` in order, then run one engine step; replies with what finished.
    Step { ops: Vec<InferOp> },
    /// Take the weights in the host copy at `path` (weight sync); under LoRA `path` holds the
    /// frozen base and `adapter` the adapter directory to merge into it. With `ipc`, the weights
    /// are in the trainer's GPU buffer that handle names, laid out as the host copy (whose header
    /// gives the offsets), and are copied device to device; the host copy is then behind.
    SetWeights {
        path: PathBuf,
        adapter: Option<PathBuf>,
        #[serde(default)]
        ipc: Option<crate::device::IpcHandle>,
    },
    /// Free the weights, which the host copy at `path` holds already (weight sync writes it),
    /// or, with `write` (the last sync went by CUDA IPC), once they are written to it.
    Offload {
        path: PathBuf,
        #[serde(default)]
        write: bool,
    },
    /// Load them back from the host copy at `path` (and under LoRA the adapter at `adapter`).
    /// With `ipc`, the weights are in the trainer's GPU buffer that handle names, laid out as the
    /// host copy (which gives names, dtypes, shapes and offsets), and are copied device to device.
    Reload {
        path: PathBuf,
        adapter: Option<PathBuf>,
        #[serde(default)]
        ipc: Option<crate::device::IpcHandle>,
    },
}

impl RoleCall for InferCall {
    fn phase(&self) -> &'static str {
        match self {
            InferCall::Init(_) => "load",
            InferCall::Step { .. } => "generate",
            InferCall::SetWeights { .. } => "weight_sync",
            InferCall::Offload { .. } => "offload",
            InferCall::Reload { .. } => "reload",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum InferReply {
    /// The model is loaded, with this many parameters.
    Loaded { params: usize },
    /// The requests that finished during the step, and how many the engine still holds.
    Stepped {
        finished: Vec<WireCompletion>,
        holding: usize,
    },
    /// Bytes of tensor data moved to or from a host copy.
    Moved { bytes: u64 },
}

pub struct InferProtocol;

impl Protocol for InferProtocol {
    const ROLE: Role = Role::ActorInfer;
    type Request = InferCall;
    type Reply = InferReply;
}

/// A frozen copy of the policy's weights (reference, actor_infer replica); under LoRA with the
/// adapter merged in.
pub fn copy_of(model: &LoadedModel) -> Result<Transformer, RunError> {
    let params = match model
        .transformer
        .weights_for_inference()
        .during("copying the policy")?
    {
        std::borrow::Cow::Borrowed(p) => p.deep_clone().during("copying the policy")?,
        std::borrow::Cow::Owned(merged) => merged,
    };
    Transformer::new(model.config().clone(), params).during("copying the policy")
}

/// A stage's frozen reference: the policy as it is now. Under LoRA the frozen base is shared and
/// only the adapter copied; otherwise a copy of the weights.
pub fn reference_of(model: &LoadedModel) -> Result<Transformer, RunError> {
    match model
        .transformer
        .adapter_snapshot()
        .during("copying the adapter")?
    {
        Some(view) => Ok(view),
        None => copy_of(model),
    }
}

/// What the rollout needs from a generation engine.
pub trait Generator {
    fn submit(&mut self, request: Request);
    /// Cancel every queued or running request whose id satisfies `cancel`.
    fn abort(&mut self, cancel: &dyn Fn(u64) -> bool) -> Result<(), RunError>;
    fn is_idle(&self) -> bool;
    /// One engine step: admit, decode one token each, return what finished.
    fn step(&mut self) -> Result<Vec<Completion>, RunError>;
    /// Worker events since the last call (worker processes only).
    fn drain_events(&mut self) -> Vec<WorkerNote> {
        vec![]
    }
    /// Workers replaced so far (worker processes only).
    fn restarts(&self) -> usize {
        0
    }
    /// The model has taken new weights: caches kept for later turns are stale (a worker
    /// process drops its own when it takes them).
    fn forget_prefixes(&mut self) {}
}

impl Generator for Engine<'_> {
    fn submit(&mut self, request: Request) {
        Engine::submit(self, request);
    }

    fn abort(&mut self, cancel: &dyn Fn(u64) -> bool) -> Result<(), RunError> {
        Engine::abort(self, cancel)
            .map(|_| ())
            .during("cancelling requests")
    }

    fn is_idle(&self) -> bool {
        Engine::is_idle(self)
    }

    fn step(&mut self) -> Result<Vec<Completion>, RunError> {
        Engine::step(self).during("rollout")
    }

    fn forget_prefixes(&mut self) {
        Engine::forget_prefixes(self);
    }
}

/// actor_infer: a weight replica here, or a worker process. The worker sits behind a mutex
/// because the rollout, the time-sharing ledger and weight sync each reach it in turn (and with
/// α > 0 from the rollout thread); calls never overlap.
#[allow(clippy::large_enum_variant)] // one per run: boxing would buy nothing
pub enum Infer {
    /// `multi_turn`: the run has an environment, whose requests continue earlier ones of the
    /// same id (agentic episodes): its engines keep finished sequences' caches for them
    /// ([`Engine::with_prefix_reuse`]), as a worker process's do (`InferInit::multi_turn`).
    ///
    /// `base`: under LoRA the policy's frozen base (shared, not copied), which each adapter sent
    /// is merged into.
    ///
    /// `pending`: under LoRA, the adapter weight sync handed the replica while it was offloaded;
    /// its reload merges it into the base instead of reading back stale weights.
    Local {
        replica: Transformer,
        multi_turn: bool,
        base: Option<ParamStore>,
        pending: Mutex<Option<PolicyUpdate>>,
    },
    Remote(Mutex<RemoteInfer>),
}

impl Infer {
    /// actor_infer as the run's placement asks, holding the policy's current weights.
    pub fn start(run: &RunConfig, cfg: &RlConfig, model: &LoadedModel) -> Result<Infer, RunError> {
        Ok(match run.workers.actor_infer.mode {
            PlacementMode::InProcess => Infer::Local {
                replica: copy_of(model)?,
                multi_turn: cfg.env.is_some(),
                base: model
                    .transformer
                    .lora()
                    .map(|_| model.transformer.params().clone()),
                pending: Mutex::new(None),
            },
            PlacementMode::Process => Infer::Remote(Mutex::new(RemoteInfer::start(
                model,
                run.model.dtype,
                cfg.rollout_batch,
                cfg.env.is_some(),
                run.worker_threads(Role::ActorInfer),
                run.workers.device_of(Role::ActorInfer, 0),
            )?)),
        })
    }

    /// A generator over this actor_infer; in-process it borrows the replica.
    pub fn generator<'e>(
        &'e self,
        eos_ids: Vec<u32>,
        max_batch: usize,
        detokenize: Detokenize<'e>,
    ) -> Box<dyn Generator + 'e> {
        match self {
            Infer::Local {
                replica,
                multi_turn,
                ..
            } => {
                let engine = Engine::new(replica, eos_ids, max_batch).with_detokenizer(detokenize);
                match multi_turn {
                    true => Box::new(engine.with_prefix_reuse()),
                    false => Box::new(engine),
                }
            }
            Infer::Remote(remote) => Box::new(RemoteGenerator(remote)),
        }
    }

    /// Under LoRA, an in-process replica that is offloaded takes `update` at its reload: only
    /// the adapter moves (false, and nothing kept, for a worker or a replica without a base).
    pub fn keep_for_reload(&self, update: PolicyUpdate) -> bool {
        match self {
            Infer::Local {
                base: Some(_),
                pending,
                ..
            } if matches!(update, PolicyUpdate::Adapter(_)) => {
                *pending
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(update);
                true
            }
            _ => false,
        }
    }

    /// Take new weights (α > 0: between two decode steps).
    pub fn set_weights(&self, update: &PolicyUpdate) -> Result<(), RunError> {
        match self {
            Infer::Local { replica, base, .. } => update
                .write_into(replica.params(), base.as_ref())
                .during("weight sync to actor_infer"),
            Infer::Remote(remote) => lock(remote).set_weights(update),
        }
    }
}

/// actor_infer is reached through a shared reference (the rollout thread holds one while the
/// trainer time-shares), so the role is implemented on `&Infer`: the replica's variables and the
/// worker's mutex make every move safe through it.
impl ResidentRole for &Infer {
    fn role(&self) -> Role {
        Role::ActorInfer
    }

    fn offload(&mut self, host: &HostCopy<'_>) -> Result<u64, RunError> {
        match self {
            Infer::Local { replica: t, .. } => host
                .area
                .overwrite(Role::ActorInfer.as_str(), &t.params().named_tensors())
                .map_err(setup_err),
            Infer::Remote(r) => lock(r).offload(),
        }
    }

    fn reload(&mut self, host: &HostCopy<'_>) -> Result<u64, RunError> {
        match self {
            Infer::Local {
                replica: t,
                base,
                pending,
                ..
            } => {
                let update = pending
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take();
                match update {
                    // The base with the latest adapter merged: the host copy is stale.
                    Some(update) => {
                        update
                            .write_into(t.params(), base.as_ref())
                            .during("reloading actor_infer with its new adapter")?;
                        Ok(t.params().bytes() as u64)
                    }
                    None => host
                        .area
                        .read_into(Role::ActorInfer.as_str(), &t.params().named_vars())
                        .map_err(setup_err),
                }
            }
            Infer::Remote(r) => lock(r).reload(),
        }
    }

    fn in_worker_process(&self) -> bool {
        matches!(self, Infer::Remote(_))
    }

    fn drain_events(&mut self) -> Vec<WorkerNote> {
        match self {
            Infer::Local { .. } => vec![],
            Infer::Remote(r) => lock(r).drain_events(),
        }
    }

    fn restarts(&self) -> usize {
        match self {
            Infer::Local { .. } => 0,
            Infer::Remote(r) => lock(r).worker.restarts,
        }
    }

    fn shutdown(&mut self) -> Vec<WorkerNote> {
        match self {
            Infer::Local { .. } => vec![],
            Infer::Remote(r) => lock(r).shutdown(),
        }
    }
}

/// The remote's state stays consistent across a panic elsewhere (every change is one statement),
/// so a poisoned lock is taken over rather than propagated.
pub fn lock(remote: &Mutex<RemoteInfer>) -> MutexGuard<'_, RemoteInfer> {
    remote
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct RemoteGenerator<'a>(&'a Mutex<RemoteInfer>);

impl Generator for RemoteGenerator<'_> {
    fn submit(&mut self, request: Request) {
        lock(self.0).submit(request);
    }

    fn abort(&mut self, cancel: &dyn Fn(u64) -> bool) -> Result<(), RunError> {
        lock(self.0).abort(cancel);
        Ok(())
    }

    fn is_idle(&self) -> bool {
        lock(self.0).is_idle()
    }

    fn step(&mut self) -> Result<Vec<Completion>, RunError> {
        lock(self.0).step()
    }

    fn drain_events(&mut self) -> Vec<WorkerNote> {
        lock(self.0).drain_events()
    }

    fn restarts(&self) -> usize {
        lock(self.0).worker.restarts
    }
}
