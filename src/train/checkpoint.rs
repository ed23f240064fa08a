//! Checkpoints: a loadable Hugging Face directory plus the optimizer moments and trainer position.
//!
//! Layout of `DIR`: the HF files (config.json, model.safetensors, tokenizer*), `optimizer.safetensors`
//! (AdamW first/second moments as `<param>.m` / `<param>.v`), and `trainer_state.json`. A checkpoint is
//! written to `DIR.partial` and renamed into place, so a crash never leaves a half-written one. All
//! sampling randomness is derived from (seed, stage, step), so the step is the whole RNG state; the data
//! cursor, KL controller and running reward statistics are stored in `trainer_state.json`, and a critic
//! (when there is one) in `critic.safetensors` + `critic_optimizer.safetensors`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor, Var};
use serde::{Deserialize, Serialize};

use super::optim::AdamW;
use crate::algo::normalize::RunningStats;
use crate::data::mix::MixerState;
use crate::model::{LoadError, LoadedModel, save_model_dir};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// The stage's name (`names::Stage::as_str`): "sft", "distill", "dpo" or "rl".
    pub stage: String,
    /// Optimizer steps completed in this stage.
    pub step: usize,
    pub seed: u64,
    /// Hash of the resolved run config the checkpoint belongs to.
    pub config_hash: String,
    /// AdamW steps taken (an RL step may take several: PPO epochs x mini-batches).
    #[serde(default)]
    pub optimizer_steps: usize,
    /// Seconds since the run started, so a resumed run's wall time continues.
    #[serde(default)]
    pub wall_time: f64,
    /// The data cursor; absent in checkpoints written before resume existed.
    #[serde(default)]
    pub mixer: Option<MixerState>,
    #[serde(default)]
    pub rl: Option<RlResumeState>,
}

/// What an RL stage carries from step to step besides weights and optimizer moments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RlResumeState {
    pub kl_coef: f64,
    pub running_reward: RunningStats,
    /// AdamW steps of the critic, when there is one.
    pub critic_optimizer_steps: Option<usize>,
}

/// Where a checkpoint's optimizer moments come from: an [`AdamW`] in this process, or one in a
/// worker process that writes them itself.
pub trait OptimizerState {
    fn steps_taken(&self) -> usize;
    /// Write the moments as [`save_moments`] does.
    fn save_moments(&self, path: &Path) -> Result<(), LoadError>;
}

impl OptimizerState for AdamW {
    fn steps_taken(&self) -> usize {
        AdamW::steps_taken(self)
    }

    fn save_moments(&self, path: &Path) -> Result<(), LoadError> {
        save_moments(self, path)
    }
}

/// Extra files a stage adds to its checkpoint directory (written before the atomic rename).
pub type ExtraFiles<'a> = &'a dyn Fn(&Path) -> Result<(), LoadError>;

/// Write model, optimizer and trainer state to `dir` atomically (replacing an older checkpoint there).
pub fn save_checkpoint(
    dir: &Path,
    model: &LoadedModel,
    opt: &dyn OptimizerState,
    state: &TrainerState,
    extra: Option<ExtraFiles<'_>>,
) -> Result<u64, LoadError> {
    let partial = PathBuf::from(format!("{}.partial", dir.display()));
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(|e| LoadError::io(&partial, e))?;
    }
    // A LoRA run checkpoints its adapter (PEFT's format) and not the frozen base: the directory
    // is then what PEFT loads beside the base, and `roll-tui model merge` merges.
    match model.transformer.lora() {
        Some(lora) => lora.to_adapter().save(&partial, &lora.base_model)?,
        None => save_model_dir(&partial, model)?,
    }
    opt.save_moments(&partial.join("optimizer.safetensors"))?;
    if let Some(extra) = extra {
        extra(&partial)?;
    }
    let state_path = partial.join("trainer_state.json");
    let text = serde_json::to_string_pretty(state).map_err(|e| LoadError::io(&state_path, e))?;
    std::fs::write(&state_path, text).map_err(|e| LoadError::io(&state_path, e))?;
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| LoadError::io(dir, e))?;
    }
    std::fs::rename(&partial, dir).map_err(|e| LoadError::io(dir, e))?;
    Ok(dir_bytes(dir))
}

/// Read `trainer_state.json` and the optimizer moments of a checkpoint directory.
#[allow(clippy::type_complexity)]
pub fn load_trainer_state(
    dir: &Path,
    device: &Device,
) -> Result<(TrainerState, BTreeMap<String, (Tensor, Tensor)>), LoadError> {
    let state_path = dir.join("trainer_state.json");
    let text = std::fs::read_to_string(&state_path).map_err(|e| LoadError::io(&state_path, e))?;
    let state: TrainerState = serde_json::from_str(&text).map_err(|e| LoadError::File {
        path: state_path.clone(),
        message: format!("invalid trainer state ({e})"),
    })?;
    let moments = load_moments(&dir.join("optimizer.safetensors"), device)?;
    Ok((state, moments))
}

/// Write an optimizer's first and second moments as `<param>.m` / `<param>.v`.
pub fn save_moments(opt: &AdamW, path: &Path) -> Result<(), LoadError> {
    let (_, moments) = opt.state();
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for (name, m, v) in moments {
        tensors.insert(format!("{name}.m"), m);
        tensors.insert(format!("{name}.v"), v);
    }
    candle_core::safetensors::save(&tensors, path).map_err(|e| LoadError::io(path, e))
}

/// Read what [`save_moments`] wrote.
pub fn load_moments(
    opt_path: &Path,
    device: &Device,
) -> Result<BTreeMap<String, (Tensor, Tensor)>, LoadError> {
    let tensors =
        candle_core::safetensors::load(opt_path, device).map_err(|e| LoadError::File {
            path: opt_path.to_path_buf(),
            message: format!("unreadable ({e})"),
        })?;
    let mut moments = BTreeMap::new();
    for (name, m) in &tensors {
        if let Some(param) = name.strip_suffix(".m") {
            let v = tensors
                .get(&format!("{param}.v"))
                .ok_or_else(|| LoadError::File {
                    path: opt_path.to_path_buf(),
                    message: format!("moment '{param}.v' is missing"),
                })?;
            moments.insert(param.to_string(), (m.clone(), v.clone()));
        }
    }
    Ok(moments)
}

/// Write named variables (e.g. a critic's network and value head) to one safetensors file.
pub fn save_vars(vars: &[(String, Var)], path: &Path) -> Result<(), LoadError> {
    let map: HashMap<String, Tensor> = vars
        .iter()
        .map(|(n, v)| (n.clone(), v.as_tensor().clone()))
        .collect();
    candle_core::safetensors::save(&map, path).map_err(|e| LoadError::io(path, e))
}

/// Set every variable from the file [`save_vars`] wrote; a missing tensor or a shape mismatch is an
/// error naming it.
pub fn load_vars(vars: &[(String, Var)], path: &Path) -> Result<(), LoadError> {
    let device = vars
        .first()
        .map(|(_, v)| v.device().clone())
        .unwrap_or_else(crate::device::host);
    let tensors = candle_core::safetensors::load(path, &device).map_err(|e| LoadError::File {
        path: path.to_path_buf(),
        message: format!("unreadable ({e})"),
    })?;
    for (name, var) in vars {
        let bad = |message: String| LoadError::File {
            path: path.to_path_buf(),
            message,
        };
        let t = tensors
            .get(name)
            .ok_or_else(|| bad(format!("tensor '{name}' is missing")))?;
        if t.dims() != var.dims() {
            return Err(bad(format!(
                "tensor '{name}' has shape {:?}, expected {:?}",
                t.dims(),
                var.dims()
            )));
        }
        var.set(&t.to_dtype(var.dtype()).map_err(|e| bad(e.to_string()))?)
            .map_err(|e| bad(e.to_string()))?;
    }
    Ok(())
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::hf_dir::tiny_test_options;
    use crate::model::{Arch, InitOptions, init_model, load_model_dir};
    use crate::train::{GradAccumulator, OptimizerConfig};

    #[test]
    fn trainer_state_floats_round_trip_bit_exactly() {
        // xorshift64 over raw bit patterns: every exponent range, not just "nice" numbers. serde_json's
        // default parser may round 17-digit numbers twice; its float_roundtrip feature (on) is exact.
        let mut x = 0x1234_5678_9abc_def0u64;
        let mut checked = 0;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = f64::from_bits(x);
            if !v.is_finite() {
                continue;
            }
            let s = RlResumeState {
                kl_coef: v,
                running_reward: RunningStats::new(),
                critic_optimizer_steps: None,
            };
            let back: RlResumeState =
                serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
            assert_eq!(back.kl_coef.to_bits(), v.to_bits(), "{v:e}");
            checked += 1;
        }
        assert!(checked > 19_000);
    }

    #[test]
    fn checkpoint_round_trips_model_optimizer_and_state() {
        // A Llama with its own lm_head, to round-trip the untied head too.
        let model = init_model(&InitOptions {
            arch: Arch::Llama,
            tie_embeddings: false,
            ..tiny_test_options("abc", 16, 9)
        })
        .unwrap();
        let vars = model.transformer.params().named_vars();
        let mut opt = AdamW::new(vars.clone(), OptimizerConfig::default(), 10).unwrap();
        // One real step so the moments are non-zero.
        let loss = model
            .transformer
            .params()
            .tensor("lm_head.weight")
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap();
        let mut acc = GradAccumulator::default();
        acc.add(&vars, loss.backward().unwrap()).unwrap();
        opt.step(acc).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let ckpt = dir.path().join("sft-step1");
        let state = TrainerState {
            stage: "sft".into(),
            step: 1,
            seed: 9,
            config_hash: "abc".into(),
            optimizer_steps: 1,
            wall_time: 2.5,
            mixer: None,
            rl: None,
        };
        assert!(save_checkpoint(&ckpt, &model, &opt, &state, None).unwrap() > 0);
        assert!(!dir.path().join("sft-step1.partial").exists());

        let (back, moments) = load_trainer_state(&ckpt, &Device::Cpu).unwrap();
        assert_eq!(back, state);
        let reloaded = load_model_dir(&ckpt, None, &Device::Cpu).unwrap();
        let mut opt2 = AdamW::new(
            reloaded.transformer.params().named_vars(),
            OptimizerConfig::default(),
            10,
        )
        .unwrap();
        opt2.restore(back.step, &moments).unwrap();
        assert_eq!(opt2.steps_taken(), 1);
        let (_, a) = opt.state();
        let (_, b) = opt2.state();
        for ((n1, m1, v1), (n2, m2, v2)) in a.iter().zip(&b) {
            assert_eq!(n1, n2);
            assert_eq!(
                m1.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                m2.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                "{n1}"
            );
            assert_eq!(
                v1.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                v2.flatten_all().unwrap().to_vec1::<f32>().unwrap()
            );
        }
        let w1 = model
            .transformer
            .params()
            .tensor("lm_head.weight")
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        let w2 = reloaded
            .transformer
            .params()
            .tensor("lm_head.weight")
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(w1, w2);
    }
}
