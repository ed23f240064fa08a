//! The critic of GAE runs behind one interface: a [`CriticNet`] in the trainer's process, or one
//! in a worker process ([`RemoteCritic`]) that computes the values of each step's rows and runs the
//! critic's epochs, with rows, targets and values travelling as shared-memory files.
//!
//! Unlike actor_train, nothing of the critic is mirrored in the trainer's process: only values come
//! back. Its optimizer state lives only in the worker, so a lost critic worker stops the run, which
//! resumes from its last checkpoint.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use candle_core::{Device, Tensor, Var};

use super::remote_worker::{RemoteWorker, moved, setup_err, state_lost, trained};
use super::rl_epochs::{CriticStep, critic_epochs};
use super::rl_update::{Rows, chunked, needs_critic};
use super::step_file::{write_critic, write_rows};
use super::{PipelineError, Resume, TensorContext};
use crate::config::{PlacementMode, RlConfig, RunConfig};
use crate::metrics::{Metrics, WorkerNotice};
use crate::model::{LoadError, LoadedModel, ModelConfig, Numerics, ParamStore, Transformer};
use crate::scheduler::host_copy::{HostArea, read_tensors};
use crate::train::batch::response_hidden;
use crate::train::checkpoint::{load_moments, load_vars, save_moments, save_vars};
use crate::train::{AdamW, OptimizerConfig, TrainBatch, ValueHead};
use crate::worker::train::TrainInit;
use crate::worker::{Reply, Request as Call, Role};

/// A checkpoint's critic network and value head.
pub const CRITIC_FILE: &str = "critic.safetensors";
/// A checkpoint's critic AdamW moments.
pub const CRITIC_OPTIMIZER_FILE: &str = "critic_optimizer.safetensors";

/// The critic's network: a transformer (initialised from the policy) with a value head, and the
/// AdamW over both.
pub struct CriticNet {
    pub model: Transformer,
    pub head: ValueHead,
    pub opt: AdamW,
}

impl CriticNet {
    /// values: (b, R) for the positions that predict response tokens.
    pub(crate) fn values(
        &self,
        tb: &TrainBatch,
        numerics: Numerics,
    ) -> candle_core::Result<Tensor> {
        let hidden = response_hidden(&self.model, tb, numerics)?;
        self.head.forward(&hidden)? * &tb.response_mask
    }

    /// The value of every response token of `rows`, (n, width): the GAE baseline of a step.
    pub fn row_values(&self, pad_id: u32, rows: &Rows<'_>) -> candle_core::Result<Tensor> {
        chunked(&self.model, pad_id, rows, &|tb| {
            self.values(tb, Numerics::Fast)
        })
    }

    /// Network then value head: the optimizer's variables, in its order.
    pub fn vars(&self) -> Vec<(String, Var)> {
        critic_vars(&self.model, &self.head)
    }

    pub fn named_tensors(&self) -> Vec<(String, Tensor)> {
        self.vars()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().clone()))
            .collect()
    }

    /// Build from named tensors (network and `value_head.*`, as [`CriticNet::named_tensors`]
    /// gives them), with a fresh optimizer for `updates` AdamW steps. `origin` names the tensors'
    /// file in errors. The critic's variables take the tensors' storage (candle shares a
    /// variable's): pass copies of tensors that something else trains.
    pub fn from_tensors(
        config: &ModelConfig,
        mut tensors: BTreeMap<String, Tensor>,
        optimizer: &OptimizerConfig,
        updates: usize,
        origin: &Path,
    ) -> Result<CriticNet, String> {
        let mut take = |name: &str| {
            tensors
                .remove(name)
                .ok_or_else(|| format!("'{}' has no tensor '{name}'", origin.display()))
        };
        let (weight, bias) = (take("value_head.weight")?, take("value_head.bias")?);
        let hidden = config.hidden_size;
        if weight.dims() != [1, hidden] || bias.dims() != [1] {
            return Err(format!(
                "'{}': the value head has shapes {:?} and {:?}, expected [1, {hidden}] and [1]",
                origin.display(),
                weight.dims(),
                bias.dims()
            ));
        }
        let err = |e: candle_core::Error| format!("'{}': {e}", origin.display());
        let head = ValueHead {
            weight: Var::from_tensor(&weight).map_err(err)?,
            bias: Var::from_tensor(&bias).map_err(err)?,
        };
        let params = ParamStore::from_tensors(tensors).map_err(err)?;
        params
            .check_against(config, &origin.display().to_string())
            .map_err(|e| e.to_string())?;
        let model = Transformer::new(config.clone(), params).map_err(err)?;
        let opt =
            AdamW::new(critic_vars(&model, &head), optimizer.clone(), updates).map_err(err)?;
        Ok(CriticNet { model, head, opt })
    }

    /// Write the network and head to `weights`, the moments to `moments` (a checkpoint's files).
    pub fn save(&self, weights: &Path, moments: &Path) -> Result<(), LoadError> {
        save_vars(&self.vars(), weights)?;
        save_moments(&self.opt, moments)
    }
}

fn critic_vars(model: &Transformer, head: &ValueHead) -> Vec<(String, Var)> {
    let mut vars = model.params().named_vars();
    vars.extend(head.vars());
    vars
}

/// The policy's weights beside a zero value head: a critic as a run starts it.
fn initial_tensors(policy: &LoadedModel) -> Result<Vec<(String, Tensor)>, PipelineError> {
    let device = policy.transformer.device();
    let head = ValueHead::new(policy.config().hidden_size, device).during("value head")?;
    let mut tensors = policy.transformer.params().named_tensors();
    tensors.extend(
        head.vars()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().clone())),
    );
    Ok(tensors)
}

pub enum Critic {
    Local(Box<CriticNet>),
    Remote(Box<RemoteCritic>),
}

/// The critic in a worker process, and the AdamW steps it has taken.
pub struct RemoteCritic {
    worker: RemoteWorker,
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
        resume: Option<&Resume>,
    ) -> Result<Option<Critic>, PipelineError> {
        let Some(c) = cfg
            .critic
            .as_ref()
            .filter(|_| needs_critic(cfg.adv_estimator))
        else {
            return Ok(None);
        };
        let steps = resume
            .and_then(|r| r.state.rl.as_ref()?.critic_optimizer_steps)
            .unwrap_or(0);
        if run.workers.critic.mode == PlacementMode::Process {
            return RemoteCritic::start(policy, cfg, updates, resume, steps)
                .map(|r| Some(Critic::Remote(Box::new(r))));
        }
        // Copies: built from a variable's tensor, a `Var` would share the policy's storage.
        let tensors = initial_tensors(policy)?
            .into_iter()
            .map(|(n, t)| Ok((n, t.copy()?)))
            .collect::<candle_core::Result<_>>()
            .during("copying the policy for the critic")?;
        let origin = Path::new("the policy");
        let mut net =
            CriticNet::from_tensors(policy.config(), tensors, &c.optimizer, updates, origin)
                .map_err(PipelineError::Setup)?;
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
    ) -> Result<Tensor, PipelineError> {
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
    ) -> Result<Metrics, PipelineError> {
        match self {
            Critic::Local(net) => critic_epochs(cfg, step, net, pad_id),
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
                let call = Call::TrainCheckpoint {
                    weights: Some(weights),
                    moments: moments.clone(),
                };
                r.call(call)
                    .map(drop)
                    .map_err(|e| LoadError::io(&moments, e))
            }
        }
    }

    pub fn local_mut(&mut self) -> Option<&mut CriticNet> {
        match self {
            Critic::Local(net) => Some(net),
            Critic::Remote(_) => None,
        }
    }

    pub fn remote(&mut self) -> Option<&mut RemoteCritic> {
        match self {
            Critic::Local(_) => None,
            Critic::Remote(r) => Some(r),
        }
    }

    /// Worker events since the last call (a worker process only).
    pub fn drain_events(&mut self) -> Vec<(String, WorkerNotice, String)> {
        match self {
            Critic::Local(_) => vec![],
            Critic::Remote(r) => r.worker.drain_events(),
        }
    }

    /// Stop the worker, if there is one; returns its last events.
    pub fn shutdown(self) -> Vec<(String, WorkerNotice, String)> {
        match self {
            Critic::Local(_) => vec![],
            Critic::Remote(r) => {
                let RemoteCritic { worker, area, .. } = *r;
                let events = worker.shutdown();
                drop(area);
                events
            }
        }
    }
}

impl RemoteCritic {
    fn start(
        policy: &LoadedModel,
        cfg: &RlConfig,
        updates: usize,
        resume: Option<&Resume>,
        optimizer_steps: usize,
    ) -> Result<RemoteCritic, PipelineError> {
        let area = HostArea::new().map_err(|e| {
            PipelineError::Setup(format!("creating the host-memory area for the critic: {e}"))
        })?;
        // A resumed critic loads straight from the checkpoint: the trainer never holds a copy.
        let weights = match resume {
            Some(r) => r.dir.join(CRITIC_FILE),
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
            rl: cfg.clone(),
            total_updates: updates,
            moments: resume.map(|r| r.dir.join(CRITIC_OPTIMIZER_FILE)),
            optimizer_steps,
        };
        let call = Call::TrainInit(Box::new(init));
        let worker = RemoteWorker::start(Role::Critic, call, CALL_TIMEOUT)?;
        // Loaded: the worker holds the weights now, so the initial copy is not needed.
        area.remove(INITIAL);
        Ok(RemoteCritic {
            worker,
            area,
            optimizer_steps,
        })
    }

    fn call(&self, call: Call) -> Result<Reply, PipelineError> {
        self.worker
            .call(call)
            .map_err(|e| state_lost(e, "the critic's optimizer state"))
    }

    fn values(&mut self, rows: &Rows<'_>, device: &Device) -> Result<Tensor, PipelineError> {
        // The temperature does not enter values; the rows file carries one for every reader.
        write_rows(rows, 1.0, &self.area.path(ROWS)).map_err(setup_err)?;
        let out = self.area.path(VALUES);
        let reply = self.call(Call::CriticValues {
            rows: self.area.path(ROWS),
            out: out.clone(),
        })?;
        moved(Role::Critic, reply)?;
        let mut tensors = read_tensors(&out, device).map_err(setup_err)?;
        tensors.remove("values").ok_or_else(|| {
            PipelineError::Setup(format!(
                "the critic worker's output '{}' has no 'values'",
                out.display()
            ))
        })
    }

    fn train(&mut self, step: &CriticStep) -> Result<Metrics, PipelineError> {
        let path = self.area.path(STEP_FILE);
        write_critic(step, &path).map_err(setup_err)?;
        let reply = self.call(Call::TrainStep {
            step: path,
            weights_out: None,
        })?;
        let (metrics, optimizer_steps) = trained(Role::Critic, reply)?;
        self.optimizer_steps = optimizer_steps;
        Ok(metrics)
    }

    /// Offload: the worker writes weights, head and moments to its host copy and frees them.
    pub fn offload(&mut self) -> Result<u64, PipelineError> {
        let path = self.area.path(HOST_COPY);
        moved(Role::Critic, self.call(Call::Offload { path })?)
    }

    pub fn reload(&mut self) -> Result<u64, PipelineError> {
        let path = self.area.path(HOST_COPY);
        moved(Role::Critic, self.call(Call::Reload { path })?)
    }
}
