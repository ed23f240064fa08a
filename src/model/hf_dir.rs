//! Hugging Face model directories: `config.json`, `*.safetensors` (single or sharded),
//! `tokenizer.json` + `tokenizer_config.json`, `generation_config.json`.
//!
//! Loading checks every tensor name and shape against the config and reports all mismatches at once;
//! saving writes the same layout back so that HF transformers can load what we train.

use std::path::Path;

use candle_core::{DType, Device};

use super::LoadError;
use super::config::{Arch, ModelConfig};
use super::params::{ParamStore, read_safetensors_dir};
use super::tokenizer::{self, TokenizerFiles};
use super::transformer::Transformer;

/// A model ready to run: the network, its tokenizer and the token ids that end a generation.
pub struct LoadedModel {
    pub transformer: Transformer,
    pub tokenizer: TokenizerFiles,
    /// Union of generation_config.json, config.json and the tokenizer's eos token.
    pub eos_ids: Vec<u32>,
    /// Token used to fill padding positions (never attended to).
    pub pad_id: u32,
}

impl LoadedModel {
    pub fn config(&self) -> &ModelConfig {
        self.transformer.config()
    }

    /// The same model with a LoRA adapter attached (or none).
    pub fn with_lora(self, lora: Option<super::lora::LoraVars>) -> LoadedModel {
        LoadedModel {
            transformer: self.transformer.with_lora(lora),
            ..self
        }
    }

    /// The same model computing on `device` (itself where it is there already).
    pub fn to_device(self, device: &Device) -> Result<LoadedModel, LoadError> {
        if self.transformer.device().same_device(device) {
            return Ok(self);
        }
        let init = |e: candle_core::Error| LoadError::Move {
            device: crate::device::spec_of(device).to_string(),
            message: e.to_string(),
        };
        let params = self.transformer.params().to_device(device).map_err(init)?;
        let transformer =
            Transformer::new(self.transformer.config().clone(), params).map_err(init)?;
        Ok(LoadedModel {
            transformer,
            ..self
        })
    }
}

fn dtype_of(name: &str) -> DType {
    if name == "bfloat16" {
        DType::BF16
    } else {
        DType::F32
    }
}

/// The shape of the model in `dir` (its `config.json`), without reading any weights.
pub fn read_model_config(dir: &Path) -> Result<ModelConfig, LoadError> {
    if !dir.is_dir() {
        let message = if dir.exists() {
            "not a directory (a model directory holds config.json, tokenizer.json and \
             *.safetensors)"
        } else {
            "no such directory"
        };
        return Err(LoadError::Dir {
            path: dir.to_path_buf(),
            message: message.into(),
        });
    }
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|e| LoadError::io(&config_path, e))?;
    let origin = config_path.display().to_string();
    ModelConfig::from_hf_json(&text, &origin).map_err(|message| {
        // The error names the file once.
        let message = message
            .strip_prefix(&format!("config '{origin}': "))
            .map_or(message.clone(), str::to_string);
        LoadError::File {
            path: config_path.clone(),
            message,
        }
    })
}

/// Load `dir`. `dtype` overrides the stored dtype (e.g. train a bf16 checkpoint in f32).
pub fn load_model_dir(
    dir: &Path,
    dtype: Option<DType>,
    device: &Device,
) -> Result<LoadedModel, LoadError> {
    let cfg = read_model_config(dir)?;
    let dtype = dtype.unwrap_or_else(|| dtype_of(&cfg.torch_dtype));
    let mut tensors = read_safetensors_dir(dir, device)?;
    if cfg.tie_word_embeddings {
        tensors.remove("lm_head.weight");
    }
    tensors.retain(|name, _| !name.ends_with("rotary_emb.inv_freq"));
    let tensors = tensors
        .into_iter()
        .map(|(k, t)| Ok((k, t.to_dtype(dtype)?)))
        .collect::<candle_core::Result<_>>()
        .map_err(|e| LoadError::io(dir, e))?;
    let params = ParamStore::from_tensors(tensors).map_err(|e| LoadError::io(dir, e))?;
    params.check_against(&cfg, &dir.display().to_string())?;
    let tok = tokenizer::load_tokenizer_dir(dir)?;
    let vocab = tok.tokenizer.get_vocab_size(true);
    if vocab > cfg.vocab_size {
        return Err(LoadError::File {
            path: dir.join("tokenizer.json"),
            message: format!(
                "tokenizer has {vocab} tokens but config.json vocab_size is {}",
                cfg.vocab_size
            ),
        });
    }
    let mut eos_ids = tokenizer::read_generation_eos(dir)?;
    eos_ids.extend(cfg.eos_token_ids.iter().copied());
    if let Some(id) = tok
        .eos_token
        .as_deref()
        .and_then(|t| tok.tokenizer.token_to_id(t))
    {
        eos_ids.push(id);
    }
    eos_ids.sort_unstable();
    eos_ids.dedup();
    let pad_id = tok
        .pad_token
        .as_deref()
        .and_then(|t| tok.tokenizer.token_to_id(t))
        .or_else(|| eos_ids.first().copied())
        .unwrap_or(0);
    let transformer = Transformer::new(cfg, params).map_err(|e| LoadError::io(dir, e))?;
    Ok(LoadedModel {
        transformer,
        tokenizer: tok,
        eos_ids,
        pad_id,
    })
}

/// Write `model` as a HF directory, weights in `torch_dtype` of its config.
pub fn save_model_dir(dir: &Path, model: &LoadedModel) -> Result<(), LoadError> {
    std::fs::create_dir_all(dir).map_err(|e| LoadError::io(dir, e))?;
    let cfg = model.config();
    let write_json = |name: &str, value: &serde_json::Value| -> Result<(), LoadError> {
        let path = dir.join(name);
        let text = serde_json::to_string_pretty(value).map_err(|e| LoadError::io(&path, e))?;
        std::fs::write(&path, text).map_err(|e| LoadError::io(&path, e))
    };
    write_json("config.json", &cfg.to_hf_json())?;
    write_json(
        "generation_config.json",
        &serde_json::json!({ "bos_token_id": cfg.bos_token_id, "eos_token_id": model.eos_ids,
                             "pad_token_id": model.pad_id }),
    )?;
    // Write to a temporary name and rename, so a crash never leaves a truncated model.safetensors.
    let tmp = dir.join("model.safetensors.partial");
    model
        .transformer
        .params()
        .save_safetensors(&tmp, dtype_of(&cfg.torch_dtype))?;
    let final_path = dir.join("model.safetensors");
    // The weights are as readable as the directory's other files (the safetensors writer makes
    // its file private to its owner): a shared model directory is readable by the team.
    let config = dir.join("config.json");
    let mode = std::fs::metadata(&config)
        .map_err(|e| LoadError::io(&config, e))?
        .permissions();
    std::fs::set_permissions(&tmp, mode).map_err(|e| LoadError::io(&tmp, e))?;
    std::fs::rename(&tmp, &final_path).map_err(|e| LoadError::io(&final_path, e))?;
    tokenizer::save_tokenizer_dir(dir, &model.tokenizer)?;
    Ok(())
}

/// Shape options for a freshly initialised model.
#[derive(Debug, Clone)]
pub struct InitOptions {
    pub arch: Arch,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub intermediate: usize,
    pub head_dim: Option<usize>,
    pub tie_embeddings: bool,
    pub max_positions: usize,
    pub rope_theta: f64,
    /// Characters of the character-level tokenizer (one token each).
    pub chars: String,
    pub dtype: String,
    pub seed: u64,
}

/// Special tokens of our character-level tokenizer, ids 0, 1, 2.
pub const CHAR_SPECIALS: [&str; 3] = ["<pad>", "<eos>", "<unk>"];

/// Create a random-initialised model with a character-level tokenizer and save it to `dir`.
pub fn init_model_dir(dir: &Path, opts: &InitOptions) -> Result<LoadedModel, LoadError> {
    let model = init_model(opts)?;
    save_model_dir(dir, &model)?;
    Ok(model)
}

/// A random-initialised model with a character-level tokenizer (no download needed), in memory.
pub fn init_model(opts: &InitOptions) -> Result<LoadedModel, LoadError> {
    let tokenizer = tokenizer::build_char_tokenizer(&opts.chars, &CHAR_SPECIALS)?;
    let vocab = tokenizer.get_vocab_size(true);
    let cfg = ModelConfig {
        arch: opts.arch,
        vocab_size: vocab,
        hidden_size: opts.hidden,
        intermediate_size: opts.intermediate,
        num_hidden_layers: opts.layers,
        num_attention_heads: opts.heads,
        num_key_value_heads: opts.kv_heads,
        head_dim: opts.head_dim.unwrap_or(opts.hidden / opts.heads.max(1)),
        rope_theta: opts.rope_theta,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: opts.tie_embeddings,
        max_position_embeddings: opts.max_positions,
        bos_token_id: None,
        eos_token_ids: vec![1],
        torch_dtype: opts.dtype.clone(),
    };
    cfg.check().map_err(LoadError::Init)?;
    // Made in host memory; a caller that computes elsewhere moves it (`LoadedModel::to_device`).
    let params = ParamStore::init(
        &cfg,
        opts.seed,
        dtype_of(&cfg.torch_dtype),
        &crate::device::host(),
    )
    .map_err(|e| LoadError::Init(e.to_string()))?;
    let transformer = Transformer::new(cfg, params).map_err(|e| LoadError::Init(e.to_string()))?;
    let model = LoadedModel {
        transformer,
        tokenizer: TokenizerFiles {
            tokenizer,
            chat_template: None,
            bos_token: None,
            eos_token: Some(CHAR_SPECIALS[1].into()),
            pad_token: Some(CHAR_SPECIALS[0].into()),
        },
        eos_ids: vec![1],
        pad_id: 0,
    };
    Ok(model)
}

/// The options of the smallest model the tests run: a one-layer Qwen2 of hidden size 16 (2 heads,
/// 1 KV head, MLP 32, tied embeddings, f32) over the characters `chars`, drawn from `seed`.
#[cfg(test)]
pub(crate) fn tiny_test_options(chars: &str, max_positions: usize, seed: u64) -> InitOptions {
    InitOptions {
        arch: super::Arch::Qwen2,
        hidden: 16,
        layers: 1,
        heads: 2,
        kv_heads: 1,
        intermediate: 32,
        head_dim: None,
        tie_embeddings: true,
        max_positions,
        rope_theta: 10_000.0,
        chars: chars.into(),
        dtype: "float32".into(),
        seed,
    }
}

/// The model of [`tiny_test_options`].
#[cfg(test)]
pub(crate) fn tiny_test_model(chars: &str, max_positions: usize, seed: u64) -> LoadedModel {
    init_model(&tiny_test_options(chars, max_positions, seed)).expect("a tiny model")
}
