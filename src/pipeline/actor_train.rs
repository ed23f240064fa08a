//! The actor_train role behind one interface: the policy's optimizer in the trainer's process, or
//! the policy and its optimizer in a worker process ([`RemoteTrain`]).
//!
//! Either way the trainer's process keeps the policy's weights (`LoadedModel`): in-process they
//! are the weights being trained; with a worker they are its mirror, refreshed after every step,
//! and they feed weight sync, reference refreshes and checkpoints alike.

use std::path::Path;
use std::time::Duration;

use super::remote_worker::{RemoteWorker, moved, setup_err, state_lost, trained};
use super::rl_epochs::{ActorStep, actor_epochs};
use super::{PipelineError, Resume, TensorContext, step_file};
use crate::config::{PlacementMode, RlConfig, RunConfig};
use crate::metrics::{Metrics, WorkerNotice};
use crate::model::{LoadError, LoadedModel};
use crate::scheduler::host_copy::{HostArea, read_into_vars};
use crate::train::AdamW;
use crate::train::checkpoint::{OptimizerState, load_trainer_state};
use crate::worker::train::TrainInit;
use crate::worker::{Reply, Request as Call, Role, WorkerError};

/// A train step longer than this is a hung worker (CPU steps of real models take minutes).
const CALL_TIMEOUT: Duration = Duration::from_secs(1800);

pub enum ActorTrain {
    Local(AdamW),
    Remote(Box<RemoteTrain>),
}

impl ActorTrain {
    /// The policy's optimizer for `updates` AdamW steps, where the run places it; restored from
    /// the checkpoint when resuming.
    pub fn start(
        run: &RunConfig,
        cfg: &RlConfig,
        model: &LoadedModel,
        updates: usize,
        resume: Option<&Resume>,
    ) -> Result<ActorTrain, PipelineError> {
        if run.workers.actor_train.mode == PlacementMode::Process {
            return RemoteTrain::start(model, cfg, updates, resume)
                .map(|r| ActorTrain::Remote(Box::new(r)));
        }
        let vars = model.transformer.params().named_vars();
        let mut opt =
            AdamW::new(vars, cfg.optimizer.clone(), updates).during("rl optimizer setup")?;
        if let Some(r) = resume {
            let (_, moments) = load_trainer_state(&r.dir, model.transformer.device())?;
            opt.restore(r.state.optimizer_steps, &moments)
                .during("restoring the rl optimizer")?;
        }
        Ok(ActorTrain::Local(opt))
    }

    /// The actor's epochs on `step`; afterwards `policy` holds the new weights.
    pub fn train(
        &mut self,
        cfg: &RlConfig,
        step: &ActorStep,
        policy: &LoadedModel,
    ) -> Result<Metrics, PipelineError> {
        match self {
            ActorTrain::Local(opt) => {
                actor_epochs(cfg, step, &policy.transformer, policy.pad_id, opt)
            }
            ActorTrain::Remote(r) => r.train(step, policy),
        }
    }

    /// Worker events since the last call (a worker process only).
    pub fn drain_events(&mut self) -> Vec<(String, WorkerNotice, String)> {
        match self {
            ActorTrain::Local(_) => vec![],
            ActorTrain::Remote(r) => r.worker.drain_events(),
        }
    }

    /// Stop the worker, if there is one; returns its last events.
    pub fn shutdown(self) -> Vec<(String, WorkerNotice, String)> {
        match self {
            ActorTrain::Local(_) => vec![],
            ActorTrain::Remote(r) => {
                let RemoteTrain { worker, area, .. } = *r;
                let events = worker.shutdown();
                drop(area);
                events
            }
        }
    }
}

impl OptimizerState for ActorTrain {
    fn steps_taken(&self) -> usize {
        match self {
            ActorTrain::Local(opt) => opt.steps_taken(),
            ActorTrain::Remote(r) => r.optimizer_steps,
        }
    }

    fn save_moments(&self, path: &Path) -> Result<(), LoadError> {
        match self {
            ActorTrain::Local(opt) => opt.save_moments(path),
            ActorTrain::Remote(r) => {
                let call = Call::TrainCheckpoint {
                    weights: None,
                    moments: path.to_path_buf(),
                };
                r.worker
                    .call(call)
                    .map(drop)
                    .map_err(|e| LoadError::io(path, lost(e)))
            }
        }
    }
}

/// actor_train in a worker process. Its optimizer state exists only there, so a lost worker cannot
/// be replaced without changing the run: the run stops, and resumes from its last checkpoint.
pub struct RemoteTrain {
    worker: RemoteWorker,
    area: HostArea,
    optimizer_steps: usize,
}

const STEP_FILE: &str = "actor_step";
const WEIGHTS_OUT: &str = "actor_train_weights";
const HOST_COPY: &str = "actor_train";

fn lost(e: WorkerError) -> PipelineError {
    state_lost(e, "the policy's optimizer state")
}

impl RemoteTrain {
    fn start(
        model: &LoadedModel,
        cfg: &RlConfig,
        updates: usize,
        resume: Option<&Resume>,
    ) -> Result<RemoteTrain, PipelineError> {
        let area = HostArea::new().map_err(|e| {
            PipelineError::Setup(format!(
                "creating the host-memory area for actor_train: {e}"
            ))
        })?;
        area.write(WEIGHTS_OUT, &model.transformer.params().named_tensors())
            .map_err(setup_err)?;
        let init = TrainInit {
            model_config: model.config().to_hf_json(),
            pad_id: model.pad_id,
            weights: area.path(WEIGHTS_OUT),
            rl: cfg.clone(),
            total_updates: updates,
            moments: resume.map(|r| r.dir.join("optimizer.safetensors")),
            optimizer_steps: resume.map_or(0, |r| r.state.optimizer_steps),
        };
        let optimizer_steps = init.optimizer_steps;
        let worker = RemoteWorker::start(
            Role::ActorTrain,
            Call::TrainInit(Box::new(init)),
            CALL_TIMEOUT,
        )?;
        Ok(RemoteTrain {
            worker,
            area,
            optimizer_steps,
        })
    }

    fn call(&self, call: Call) -> Result<Reply, PipelineError> {
        self.worker.call(call).map_err(lost)
    }

    fn train(&mut self, step: &ActorStep, policy: &LoadedModel) -> Result<Metrics, PipelineError> {
        let path = self.area.path(STEP_FILE);
        step_file::write_actor(step, &path).map_err(setup_err)?;
        let weights_out = self.area.path(WEIGHTS_OUT);
        let reply = self.call(Call::TrainStep {
            step: path,
            weights_out: Some(weights_out.clone()),
        })?;
        let (metrics, optimizer_steps) = trained(Role::ActorTrain, reply)?;
        read_into_vars(&weights_out, &policy.transformer.params().named_vars())
            .map_err(setup_err)?;
        self.optimizer_steps = optimizer_steps;
        Ok(metrics)
    }

    /// Offload: the worker writes weights and moments to its host copy and frees them.
    pub fn offload(&mut self) -> Result<u64, PipelineError> {
        let path = self.area.path(HOST_COPY);
        moved(Role::ActorTrain, self.call(Call::Offload { path })?)
    }

    pub fn reload(&mut self) -> Result<u64, PipelineError> {
        let path = self.area.path(HOST_COPY);
        moved(Role::ActorTrain, self.call(Call::Reload { path })?)
    }
}
