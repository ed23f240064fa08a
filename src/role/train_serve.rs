//! The trainable roles in a worker process — actor_train (the policy's weights and AdamW state,
//! and the epochs of its [`TrainRecipe`] over each step's [`ActorStep`]: an RL step, an SFT batch
//! or DPO pairs) and the critic (its network, value head and AdamW state, the values of each
//! step's rows and the critic's epochs over each [`CriticStep`]).
//!
//! The trainer's process prepares every step (rewards, reference log-probs, values, advantages,
//! masks; an SFT batch's rows; a DPO batch's pairs and reference log-probs) and hands the worker
//! one shared-memory file. actor_train trains and writes the new weights
//! to the host copy it is told, which the trainer reads back as its mirror of the policy (for weight
//! sync, reference refreshes and checkpoints); the critic keeps its weights to itself. Offloading
//! writes weights and moments to a host copy and drops them, so the worker's memory is really freed
//! until the reload.
//!
//! [`ActorStep`]: super::epochs::ActorStep
//! [`CriticStep`]: super::epochs::CriticStep

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor, Var};
use serde::{Deserialize, Serialize};

use super::critic::CriticNet;
use super::epochs::{ActorReport, actor_epochs, critic_epochs};
use super::recipe::TrainRecipe;
use super::remote::ModelReply as Reply;
use super::step_file::{answer_rows, read_actor, read_critic};
use super::{Calls, Role, RoleCall};
use super::{RunError, setup_err};
use crate::model::lora::{LoraSettings, LoraVars};
use crate::model::{ModelConfig, ParamStore, Transformer};
use crate::scheduler::host_copy::HostArea;
use crate::scheduler::host_copy::{
    overwrite_tensors, read_host_copy, read_tensors, read_variables, tensor_bytes,
};
use crate::train::AdamW;
use crate::train::checkpoint::{load_moments, save_moments, save_vars};
use crate::train::optim::MOMENT_PREFIXES;

/// What to load: the network's shape, its weights from the host copy `weights` (for the critic
/// with its `value_head.*`), its optimizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainInit {
    /// The policy's config.json (Hugging Face layout).
    pub model_config: serde_json::Value,
    pub pad_id: u32,
    pub weights: PathBuf,
    /// How the role trains: its optimizer, epochs and loss.
    pub recipe: TrainRecipe,
    /// AdamW steps the learning-rate schedule spans.
    pub total_updates: usize,
    /// Resuming: the checkpoint's optimizer moments, and the AdamW steps taken before it.
    pub moments: Option<PathBuf>,
    pub optimizer_steps: usize,
    /// The device the worker computes on (`workers.devices`, the role's `device_mapping`).
    #[serde(default)]
    pub device: crate::device::DeviceSpec,
    /// actor_train under LoRA: `weights` holds the frozen base, and only the adapter trains.
    #[serde(default)]
    pub lora: Option<LoraInit>,
}

/// A LoRA adapter for actor_train's worker to train.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoraInit {
    pub settings: LoraSettings,
    /// The host copy of its matrices, under their PEFT names, read once at load. (The parent
    /// names the same file as each step's `weights_out`, so after the first step it holds the
    /// latest adapter; the base's copy is never rewritten.)
    pub adapter: PathBuf,
}

/// Everything but the weights and moments: kept while offloaded.
struct Base {
    role: Role,
    config: ModelConfig,
    pad_id: u32,
    recipe: TrainRecipe,
    total_updates: usize,
    /// Where the network lives while resident.
    device: Device,
    /// Under LoRA: the adapter's settings, and the host copy of the frozen base (the parent's,
    /// written once), which an offload leaves where it is and a reload reads again.
    lora: Option<(LoraSettings, PathBuf)>,
}

/// The network and its optimizer, while on the device.
enum Resident {
    Actor { model: Transformer, opt: AdamW },
    Critic(CriticNet),
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Base {
    /// The network from named tensors (`origin` names their file), with an optimizer: fresh, or
    /// resumed from `moments` (the steps taken, and the tensors holding the moments).
    fn build(
        &self,
        tensors: BTreeMap<String, Tensor>,
        origin: &Path,
        moments: Option<(usize, &mut HashMap<String, Tensor>)>,
    ) -> Result<Resident, String> {
        let optimizer = &self.recipe.optimizer;
        let updates = self.total_updates;
        if self.role == Role::Critic {
            let net = CriticNet::from_tensors(
                &self.config,
                tensors,
                optimizer,
                updates,
                origin,
                moments,
            )?;
            return Ok(Resident::Critic(net));
        }
        let mut tensors = tensors;
        let lora = match &self.lora {
            Some((settings, _)) => Some(
                LoraVars::take_named(settings, "", &mut tensors)
                    .map_err(|e| format!("host copy '{}': {e}", origin.display()))?,
            ),
            None => None,
        };
        let model = build_transformer(&self.config, tensors, origin)?.with_lora(lora);
        // The weights, or under LoRA the adapter's matrices.
        let vars = model.trainable_vars();
        let opt = AdamW::new_or_resumed(vars, optimizer.clone(), updates, moments)
            .map_err(|e| format!("host copy '{}': {e}", origin.display()))?;
        Ok(Resident::Actor { model, opt })
    }
}

impl Resident {
    fn opt(&self) -> &AdamW {
        match self {
            Resident::Actor { opt, .. } => opt,
            Resident::Critic(net) => &net.opt,
        }
    }

    fn opt_mut(&mut self) -> &mut AdamW {
        match self {
            Resident::Actor { opt, .. } => opt,
            Resident::Critic(net) => &mut net.opt,
        }
    }

    /// The trained variables (for the critic, network then value head; under LoRA the adapter's).
    fn vars(&self) -> Vec<(String, Var)> {
        match self {
            Resident::Actor { model, .. } => model.trainable_vars(),
            Resident::Critic(net) => net.vars(),
        }
    }

    fn weights(&self) -> Vec<(String, Tensor)> {
        self.vars()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().clone()))
            .collect()
    }
}

/// What a trainable role's worker is asked, whichever role's calls it came as
/// ([`super::actor_train::ActorTrainCall`], [`super::critic::CriticCall`]).
pub enum TrainOp {
    Init(Box<TrainInit>),
    /// Train on the step file `step`; write the new weights to `weights_out` when given.
    Step {
        step: PathBuf,
        weights_out: Option<PathBuf>,
    },
    /// The critic's values of the rows file `rows`, written to `out`.
    Values {
        rows: PathBuf,
        out: PathBuf,
    },
    /// Write the moments to `moments` and, when given, the weights to `weights`.
    Checkpoint {
        weights: Option<PathBuf>,
        moments: PathBuf,
    },
    Offload {
        path: PathBuf,
    },
    Reload {
        path: PathBuf,
    },
}

/// Serve actor_train or critic calls until the parent is gone.
pub fn serve<Req: RoleCall + Into<TrainOp>>(role: Role, calls: &Calls<Req>) {
    let mut base: Option<Base> = None;
    let mut resident: Option<Resident> = None;
    // AdamW steps taken, kept across offloads.
    let mut steps = 0;
    while let Some((id, request)) = calls.recv() {
        let phase = request.phase();
        let result = match (request.into(), &base, resident.as_mut()) {
            (TrainOp::Init(init), None, _) => load(role, &init).map(|(b, r)| {
                let params = r.vars().iter().map(|(_, v)| v.elem_count()).sum();
                steps = r.opt().steps_taken();
                (base, resident) = (Some(b), Some(r));
                Reply::Loaded { params }
            }),
            (TrainOp::Step { step, weights_out }, Some(b), Some(r)) => {
                train(b, r, &step, weights_out.as_deref())
                    .inspect(|_| steps = r.opt().steps_taken())
            }
            (TrainOp::Values { rows, out }, Some(b), Some(Resident::Critic(net))) => {
                values(b, net, &rows, &out).map(|bytes| Reply::Moved { bytes })
            }
            (TrainOp::Checkpoint { weights, moments }, Some(_), Some(r)) => {
                checkpoint(r, weights.as_deref(), &moments).map(|bytes| Reply::Moved { bytes })
            }
            (TrainOp::Offload { path }, Some(_), Some(r)) => {
                let tensors = r.opt().with_moments(r.weights());
                // In place over the last offload's copy: only this worker reads it, and a worker
                // that dies mid-write stops the run (the moments die with it), so a half-written
                // copy is never read.
                overwrite_tensors(&path, &tensors)
                    .map_err(err)
                    .map(|bytes| {
                        drop(tensors);
                        resident = None;
                        crate::allocator::release_freed_memory();
                        Reply::Moved { bytes }
                    })
            }
            (TrainOp::Reload { path }, Some(b), None) => {
                reload(b, &path, steps).map(|(r, bytes)| {
                    resident = Some(r);
                    Reply::Moved { bytes }
                })
            }
            (_, b, r) => Err(format!(
                "cannot '{phase}' while the {role} is {}",
                match (b, r) {
                    (None, _) => "not loaded",
                    (Some(_), None) => "offloaded",
                    (Some(_), Some(_)) => "loaded",
                }
            )),
        };
        calls.reply(id, result);
    }
}

fn load(role: Role, init: &TrainInit) -> Result<(Base, Resident), String> {
    let config =
        ModelConfig::from_hf_json(&init.model_config.to_string(), &format!("{role} init"))?;
    let base = Base {
        role,
        config,
        pad_id: init.pad_id,
        recipe: init.recipe.clone(),
        total_updates: init.total_updates,
        device: crate::device::open(init.device).map_err(err)?,
        lora: init
            .lora
            .as_ref()
            .map(|l| (l.settings.clone(), init.weights.clone())),
    };
    let mut tensors = read_tensors(&init.weights, &base.device).map_err(err)?;
    if let Some(lora) = &init.lora {
        tensors.extend(read_tensors(&lora.adapter, &base.device).map_err(err)?);
    }
    let mut resident = base.build(tensors.into_iter().collect(), &init.weights, None)?;
    if let Some(path) = &init.moments {
        let moments = load_moments(path, &base.device).map_err(err)?;
        resident
            .opt_mut()
            .restore(init.optimizer_steps, &moments)
            .map_err(|e| format!("restoring the optimizer from '{}': {e}", path.display()))?;
    }
    Ok((base, resident))
}

/// A frozen model's weights read back from the host copy at `path` onto `device` (a worker's
/// reload), with the bytes read.
pub(crate) fn reload_transformer(
    config: &ModelConfig,
    device: &Device,
    path: &Path,
) -> Result<(Transformer, u64), String> {
    let tensors = read_host_copy(path, device).map_err(err)?;
    let bytes = tensors.values().map(tensor_bytes).sum();
    let model = build_transformer(config, tensors.into_iter().collect(), path)?;
    Ok((model, bytes))
}

/// A frozen-model worker's state, for the error of a call it cannot take in it.
pub(crate) fn model_state<B, M>(base: &Option<B>, model: &Option<M>) -> &'static str {
    match (base, model) {
        (None, _) => "not loaded",
        (Some(_), None) => "offloaded",
        (Some(_), Some(_)) => "loaded",
    }
}

pub(crate) fn build_transformer(
    config: &ModelConfig,
    tensors: BTreeMap<String, Tensor>,
    origin: &Path,
) -> Result<Transformer, String> {
    let params = ParamStore::from_tensors(tensors)
        .map_err(|e| format!("host copy '{}': {e}", origin.display()))?;
    params
        .check_against(config, &origin.display().to_string())
        .map_err(err)?;
    Transformer::new(config.clone(), params).map_err(err)
}

fn train(
    base: &Base,
    r: &mut Resident,
    step: &Path,
    weights_out: Option<&Path>,
) -> Result<Reply, String> {
    let report = match r {
        Resident::Actor { model, opt } => {
            let inputs = read_actor(step, model.device())?;
            actor_epochs(&base.recipe, &inputs, model, base.pad_id, opt).map_err(err)?
        }
        Resident::Critic(net) => {
            let inputs = read_critic(step, net.model.device())?;
            ActorReport {
                metrics: critic_epochs(&base.recipe, &inputs, net, base.pad_id).map_err(err)?,
                ..Default::default()
            }
        }
    };
    if let Some(path) = weights_out {
        // In place over the last step's: the parent reads it only after this reply, and a worker
        // that dies mid-write stops the run.
        overwrite_tensors(path, &r.weights()).map_err(err)?;
    }
    Ok(Reply::Trained {
        metric_bits: report
            .metrics
            .into_iter()
            .map(|(k, v)| (k, v.to_bits()))
            .collect(),
        row_logp_bits: report
            .row_logps
            .into_iter()
            .map(|(row, v)| (row, v.to_bits()))
            .collect(),
        optimizer_steps: r.opt().steps_taken(),
    })
}

/// Score the rows in the file `rows`; write the (n, width) values to `out` as `values`.
fn values(base: &Base, net: &CriticNet, rows: &Path, out: &Path) -> Result<u64, String> {
    answer_rows(rows, out, |rows, _| {
        let values = net.row_values(base.pad_id, rows).map_err(err)?;
        Ok(vec![("values".to_string(), values)])
    })
}

/// A checkpoint's files: the moments, and the weights when asked. Returns bytes written.
fn checkpoint(r: &Resident, weights: Option<&Path>, moments: &Path) -> Result<u64, String> {
    save_moments(r.opt(), moments).map_err(err)?;
    let mut paths = vec![moments];
    if let Some(path) = weights {
        save_vars(&r.vars(), path).map_err(err)?;
        paths.push(path);
    }
    Ok(paths
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum())
}

/// Rebuild the network and its optimizer from an offload's host copy.
fn reload(base: &Base, path: &Path, steps: usize) -> Result<(Resident, u64), String> {
    // Read as variables on the CPU, so the network takes the tensors without copying them
    // again; onto another device they are copied there as they are read.
    let read = |path: &Path| {
        if base.device.is_cpu() {
            read_variables(path).map_err(err)
        } else {
            read_host_copy(path, &base.device).map_err(err)
        }
    };
    let mut tensors = read(path)?;
    // Under LoRA the offload wrote the adapter and its moments; the frozen base is where it was.
    if let Some((_, frozen)) = &base.lora {
        tensors.extend(read(frozen)?);
    }
    let mut moments: HashMap<String, Tensor> = tensors
        .extract_if(|k, _| MOMENT_PREFIXES.iter().any(|p| k.starts_with(p)))
        .collect();
    let bytes: u64 = tensors
        .values()
        .chain(moments.values())
        .map(tensor_bytes)
        .sum();
    let r = base.build(
        tensors.into_iter().collect(),
        path,
        Some((steps, &mut moments)),
    )?;
    Ok((r, bytes))
}

/// Restore an in-process trainable role (weights into `vars`, moments into `opt`) from its file in
/// the time-sharing host area, read into their own memory; bytes read.
pub(crate) fn restore_trainable(
    area: &HostArea,
    role: Role,
    vars: &[(String, Var)],
    opt: &AdamW,
) -> Result<u64, RunError> {
    let moments = opt.named_moments();
    let weights = vars.iter().map(|(name, v)| (name.as_str(), v.as_tensor()));
    let targets = weights.chain(moments.iter().map(|(name, t)| (name.as_str(), t)));
    area.read_into_tensors(role.as_str(), targets)
        .map_err(setup_err)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use candle_core::{Device, Tensor, Var};

    use super::restore_trainable;
    use crate::role::Role;
    use crate::scheduler::host_copy::HostArea;
    use crate::train::{AdamW, OptimizerConfig};

    fn t(values: &[f32]) -> Tensor {
        Tensor::from_slice(values, values.len(), &Device::Cpu).unwrap()
    }

    fn moments_of(opt: &AdamW) -> Vec<(Vec<f32>, Vec<f32>)> {
        let vec = |x: &Tensor| x.to_vec1::<f32>().unwrap();
        opt.state()
            .1
            .iter()
            .map(|(_, m, v)| (vec(m), vec(v)))
            .collect()
    }

    /// An in-process actor_train's reload puts back the weights and AdamW moments it offloaded,
    /// into the optimizer's own tensors (the state it steps from next), whatever happened between.
    #[test]
    fn an_in_process_reload_restores_the_offloaded_weights_and_moments() {
        let area = HostArea::new().unwrap();
        let w = Var::from_tensor(&t(&[1., 2., 3.])).unwrap();
        let vars = vec![("w".to_string(), w.clone())];
        let mut opt = AdamW::new(vars.clone(), OptimizerConfig::default(), 10).unwrap();
        let set_moments = |opt: &mut AdamW, m: &[f32], v: &[f32]| {
            let moments = BTreeMap::from([("w".to_string(), (t(m), t(v)))]);
            opt.restore(4, &moments).unwrap();
        };
        set_moments(&mut opt, &[0.1, 0.2, 0.3], &[0.01, 0.02, 0.03]);
        let weights = vec![("w".to_string(), w.as_tensor().clone())];
        let name = Role::ActorTrain.as_str();
        area.overwrite(name, &opt.with_moments(weights)).unwrap();

        // While offloaded, something else uses the memory.
        w.set(&t(&[0., 0., 0.])).unwrap();
        set_moments(&mut opt, &[9., 9., 9.], &[8., 8., 8.]);

        let bytes = restore_trainable(&area, Role::ActorTrain, &vars, &opt).unwrap();
        assert_eq!(bytes, 3 * 3 * 4);
        assert_eq!(w.to_vec1::<f32>().unwrap(), [1., 2., 3.]);
        assert_eq!(
            moments_of(&opt),
            [(vec![0.1, 0.2, 0.3], vec![0.01, 0.02, 0.03])]
        );
        assert_eq!(opt.steps_taken(), 4);
    }
}
