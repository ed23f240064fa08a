//! Checkpoints: a loadable Hugging Face directory plus the optimizer moments and trainer position.
//!
//! Layout of `DIR`: the HF files (config.json, model.safetensors, tokenizer*), `optimizer.safetensors`
//! (AdamW first/second moments as `<param>.m` / `<param>.v`), and `trainer_state.json`. A checkpoint is
//! written to `DIR.partial` and renamed into place, so a crash never leaves a half-written one. All
//! randomness is derived from (seed, step), so the step is the whole RNG state.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::optim::AdamW;
use crate::model::{LoadError, LoadedModel, save_model_dir};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// "sft" or "rl".
    pub stage: String,
    /// Optimizer steps completed in this stage.
    pub step: usize,
    pub seed: u64,
    /// Hash of the resolved run config the checkpoint belongs to.
    pub config_hash: String,
}

/// Write model, optimizer and trainer state to `dir` atomically (replacing an older checkpoint there).
pub fn save_checkpoint(
    dir: &Path,
    model: &LoadedModel,
    opt: &AdamW,
    state: &TrainerState,
) -> Result<u64, LoadError> {
    let partial = PathBuf::from(format!("{}.partial", dir.display()));
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(|e| LoadError::io(&partial, e))?;
    }
    save_model_dir(&partial, model)?;
    let (_, moments) = opt.state();
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for (name, m, v) in moments {
        tensors.insert(format!("{name}.m"), m);
        tensors.insert(format!("{name}.v"), v);
    }
    let opt_path = partial.join("optimizer.safetensors");
    candle_core::safetensors::save(&tensors, &opt_path).map_err(|e| LoadError::io(&opt_path, e))?;
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
    let opt_path = dir.join("optimizer.safetensors");
    let tensors =
        candle_core::safetensors::load(&opt_path, device).map_err(|e| LoadError::File {
            path: opt_path.clone(),
            message: format!("unreadable ({e})"),
        })?;
    let mut moments = BTreeMap::new();
    for (name, m) in &tensors {
        if let Some(param) = name.strip_suffix(".m") {
            let v = tensors
                .get(&format!("{param}.v"))
                .ok_or_else(|| LoadError::File {
                    path: opt_path.clone(),
                    message: format!("moment '{param}.v' is missing"),
                })?;
            moments.insert(param.to_string(), (m.clone(), v.clone()));
        }
    }
    Ok((state, moments))
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
    use crate::model::{Arch, InitOptions, init_model, load_model_dir};
    use crate::train::{GradAccumulator, OptimizerConfig};

    #[test]
    fn checkpoint_round_trips_model_optimizer_and_state() {
        let model = init_model(&InitOptions {
            arch: Arch::Llama,
            hidden: 16,
            layers: 1,
            heads: 2,
            kv_heads: 1,
            intermediate: 32,
            head_dim: None,
            tie_embeddings: false,
            max_positions: 16,
            rope_theta: 10_000.0,
            chars: "abc".into(),
            dtype: "float32".into(),
            seed: 9,
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
        acc.add(&vars, &loss.backward().unwrap()).unwrap();
        opt.step(acc).unwrap();

        let dir = tempfile::tempdir().unwrap();
        let ckpt = dir.path().join("sft-step1");
        let state = TrainerState {
            stage: "sft".into(),
            step: 1,
            seed: 9,
            config_hash: "abc".into(),
        };
        assert!(save_checkpoint(&ckpt, &model, &opt, &state).unwrap() > 0);
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
