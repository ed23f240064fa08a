//! The actor_infer role behind one interface, whether it runs in the trainer's process (its own
//! weight replica driving an [`Engine`]) or in a worker process ([`RemoteInfer`]).

use std::sync::{Mutex, MutexGuard};

use super::remote_infer::RemoteInfer;
use super::rl_learner::copy_of;
use super::{PipelineError, TensorContext};
use crate::config::{PlacementMode, RlConfig, RunConfig};
use crate::metrics::WorkerNotice;
use crate::model::{LoadedModel, ParamStore, Transformer};
use crate::rollout::engine::Detokenize;
use crate::rollout::{Completion, Engine, Request};

/// What the rollout needs from a generation engine.
pub(super) trait Generator {
    fn submit(&mut self, request: Request);
    /// Cancel every queued or running request whose id satisfies `cancel`.
    fn abort(&mut self, cancel: &dyn Fn(u64) -> bool) -> Result<(), PipelineError>;
    fn is_idle(&self) -> bool;
    /// One engine step: admit, decode one token each, return what finished.
    fn step(&mut self) -> Result<Vec<Completion>, PipelineError>;
    /// Worker events since the last call (worker processes only).
    fn drain_events(&mut self) -> Vec<(String, WorkerNotice, String)> {
        vec![]
    }
    /// Workers replaced so far (worker processes only).
    fn restarts(&self) -> usize {
        0
    }
}

impl Generator for Engine<'_> {
    fn submit(&mut self, request: Request) {
        Engine::submit(self, request);
    }

    fn abort(&mut self, cancel: &dyn Fn(u64) -> bool) -> Result<(), PipelineError> {
        Engine::abort(self, cancel)
            .map(|_| ())
            .during("cancelling requests")
    }

    fn is_idle(&self) -> bool {
        Engine::is_idle(self)
    }

    fn step(&mut self) -> Result<Vec<Completion>, PipelineError> {
        Engine::step(self).during("rollout")
    }
}

/// actor_infer: a weight replica here, or a worker process. The worker sits behind a mutex
/// because the rollout, the time-sharing ledger and weight sync each reach it in turn (and with
/// α > 0 from the rollout thread); calls never overlap.
#[allow(clippy::large_enum_variant)] // one per run: boxing would buy nothing
pub(super) enum Infer {
    Local(Transformer),
    Remote(Mutex<RemoteInfer>),
}

impl Infer {
    /// actor_infer as the run's placement asks, holding the policy's current weights.
    pub fn start(
        run: &RunConfig,
        cfg: &RlConfig,
        model: &LoadedModel,
    ) -> Result<Infer, PipelineError> {
        Ok(match run.workers.actor_infer.mode {
            PlacementMode::InProcess => Infer::Local(copy_of(model)?),
            PlacementMode::Process => Infer::Remote(Mutex::new(RemoteInfer::start(
                model,
                run.model.dtype,
                cfg.rollout_batch,
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
            Infer::Local(model) => {
                Box::new(Engine::new(model, eos_ids, max_batch).with_detokenizer(detokenize))
            }
            Infer::Remote(remote) => Box::new(RemoteGenerator(remote)),
        }
    }

    /// Take new weights (α > 0: between two decode steps).
    pub fn set_weights(&self, params: &ParamStore) -> Result<(), PipelineError> {
        match self {
            Infer::Local(model) => model
                .params()
                .copy_from(params)
                .during("weight sync to actor_infer"),
            Infer::Remote(remote) => lock(remote).set_weights(params),
        }
    }

    /// Stop a worker process; the events not reported yet.
    pub fn shutdown(self) -> Vec<(String, WorkerNotice, String)> {
        match self {
            Infer::Local(_) => vec![],
            Infer::Remote(remote) => remote
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .shutdown(),
        }
    }
}

/// The remote's state stays consistent across a panic elsewhere (every change is one statement),
/// so a poisoned lock is taken over rather than propagated.
pub(super) fn lock(remote: &Mutex<RemoteInfer>) -> MutexGuard<'_, RemoteInfer> {
    remote
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct RemoteGenerator<'a>(&'a Mutex<RemoteInfer>);

impl Generator for RemoteGenerator<'_> {
    fn submit(&mut self, request: Request) {
        lock(self.0).submit(request);
    }

    fn abort(&mut self, cancel: &dyn Fn(u64) -> bool) -> Result<(), PipelineError> {
        lock(self.0).abort(cancel);
        Ok(())
    }

    fn is_idle(&self) -> bool {
        lock(self.0).is_idle()
    }

    fn step(&mut self) -> Result<Vec<Completion>, PipelineError> {
        lock(self.0).step()
    }

    fn drain_events(&mut self) -> Vec<(String, WorkerNotice, String)> {
        lock(self.0).drain_events()
    }

    fn restarts(&self) -> usize {
        lock(self.0).worker.restarts
    }
}
