//! The critic of GAE runs behind one interface: a [`CriticNet`] in the trainer's process, or one
//! in a worker process ([`RemoteCritic`]) that computes the values of each step's rows and runs the
//! critic's epochs, with rows, targets and values travelling as shared-memory files.
//!
//! Unlike actor_train, nothing of the critic is mirrored in the trainer's process: only values come
//! back. Its optimizer state lives only in the worker, so a lost critic worker stops the run, which
//! resumes from its last checkpoint.

mod net;

use std::path::{Path, PathBuf};
use std::time::Duration;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

pub use net::CriticNet;
use net::initial_tensors;

use super::epochs::{CriticStep, critic_epochs};
use super::recipe::TrainRecipe;
use super::remote::{
    ModelReply as Reply, RemoteWorker, moved, readable_by_worker, settle, state_lost, trained,
    writable_by_worker,
};
use super::rows::{Rows, needs_critic};
use super::step_file::{write_critic, write_rows};
use super::train_serve::{TrainInit, TrainOp, restore_trainable};
use super::{
    HostCopy, Protocol, ResidentRole, Restore, RoleCall, RunError, TensorContext, WorkerNote,
    setup_err,
};
use crate::config::{PlacementMode, RlConfig, RunConfig};
use crate::metrics::Metrics;
use crate::model::{LoadError, LoadedModel};
use crate::scheduler::host_copy::{HostArea, read_tensors};
use crate::train::checkpoint::{load_moments, load_vars};
use crate::worker::Role;

/// The critic's calls to its worker process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum CriticCall {
    /// Load the network, value head and optimizer.
    Init(Box<TrainInit>),
    /// The values of the response tokens of the rows file `rows`, written to `out`.
    Values { rows: PathBuf, out: PathBuf },
    /// Train on the critic step in the file `step`.
    Step { step: PathBuf },
    /// Write the weights to `weights` and the moments to `moments` (a checkpoint's files).
    Checkpoint { weights: PathBuf, moments: PathBuf },
    /// Write weights, head and moments to the host copy at `path` (in place over the last
    /// offload's) and free them.
    Offload { path: PathBuf },
    /// Load them back from the host copy at `path`.
    Reload { path: PathBuf },
}

impl RoleCall for CriticCall {
    fn phase(&self) -> &'static str {
        match self {
            CriticCall::Init(_) => "load",
            CriticCall::Values { .. } => "critic_values",
            CriticCall::Step { .. } => "train",
            CriticCall::Checkpoint { .. } => "checkpoint",
            CriticCall::Offload { .. } => "offload",
            CriticCall::Reload { .. } => "reload",
        }
    }
}

impl From<CriticCall> for TrainOp {
    fn from(call: CriticCall) -> TrainOp {
        match call {
            CriticCall::Init(init) => TrainOp::Init(init),
            CriticCall::Values { rows, out } => TrainOp::Values { rows, out },
            CriticCall::Step { step } => TrainOp::Step {
                step,
                weights_out: None,
            },
            CriticCall::Checkpoint { weights, moments } => TrainOp::Checkpoint {
                weights: Some(weights),
                moments,
            },
            CriticCall::Offload { path } => TrainOp::Offload { path },
            CriticCall::Reload { path } => TrainOp::Reload { path },
        }
    }
}

pub struct CriticProtocol;

impl Protocol for CriticProtocol {
    const ROLE: Role = Role::Critic;
    type Request = CriticCall;
    type Reply = Reply;
}

/// A checkpoint's critic network and value head.
pub const CRITIC_FILE: &str = "critic.safetensors";
/// A checkpoint's critic AdamW moments.
pub const CRITIC_OPTIMIZER_FILE: &str = "critic_optimizer.safetensors";

pub enum Critic {
    Local(Box<CriticNet>),
    Remote(Box<RemoteCritic>),
}

/// The critic in a worker process, and the AdamW steps it has taken.
pub struct RemoteCritic {
    worker: RemoteWorker<CriticProtocol>,
    area: HostArea,
    optimizer_steps: usize,
}

/// A values or train call longer than this is a hung worker (CPU steps of real models take
/// minutes).
const CALL_TIMEOUT: Duration = Duration::from_secs(1800);
const INITIAL: &str = "critic_initial";
const HOST_COPY: &str = "critic";
const ROWS: &str = "critic_rows";
const VALUES: &str = "critic_values";
const STEP_FILE: &str = "critic_step";

impl Critic {
    /// The critic of `cfg` for `updates` AdamW steps, where the run places it, when the advantage
    /// estimator needs one; restored from the checkpoint when resuming.
    pub fn start(
        run: &RunConfig,
        cfg: &RlConfig,
        policy: &LoadedModel,
        updates: usize,
        resume: Option<Restore<'_>>,
    ) -> Result<Option<Critic>, RunError> {
        let Some(recipe) = cfg
            .critic_recipe()
            .filter(|_| needs_critic(cfg.adv_estimator))
        else {
            return Ok(None);
        };
        let steps = resume.map_or(0, |r| r.optimizer_steps);
        if run.workers.critic.mode == PlacementMode::Process {
            let threads = run.worker_threads(Role::Critic);
            let device = run.workers.device_of(Role::Critic, 0);
            return RemoteCritic::start(policy, recipe, updates, resume, steps, threads, device)
                .map(|r| Some(Critic::Remote(Box::new(r))));
        }
        // Copies: built from a variable's tensor, a `Var` would share the policy's storage.
        let tensors = initial_tensors(policy)?
            .into_iter()
            .map(|(n, t)| Ok((n, t.copy()?)))
            .collect::<candle_core::Result<_>>()
            .during("copying the policy for the critic")?;
        let origin = Path::new("the policy");
        let mut net = CriticNet::from_tensors(
            policy.config(),
            tensors,
            &recipe.optimizer,
            updates,
            origin,
            None,
        )
        .map_err(RunError::Setup)?;
        if let Some(r) = resume {
            load_vars(&net.vars(), &r.dir.join(CRITIC_FILE))?;
            let device = policy.transformer.device();
            let moments = load_moments(&r.dir.join(CRITIC_OPTIMIZER_FILE), device)?;
            net.opt
                .restore(steps, &moments)
                .during("restoring the critic optimizer")?;
        }
        Ok(Some(Critic::Local(Box::new(net))))
    }

    /// The value of every response token of `rows`, (n, width), on `device`.
    pub fn values(
        &mut self,
        pad_id: u32,
        rows: &Rows<'_>,
        device: &Device,
    ) -> Result<Tensor, RunError> {
        match self {
            Critic::Local(net) => net.row_values(pad_id, rows).during("critic values"),
            Critic::Remote(r) => r.values(rows, device),
        }
    }

    /// The critic's epochs on `step`; returns the `critic/*` metrics.
    pub fn train(
        &mut self,
        cfg: &RlConfig,
        step: &CriticStep,
        pad_id: u32,
    ) -> Result<Metrics, RunError> {
        match self {
            Critic::Local(net) => {
                let recipe = cfg.critic_recipe().ok_or_else(|| {
                    RunError::Setup(
                        "the critic was asked to train in a run without rl.critic".into(),
                    )
                })?;
                critic_epochs(&recipe, step, net, pad_id)
            }
            Critic::Remote(r) => r.train(step),
        }
    }

    pub fn steps_taken(&self) -> usize {
        match self {
            Critic::Local(net) => net.opt.steps_taken(),
            Critic::Remote(r) => r.optimizer_steps,
        }
    }

    /// Write the critic's checkpoint files into `dir`.
    pub fn save(&self, dir: &Path) -> Result<(), LoadError> {
        let (weights, moments) = (dir.join(CRITIC_FILE), dir.join(CRITIC_OPTIMIZER_FILE));
        match self {
            Critic::Local(net) => net.save(&weights, &moments),
            Critic::Remote(r) => {
                let written = (
                    writable_by_worker(&r.area, &weights, "critic_checkpoint.safetensors"),
                    writable_by_worker(&r.area, &moments, "critic_checkpoint_moments.safetensors"),
                );
                let call = CriticCall::Checkpoint {
                    weights: written.0.clone(),
                    moments: written.1.clone(),
                };
                r.call(call)
                    .map(drop)
                    .map_err(|e| LoadError::io(&moments, e))?;
                settle(&written.0, &weights).map_err(|e| LoadError::io(&weights, e))?;
                settle(&written.1, &moments).map_err(|e| LoadError::io(&moments, e))
            }
        }
    }

    /// Whether the critic's optimizer state lives only in a worker process (lost with it).
    pub fn is_remote(&self) -> bool {
        matches!(self, Critic::Remote(_))
    }
}

impl ResidentRole for Critic {
    fn role(&self) -> Role {
        Role::Critic
    }

    fn offload(&mut self, host: &HostCopy<'_>) -> Result<u64, RunError> {
        match self {
            Critic::Local(c) => host
                .area
                .overwrite(
                    Role::Critic.as_str(),
                    &c.opt.with_moments(c.named_tensors()),
                )
                .map_err(setup_err),
            Critic::Remote(r) => r.offload(),
        }
    }

    fn reload(&mut self, host: &HostCopy<'_>) -> Result<u64, RunError> {
        match self {
            Critic::Local(c) => {
                let vars = c.vars();
                restore_trainable(host.area, Role::Critic, &vars, &c.opt)
            }
            Critic::Remote(r) => r.reload(),
        }
    }

    fn in_worker_process(&self) -> bool {
        matches!(self, Critic::Remote(_))
    }

    fn drain_events(&mut self) -> Vec<WorkerNote> {
        match self {
            Critic::Local(_) => vec![],
            Critic::Remote(r) => r.worker.drain_events(),
        }
    }

    fn restarts(&self) -> usize {
        match self {
            Critic::Local(_) => 0,
            Critic::Remote(r) => r.worker.restarts,
        }
    }

    fn shutdown(&mut self) -> Vec<WorkerNote> {
        match self {
            Critic::Local(_) => vec![],
            Critic::Remote(r) => r.worker.shutdown(),
        }
    }
}

impl RemoteCritic {
    fn start(
        policy: &LoadedModel,
        recipe: TrainRecipe,
        updates: usize,
        resume: Option<Restore<'_>>,
        optimizer_steps: usize,
        threads: usize,
        device: crate::device::DeviceSpec,
    ) -> Result<RemoteCritic, RunError> {
        let area = HostArea::new().map_err(|e| {
            RunError::Setup(format!("creating the host-memory area for the critic: {e}"))
        })?;
        // A resumed critic loads straight from the checkpoint: the trainer never holds a copy.
        let weights = match resume {
            Some(r) => {
                readable_by_worker(&area, &r.dir.join(CRITIC_FILE), "critic_resume.safetensors")?
            }
            None => {
                area.write(INITIAL, &initial_tensors(policy)?)
                    .map_err(setup_err)?;
                area.path(INITIAL)
            }
        };
        let init = TrainInit {
            model_config: policy.config().to_hf_json(),
            pad_id: policy.pad_id,
            weights,
            recipe,
            total_updates: updates,
            moments: resume
                .map(|r| {
                    let file = r.dir.join(CRITIC_OPTIMIZER_FILE);
                    readable_by_worker(&area, &file, "critic_resume_moments.safetensors")
                })
                .transpose()?,
            optimizer_steps,
            device,
            lora: None,
        };
        let worker = RemoteWorker::start(
            CriticCall::Init(Box::new(init)),
            CALL_TIMEOUT,
            threads,
            (area.dir(), &[&format!("{HOST_COPY}.safetensors")]),
        )?;
        // Loaded: the worker holds the weights now, so the initial copy is not needed.
        area.remove(INITIAL);
        Ok(RemoteCritic {
            worker,
            area,
            optimizer_steps,
        })
    }

    fn call(&self, call: CriticCall) -> Result<Reply, RunError> {
        self.worker
            .call(call)
            .map_err(|e| state_lost(e, "the critic's optimizer state"))
    }

    fn values(&mut self, rows: &Rows<'_>, device: &Device) -> Result<Tensor, RunError> {
        // The temperature does not enter values; the rows file carries one for every reader.
        write_rows(rows, 1.0, &self.area.path(ROWS)).map_err(setup_err)?;
        let out = self.area.path(VALUES);
        let reply = self.call(CriticCall::Values {
            rows: self.area.path(ROWS),
            out: out.clone(),
        })?;
        moved(Role::Critic, reply)?;
        let mut tensors = read_tensors(&out, device).map_err(setup_err)?;
        tensors.remove("values").ok_or_else(|| {
            RunError::Setup(format!(
                "the critic worker's output '{}' has no 'values'",
                out.display()
            ))
        })
    }

    fn train(&mut self, step: &CriticStep) -> Result<Metrics, RunError> {
        let path = self.area.path(STEP_FILE);
        write_critic(step, &path).map_err(setup_err)?;
        let reply = self.call(CriticCall::Step { step: path })?;
        let (report, optimizer_steps) = trained(Role::Critic, reply)?;
        let metrics = report.metrics;
        self.optimizer_steps = optimizer_steps;
        Ok(metrics)
    }

    /// Offload: the worker writes weights, head and moments to its host copy (in place over the
    /// last offload's) and frees them.
    fn offload(&mut self) -> Result<u64, RunError> {
        let path = self.area.path(HOST_COPY);
        moved(Role::Critic, self.call(CriticCall::Offload { path })?)
    }

    fn reload(&mut self) -> Result<u64, RunError> {
        let path = self.area.path(HOST_COPY);
        moved(Role::Critic, self.call(CriticCall::Reload { path })?)
    }
}
