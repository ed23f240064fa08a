//! roll: the engine behind the `roll-tui` binary — reinforcement-learning post-training of language models.
//!
//! Module map (see DESIGN.md in the project's shared notes):
//! - [`config`]: strict YAML run configs, `key.sub=value` overrides, validation that reports every problem.
//! - [`model`]: decoder-only transformers (Qwen2/Qwen2.5/Qwen3/Llama shapes) built from differentiable ops,
//!   Hugging Face directory loading/saving, tokenizers and chat templates.
//! - [`rollout`]: sampling, batched generation with an explicit KV cache, continuous-batching engine.
//! - [`train`]: per-token log-probs and entropy, AdamW with schedules, gradient clipping, checkpoints.
//! - [`algo`]: pure RL math on tensors — advantages, KL, policy losses, aggregation, masks, filters.
//! - [`reward`]: rule rewards (math answer, exact match).
//! - [`data`]: JSONL prompt datasets, domain mixing, synthetic quickstart tasks.
//! - [`metrics`]: metric sinks (JSONL for now).
//! - [`pipeline`]: SFT and RLVR pipelines as plain sequential code.
//! - [`headless`]: the `roll-tui run` front-end (progress bar, per-step summaries).
//! - [`cli`]: command-line definitions and dispatch.
//!
//! Nothing here imports a front-end; front-ends only call into these modules.

pub mod algo;
pub mod cli;
pub mod config;
pub mod data;
pub mod headless;
pub mod metrics;
pub mod model;
pub mod pipeline;
pub mod reward;
pub mod rollout;
pub mod train;
