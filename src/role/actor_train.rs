//! The actor_train role behind one interface: the policy's optimizer in the trainer's process, or
//! the policy and its optimizer in a worker process ([`RemoteTrain`]). Every stage that changes
//! the policy's weights (SFT, DPO, RL) trains through it, with the recipe the stage gives it.
//!
//! Either way the trainer's process keeps the policy's weights (`LoadedModel`): in-process they
//! are the weights being trained; with a worker they are its mirror, refreshed after every step,
//! and they feed weight sync, reference refreshes and checkpoints alike.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::epochs::{ActorReport, ActorStep, actor_epochs};
use super::recipe::TrainRecipe;
use super::remote::{ModelReply as Reply, RemoteWorker, moved, state_lost, trained};
use super::train_serve::{LoraInit, TrainInit, TrainOp, restore_trainable};
use super::{
    HostCopy, Protocol, ResidentRole, Restore, RoleCall, RunError, TensorContext, WorkerNote,
    setup_err, step_file,
};
use crate::config::{PlacementMode, RunConfig};
use crate::model::{LoadError, LoadedModel};
use crate::scheduler::host_copy::{HostArea, read_into_vars};
use crate::train::AdamW;
use crate::train::checkpoint::{OptimizerState, load_trainer_state};
use crate::worker::{Role, WorkerError};

/// actor_train's calls to its worker process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ActorTrainCall {
    /// Load the policy and its optimizer.
    Init(Box<TrainInit>),
    /// Train on the actor step in the file `step`, then write the new weights to `weights_out`.
    Step { step: PathBuf, weights_out: PathBuf },
    /// Write the optimizer moments to `moments` (a checkpoint's file).
    Checkpoint { moments: PathBuf },
    /// Write weights and moments to the host copy at `path` (in place over the last offload's)
    /// and free them.
    Offload { path: PathBuf },
    /// Load them back from the host copy at `path`.
    Reload { path: PathBuf },
}

impl RoleCall for ActorTrainCall {
    fn phase(&self) -> &'static str {
        match self {
            ActorTrainCall::Init(_) => "load",
            ActorTrainCall::Step { .. } => "train",
            ActorTrainCall::Checkpoint { .. } => "checkpoint",
            ActorTrainCall::Offload { .. } => "offload",
            ActorTrainCall::Reload { .. } => "reload",
        }
    }
}

impl From<ActorTrainCall> for TrainOp {
    fn from(call: ActorTrainCall) -> TrainOp {
        match call {
            ActorTrainCall::Init(init) => TrainOp::Init(init),
            ActorTrainCall::Step { step, weights_out } => TrainOp::Step {
                step,
                weights_out: Some(weights_out),
            },
            ActorTrainCall::Checkpoint { moments } => TrainOp::Checkpoint {
                weights: None,
                moments,
            },
            ActorTrainCall::Offload { path } => TrainOp::Offload { path },
            ActorTrainCall::Reload { path } => TrainOp::Reload { path },
        }
    }
}

pub struct ActorTrainProtocol;

impl Protocol for ActorTrainProtocol {
    const ROLE: Role = Role::ActorTrain;
    type Request = ActorTrainCall;
    type Reply = Reply;
}

/// A train step longer than this is a hung worker (CPU steps of real models take minutes).
const CALL_TIMEOUT: Duration = Duration::from_secs(1800);

/// The policy's trainer: every stage that changes the policy's weights trains through it.
pub enum ActorTrain {
    Local {
        opt: AdamW,
        recipe: Box<TrainRecipe>,
    },
    Remote(Box<RemoteTrain>),
}

impl ActorTrain {
    /// The policy's trainer for `recipe` and `updates` AdamW steps, where the run places
    /// actor_train; its optimizer restored from the checkpoint when resuming.
    pub fn start(
        run: &RunConfig,
        recipe: TrainRecipe,
        model: &LoadedModel,
        updates: usize,
        resume: Option<Restore<'_>>,
    ) -> Result<ActorTrain, RunError> {
        if run.workers.actor_train.mode == PlacementMode::Process {
            let threads = run.worker_threads(Role::ActorTrain);
            let device = run.workers.device_of(Role::ActorTrain, 0);
            return RemoteTrain::start(model, recipe, updates, resume, threads, device)
                .map(|r| ActorTrain::Remote(Box::new(r)));
        }
        // The weights, or under LoRA the adapter's matrices.
        let vars = model.transformer.trainable_vars();
        let mut opt = AdamW::new(vars, recipe.optimizer.clone(), updates)
            .during("actor_train optimizer setup")?;
        if let Some(r) = resume {
            let (_, moments) = load_trainer_state(r.dir, model.transformer.device())?;
            opt.restore(r.optimizer_steps, &moments)
                .during("restoring the actor_train optimizer")?;
        }
        Ok(ActorTrain::Local {
            opt,
            recipe: Box::new(recipe),
        })
    }

    /// The recipe's epochs on `step`; afterwards `policy` holds the new weights.
    pub fn train(
        &mut self,
        step: &ActorStep,
        policy: &LoadedModel,
    ) -> Result<ActorReport, RunError> {
        match self {
            ActorTrain::Local { opt, recipe } => {
                actor_epochs(recipe, step, &policy.transformer, policy.pad_id, opt)
            }
            ActorTrain::Remote(r) => r.train(step, policy),
        }
    }

    /// Whether the policy's optimizer state lives only in a worker process (lost with it).
    pub fn is_remote(&self) -> bool {
        matches!(self, ActorTrain::Remote(_))
    }
}

impl ResidentRole for ActorTrain {
    fn role(&self) -> Role {
        Role::ActorTrain
    }

    fn offload(&mut self, host: &HostCopy<'_>) -> Result<u64, RunError> {
        match self {
            ActorTrain::Local { opt, .. } => {
                let weights = host.policy.transformer.params().named_tensors();
                host.area
                    .overwrite(Role::ActorTrain.as_str(), &opt.with_moments(weights))
                    .map_err(setup_err)
            }
            ActorTrain::Remote(r) => r.offload(),
        }
    }

    fn reload(&mut self, host: &HostCopy<'_>) -> Result<u64, RunError> {
        match self {
            ActorTrain::Local { opt, .. } => {
                let vars = host.policy.transformer.params().named_vars();
                restore_trainable(host.area, Role::ActorTrain, &vars, opt)
            }
            ActorTrain::Remote(r) => r.reload(),
        }
    }

    fn in_worker_process(&self) -> bool {
        matches!(self, ActorTrain::Remote(_))
    }

    fn drain_events(&mut self) -> Vec<WorkerNote> {
        match self {
            ActorTrain::Local { .. } => vec![],
            ActorTrain::Remote(r) => r.worker.drain_events(),
        }
    }

    fn restarts(&self) -> usize {
        match self {
            ActorTrain::Local { .. } => 0,
            ActorTrain::Remote(r) => r.worker.restarts,
        }
    }

    fn shutdown(&mut self) -> Vec<WorkerNote> {
        match self {
            ActorTrain::Local { .. } => vec![],
            ActorTrain::Remote(r) => r.worker.shutdown(),
        }
    }
}

impl OptimizerState for ActorTrain {
    fn steps_taken(&self) -> usize {
        match self {
            ActorTrain::Local { opt, .. } => opt.steps_taken(),
            ActorTrain::Remote(r) => r.optimizer_steps,
        }
    }

    fn save_moments(&self, path: &Path) -> Result<(), LoadError> {
        match self {
            ActorTrain::Local { opt, .. } => opt.save_moments(path),
            ActorTrain::Remote(r) => {
                let written = super::remote::writable_by_worker(&r.area, path, MOMENTS_OUT);
                let call = ActorTrainCall::Checkpoint {
                    moments: written.clone(),
                };
                r.worker
                    .call(call)
                    .map(drop)
                    .map_err(|e| LoadError::io(path, lost(e)))?;
                super::remote::settle(&written, path).map_err(|e| LoadError::io(path, e))
            }
        }
    }
}

/// actor_train in a worker process. Its optimizer state exists only there, so a lost worker cannot
/// be replaced without changing the run: the run stops, and resumes from its last checkpoint.
pub struct RemoteTrain {
    worker: RemoteWorker<ActorTrainProtocol>,
    area: HostArea,
    optimizer_steps: usize,
}

const STEP_FILE: &str = "actor_step";
/// The policy's weights as the worker loads them, and each step's new ones; under LoRA the
/// frozen base, written once, and each step's adapter goes to [`ADAPTER_OUT`].
const WEIGHTS_OUT: &str = "actor_train_weights";
const ADAPTER_OUT: &str = "actor_train_adapter";
const HOST_COPY: &str = "actor_train";
/// A checkpoint's moments as a worker on another node writes them and reads them to resume.
const MOMENTS_OUT: &str = "actor_train_checkpoint_moments.safetensors";
const MOMENTS_IN: &str = "actor_train_resume_moments.safetensors";

fn lost(e: WorkerError) -> RunError {
    state_lost(e, "the policy's optimizer state")
}

impl RemoteTrain {
    fn start(
        model: &LoadedModel,
        recipe: TrainRecipe,
        updates: usize,
        resume: Option<Restore<'_>>,
        threads: usize,
        device: crate::device::DeviceSpec,
    ) -> Result<RemoteTrain, RunError> {
        let area = HostArea::new().map_err(|e| {
            RunError::Setup(format!(
                "creating the host-memory area for actor_train: {e}"
            ))
        })?;
        area.write(WEIGHTS_OUT, &model.transformer.params().named_tensors())
            .map_err(setup_err)?;
        let lora = match model.transformer.lora() {
            Some(lora) => {
                let matrices: Vec<(String, candle_core::Tensor)> = lora
                    .named_vars()
                    .into_iter()
                    .map(|(n, v)| (n, v.as_tensor().clone()))
                    .collect();
                area.write(ADAPTER_OUT, &matrices).map_err(setup_err)?;
                Some(LoraInit {
                    settings: lora.settings.clone(),
                    adapter: area.path(ADAPTER_OUT),
                })
            }
            None => None,
        };
        let init = TrainInit {
            model_config: model.config().to_hf_json(),
            pad_id: model.pad_id,
            weights: area.path(WEIGHTS_OUT),
            recipe,
            total_updates: updates,
            moments: resume
                .map(|r| {
                    let file = r.dir.join("optimizer.safetensors");
                    super::remote::readable_by_worker(&area, &file, MOMENTS_IN)
                })
                .transpose()?,
            optimizer_steps: resume.map_or(0, |r| r.optimizer_steps),
            device,
            lora,
        };
        let optimizer_steps = init.optimizer_steps;
        let worker = RemoteWorker::start(
            ActorTrainCall::Init(Box::new(init)),
            CALL_TIMEOUT,
            threads,
            (area.dir(), &[&format!("{HOST_COPY}.safetensors")]),
        )?;
        Ok(RemoteTrain {
            worker,
            area,
            optimizer_steps,
        })
    }

    fn call(&self, call: ActorTrainCall) -> Result<Reply, RunError> {
        self.worker.call(call).map_err(lost)
    }

    fn train(&mut self, step: &ActorStep, policy: &LoadedModel) -> Result<ActorReport, RunError> {
        let path = self.area.path(STEP_FILE);
        step_file::write_actor(step, &path).map_err(setup_err)?;
        // Under LoRA only the adapter trains, and only it comes back.
        let out = match policy.transformer.lora() {
            Some(_) => ADAPTER_OUT,
            None => WEIGHTS_OUT,
        };
        let weights_out = self.area.path(out);
        let reply = self.call(ActorTrainCall::Step {
            step: path,
            weights_out: weights_out.clone(),
        })?;
        let (report, optimizer_steps) = trained(Role::ActorTrain, reply)?;
        read_into_vars(&weights_out, &policy.transformer.trainable_vars()).map_err(setup_err)?;
        self.optimizer_steps = optimizer_steps;
        Ok(report)
    }

    /// Offload: the worker writes weights and moments to its host copy and frees them.
    fn offload(&mut self) -> Result<u64, RunError> {
        let path = self.area.path(HOST_COPY);
        moved(
            Role::ActorTrain,
            self.call(ActorTrainCall::Offload { path })?,
        )
    }

    fn reload(&mut self) -> Result<u64, RunError> {
        let path = self.area.path(HOST_COPY);
        moved(
            Role::ActorTrain,
            self.call(ActorTrainCall::Reload { path })?,
        )
    }
}
