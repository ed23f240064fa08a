//! Decoder-only transformer models: shapes, parameters, forward pass, KV cache, tokenizers, and
//! Hugging Face directories in and out.
//!
//! Owns everything needed to turn token ids into logits. It must not know about sampling, training
//! loops or RL: those live in `rollout`, `train` and `algo`.

mod attention;
pub mod chat_template;
pub mod config;
pub mod hf_dir;
pub mod kv_cache;
mod layer_grad;
pub mod lora;
pub mod packing;
pub mod params;
pub mod tape;
pub mod threads;
pub mod tokenizer;
pub mod transformer;

use std::path::{Path, PathBuf};

pub use config::{Arch, ModelConfig};
pub use hf_dir::{
    InitOptions, LoadedModel, init_model, init_model_dir, load_model_dir, read_model_config,
    save_model_dir,
};
pub use kv_cache::KvCache;
pub use params::ParamStore;
pub use tape::Tape;
pub use transformer::{Numerics, Transformer, attention_mask};

/// The first few of `problems`, one per line, and how many more there are: a mismatched config
/// makes one problem per tensor, and a 38-line error hides the one line that explains it.
fn first_of(problems: &[String]) -> String {
    const SHOWN: usize = 4;
    let mut lines: Vec<String> = problems.iter().take(SHOWN).cloned().collect();
    if problems.len() > SHOWN {
        lines.push(format!("… and {} more", problems.len() - SHOWN));
    }
    lines.join("\n  ")
}

/// Why a model directory could not be read or written. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("model file '{}': {message}", path.display())]
    File { path: PathBuf, message: String },
    /// The model directory itself is missing or not a directory.
    #[error("model directory '{}': {message}", path.display())]
    Dir { path: PathBuf, message: String },
    #[error(
        "model weights in '{origin}' do not match its config.json:\n  {}",
        first_of(problems)
    )]
    Weights {
        origin: String,
        problems: Vec<String>,
    },
    /// (Its text names the tokenizer file already.)
    #[error("{0}")]
    Tokenizer(#[from] tokenizer::TokenizerError),
    /// A model made from a config's `model.init` (or `roll-tui model init`) rather than read from
    /// files: the problem is in those settings.
    #[error("model.init: {0}")]
    Init(String),
    /// Copying the weights to the device a role computes on failed (out of memory, mostly).
    #[error("moving the model to {device}: {message}")]
    Move { device: String, message: String },
}

impl LoadError {
    pub fn io(path: &Path, e: impl std::fmt::Display) -> Self {
        LoadError::File {
            path: path.to_path_buf(),
            message: e.to_string(),
        }
    }
}
