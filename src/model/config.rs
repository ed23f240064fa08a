//! The model's shape, read from and written to a Hugging Face `config.json`.
//!
//! Owns the mapping between HF's per-architecture config conventions (qwen2, qwen3, llama) and one
//! [`ModelConfig`]; it must not know about weights or files other than `config.json`.

use serde::{Deserialize, Serialize};

/// The decoder-only architectures we build. They differ only in biases and norms:
/// qwen2 has q/k/v biases, qwen3 has per-head q/k RMSNorm and no biases, llama has neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    Qwen2,
    Qwen3,
    Llama,
}

impl Arch {
    /// HF `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Llama => "llama",
        }
    }

    /// HF `architectures[0]`.
    pub fn hf_class(self) -> &'static str {
        match self {
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
            Arch::Llama => "LlamaForCausalLM",
        }
    }

    pub fn from_model_type(model_type: &str) -> Option<Arch> {
        match model_type {
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "llama" => Some(Arch::Llama),
            _ => None,
        }
    }

    pub fn qkv_bias(self) -> bool {
        matches!(self, Arch::Qwen2)
    }

    pub fn qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3)
    }
}

/// Everything that determines tensor shapes and numerics of the transformer.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    /// "float32" or "bfloat16": the dtype the weights are stored in.
    pub torch_dtype: String,
}

/// The subset of HF's config.json we read; unknown keys are normal in HF configs and are ignored.
#[derive(Debug, Deserialize)]
struct HfConfigIn {
    model_type: String,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rope_theta: Option<f64>,
    rms_norm_eps: Option<f64>,
    tie_word_embeddings: Option<bool>,
    max_position_embeddings: Option<usize>,
    bos_token_id: Option<u32>,
    eos_token_id: Option<EosIds>,
    torch_dtype: Option<String>,
    hidden_act: Option<String>,
    attention_bias: Option<bool>,
    rope_scaling: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize, Serialize, Clone)]
#[serde(untagged)]
enum EosIds {
    One(u32),
    Many(Vec<u32>),
}

impl ModelConfig {
    /// Parse HF `config.json` text; `origin` names the file in errors.
    pub fn from_hf_json(text: &str, origin: &str) -> Result<ModelConfig, String> {
        let raw: HfConfigIn = serde_json::from_str(text)
            .map_err(|e| format!("config '{origin}': invalid JSON: {e}"))?;
        let arch = Arch::from_model_type(&raw.model_type).ok_or_else(|| {
            format!(
                "config '{origin}': unsupported model_type '{}' (supported: qwen2, qwen3, llama)",
                raw.model_type
            )
        })?;
        if let Some(act) = &raw.hidden_act
            && act != "silu"
        {
            return Err(format!(
                "config '{origin}': unsupported hidden_act '{act}' (only 'silu')"
            ));
        }
        if let Some(scaling) = &raw.rope_scaling
            && !scaling.is_null()
        {
            return Err(format!(
                "config '{origin}': rope_scaling {scaling} is not supported yet"
            ));
        }
        if arch == Arch::Llama && raw.attention_bias == Some(true) {
            return Err(format!(
                "config '{origin}': llama with attention_bias=true is not supported"
            ));
        }
        let heads = raw.num_attention_heads;
        let kv_heads = raw.num_key_value_heads.unwrap_or(heads);
        let head_dim = raw.head_dim.unwrap_or(raw.hidden_size / heads.max(1));
        let cfg = ModelConfig {
            arch,
            vocab_size: raw.vocab_size,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            head_dim,
            rope_theta: raw.rope_theta.unwrap_or(10_000.0),
            rms_norm_eps: raw.rms_norm_eps.unwrap_or(1e-6),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(4096),
            bos_token_id: raw.bos_token_id,
            eos_token_ids: match raw.eos_token_id {
                None => vec![],
                Some(EosIds::One(id)) => vec![id],
                Some(EosIds::Many(ids)) => ids,
            },
            torch_dtype: raw.torch_dtype.unwrap_or_else(|| "float32".into()),
        };
        cfg.check().map_err(|e| format!("config '{origin}': {e}"))?;
        Ok(cfg)
    }

    /// Shape invariants the transformer relies on.
    pub fn check(&self) -> Result<(), String> {
        let mut problems = vec![];
        if self.vocab_size == 0 || self.hidden_size == 0 || self.num_hidden_layers == 0 {
            problems
                .push("vocab_size, hidden_size and num_hidden_layers must be positive".to_string());
        }
        if self.num_attention_heads == 0 || self.num_key_value_heads == 0 {
            problems.push("num_attention_heads and num_key_value_heads must be positive".into());
        } else if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            problems.push(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            problems.push(format!(
                "head_dim ({}) must be even and positive",
                self.head_dim
            ));
        }
        if !matches!(self.torch_dtype.as_str(), "float32" | "bfloat16") {
            problems.push(format!(
                "torch_dtype '{}' is not supported (float32, bfloat16)",
                self.torch_dtype
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    /// HF `config.json` for this shape, loadable by `AutoModelForCausalLM`.
    pub fn to_hf_json(&self) -> serde_json::Value {
        let eos = match self.eos_token_ids.as_slice() {
            [] => serde_json::Value::Null,
            [one] => serde_json::json!(one),
            many => serde_json::json!(many),
        };
        let mut v = serde_json::json!({
            "architectures": [self.arch.hf_class()],
            "model_type": self.arch.model_type(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_theta": self.rope_theta,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "torch_dtype": self.torch_dtype,
            "initializer_range": 0.02,
            "attention_dropout": 0.0,
            "use_cache": true,
        });
        if let Some(obj) = v.as_object_mut() {
            match self.arch {
                Arch::Qwen2 => {
                    obj.insert("use_sliding_window".into(), false.into());
                    obj.insert("max_window_layers".into(), self.num_hidden_layers.into());
                }
                Arch::Qwen3 => {
                    obj.insert("attention_bias".into(), false.into());
                    obj.insert("use_sliding_window".into(), false.into());
                }
                Arch::Llama => {
                    obj.insert("attention_bias".into(), false.into());
                    obj.insert("mlp_bias".into(), false.into());
                }
            }
        }
        v
    }

    pub fn kv_groups(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A tiny config for unit tests anywhere in the crate.
    pub(crate) fn tiny(arch: Arch) -> ModelConfig {
        ModelConfig {
            arch,
            vocab_size: 24,
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 16,
            rope_theta: 10_000.0,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: true,
            max_position_embeddings: 256,
            bos_token_id: Some(1),
            eos_token_ids: vec![2],
            torch_dtype: "float32".into(),
        }
    }

    #[test]
    fn hf_json_round_trips_for_every_arch() {
        for arch in [Arch::Qwen2, Arch::Qwen3, Arch::Llama] {
            let cfg = tiny(arch);
            let text = cfg.to_hf_json().to_string();
            assert_eq!(ModelConfig::from_hf_json(&text, "x").unwrap(), cfg);
        }
    }

    #[test]
    fn head_dim_defaults_to_hidden_over_heads_and_eos_list_is_read() {
        let text = r#"{"model_type":"qwen2","vocab_size":10,"hidden_size":64,"intermediate_size":8,
            "num_hidden_layers":1,"num_attention_heads":4,"eos_token_id":[3,4]}"#;
        let cfg = ModelConfig::from_hf_json(text, "c.json").unwrap();
        assert_eq!(cfg.head_dim, 16);
        assert_eq!(cfg.num_key_value_heads, 4);
        assert_eq!(cfg.eos_token_ids, vec![3, 4]);
    }

    #[test]
    fn bad_configs_name_the_file_and_problem() {
        let text = r#"{"model_type":"gpt2","vocab_size":10,"hidden_size":64,"intermediate_size":8,
            "num_hidden_layers":1,"num_attention_heads":4}"#;
        let err = ModelConfig::from_hf_json(text, "m/config.json").unwrap_err();
        assert!(
            err.contains("m/config.json") && err.contains("'gpt2'"),
            "{err}"
        );
        let text = r#"{"model_type":"qwen2","vocab_size":10,"hidden_size":64,"intermediate_size":8,
            "num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":3}"#;
        let err = ModelConfig::from_hf_json(text, "c").unwrap_err();
        assert!(err.contains("multiple of num_key_value_heads"), "{err}");
    }
}
