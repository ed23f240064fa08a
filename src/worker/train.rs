//! The actor_train role in a worker process: the policy's trainable weights and AdamW state, and
//! the actor's PPO epochs over each step's [`ActorStep`].
//!
//! The trainer's process prepares every step (rewards, reference log-probs, advantages, masks)
//! and hands the worker one shared-memory file; the worker trains and writes the new weights to
//! the host copy it is told, which the trainer reads back as its mirror of the policy (for weight
//! sync, reference refreshes and checkpoints). Offloading writes weights and moments to a host copy
//! and drops them, so the worker's memory is really freed until the reload.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::protocol::{Reply, Request};
use crate::config::RlConfig;
use crate::model::{ModelConfig, ParamStore, Transformer};
use crate::pipeline::rl_epochs::actor_epochs;
use crate::scheduler::host_copy::{read_tensors, write_tensors};
use crate::train::AdamW;
use crate::train::checkpoint::{load_moments, save_moments};

/// What to load: the policy's shape, its weights from the host copy `weights`, its optimizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainInit {
    /// The policy's config.json (Hugging Face layout).
    pub model_config: serde_json::Value,
    pub pad_id: u32,
    pub weights: PathBuf,
    pub rl: RlConfig,
    /// AdamW steps the learning-rate schedule spans.
    pub total_updates: usize,
    /// Resuming: the checkpoint's optimizer moments, and the AdamW steps taken before it.
    pub moments: Option<PathBuf>,
    pub optimizer_steps: usize,
}

/// Everything but the weights and moments: kept while offloaded.
struct Base {
    config: ModelConfig,
    pad_id: u32,
    rl: RlConfig,
    total_updates: usize,
}

struct Resident {
    model: Transformer,
    opt: AdamW,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Serve actor_train calls until the call channel closes. `reply` sends one answer to the parent.
pub fn serve(calls: &Receiver<(u64, Request)>, reply: &dyn Fn(u64, Result<Reply, String>)) {
    let mut base: Option<Base> = None;
    let mut resident: Option<Resident> = None;
    // AdamW steps taken, kept across offloads.
    let mut steps = 0;
    while let Ok((id, request)) = calls.recv() {
        let phase = request.phase();
        let result = match (request, &base, resident.as_mut()) {
            (Request::TrainInit(init), None, _) => load(&init).map(|(b, r)| {
                let params = r.model.params().num_params();
                steps = r.opt.steps_taken();
                (base, resident) = (Some(b), Some(r));
                Reply::Loaded { params }
            }),
            (Request::TrainStep { step, weights_out }, Some(b), Some(r)) => {
                train(b, r, &step, &weights_out).inspect(|_| steps = r.opt.steps_taken())
            }
            (Request::TrainMoments { path }, Some(_), Some(r)) => save_moments(&r.opt, &path)
                .map(|()| Reply::Moved {
                    bytes: std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0),
                })
                .map_err(err),
            (Request::Offload { path }, Some(_), Some(r)) => {
                let tensors = r.opt.with_moments(r.model.params().named_tensors());
                write_tensors(&path, &tensors).map_err(err).map(|bytes| {
                    resident = None;
                    Reply::Moved { bytes }
                })
            }
            (Request::Reload { path }, Some(b), None) => {
                reload(b, &path, steps).map(|(r, bytes)| {
                    resident = Some(r);
                    Reply::Moved { bytes }
                })
            }
            (_, b, r) => Err(format!(
                "cannot '{phase}' while the policy is {}",
                match (b, r) {
                    (None, _) => "not loaded",
                    (Some(_), None) => "offloaded",
                    (Some(_), Some(_)) => "loaded",
                }
            )),
        };
        reply(id, result);
    }
}

fn load(init: &TrainInit) -> Result<(Base, Resident), String> {
    let config = ModelConfig::from_hf_json(&init.model_config.to_string(), "actor_train init")?;
    let tensors = read_tensors(&init.weights, &Device::Cpu).map_err(err)?;
    let model = build_transformer(&config, tensors.into_iter().collect(), &init.weights)?;
    let mut opt = AdamW::new(
        model.params().named_vars(),
        init.rl.optimizer.clone(),
        init.total_updates,
    )
    .map_err(err)?;
    if let Some(path) = &init.moments {
        let moments = load_moments(path, &Device::Cpu).map_err(err)?;
        opt.restore(init.optimizer_steps, &moments)
            .map_err(|e| format!("restoring the optimizer from '{}': {e}", path.display()))?;
    }
    let base = Base {
        config,
        pad_id: init.pad_id,
        rl: init.rl.clone(),
        total_updates: init.total_updates,
    };
    Ok((base, Resident { model, opt }))
}

pub(super) fn build_transformer(
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

fn train(base: &Base, r: &mut Resident, step: &Path, weights_out: &Path) -> Result<Reply, String> {
    let inputs = crate::pipeline::actor_step_file::read(step, r.model.device())?;
    let metrics =
        actor_epochs(&base.rl, &inputs, &r.model, base.pad_id, &mut r.opt).map_err(err)?;
    write_tensors(weights_out, &r.model.params().named_tensors()).map_err(err)?;
    Ok(Reply::Trained {
        metric_bits: metrics.into_iter().map(|(k, v)| (k, v.to_bits())).collect(),
        optimizer_steps: r.opt.steps_taken(),
    })
}

/// Rebuild the policy and its optimizer from an offload's host copy.
fn reload(base: &Base, path: &Path, steps: usize) -> Result<(Resident, u64), String> {
    let mut tensors = read_tensors(path, &Device::Cpu).map_err(err)?;
    let moments: std::collections::HashMap<String, Tensor> = tensors
        .extract_if(|k, _| k.starts_with("adam_m.") || k.starts_with("adam_v."))
        .collect();
    let weight_bytes: u64 = tensors
        .values()
        .map(|t| (t.elem_count() * t.dtype().size_in_bytes()) as u64)
        .sum();
    let model = build_transformer(&base.config, tensors.into_iter().collect(), path)?;
    let mut opt = AdamW::new(
        model.params().named_vars(),
        base.rl.optimizer.clone(),
        base.total_updates,
    )
    .map_err(err)?;
    let mut moments = moments;
    let moment_bytes = opt
        .take_moments(steps, &mut moments)
        .map_err(|e| format!("host copy '{}': {e}", path.display()))?;
    Ok((Resident { model, opt }, weight_bytes + moment_bytes))
}
