//! roll: the engine behind the `roll-tui` binary — reinforcement-learning post-training of language models.
//!
//! Module map (architecture and layers: docs/DESIGN.md):
//! - [`config`]: strict YAML run configs, `key.sub=value` overrides, validation that reports every problem.
//! - [`device`]: the device seam: config devices to candle devices, device memory, which kernels run.
//! - [`model`]: decoder-only transformers (Qwen2/Qwen2.5/Qwen3/Llama shapes) built from differentiable ops,
//!   Hugging Face directory loading/saving, tokenizers and chat templates.
//! - [`parity`]: one model's numerics on two devices or kernel sets, compared (tests, `devices --check`).
//! - [`rollout`]: sampling, batched generation with an explicit KV cache, continuous-batching engine
//!   (in lanes on the CPU: a small model's batch split across the threads).
//! - [`train`]: per-token log-probs and entropy, AdamW with schedules, gradient clipping, checkpoints.
//! - [`algo`]: pure RL math on tensors — advantages, KL, policy losses, aggregation, masks, filters,
//!   and the fused CPU kernel of per-token log-probs and entropy.
//! - [`reward`]: reward kinds (math rule and Math-Verify, exact match, code in the sandbox, IFEval,
//!   regex, LLM judge) and a domain's reward spec.
//! - [`data`]: JSONL prompt datasets, domain mixing, synthetic quickstart tasks.
//! - [`env`]: environments for agentic RL (FrozenLake, Sokoban, WebShop, external programs), the
//!   action parser and format penalty, replay of recorded episodes.
//! - [`debugger`]: the env debugger: one episode turn by turn (human, random or model policy), undo,
//!   fork, resample, stored episodes opened at a turn, sessions saved as trajectories.
//! - [`names`]: the names every layer shares (stages, roles, phases, an offload or reload's record);
//!   they import nothing from the crate, so the store sits below the config and the scheduler.
//! - [`metrics`]: the shapes of metrics, samples and checkpoints, and the sink trait pipelines write to.
//! - [`store`]: the SQLite experiment store (runs, metric series, samples, trajectories, events).
//! - [`role`]: each role's handle, typed calls and computation, in this process or a worker process.
//! - [`pipeline`]: the stages (SFT, distillation, DPO, RLVR, agentic RL, on-policy distillation) as
//!   plain sequential code over role handles.
//! - [`scheduler`]: placement, the residency ledger and offload/reload, sample-level rollout.
//! - [`plot`]: export a run's metric series as PNG/SVG line charts and a long-format CSV.
//! - [`health`]: run-health rules (stalls, failed workers, entropy collapse, all-equal reward groups,
//!   memory creep), evaluated from a run's events and series, live or from the store.
//! - [`text`]: text made safe for a terminal, units, and did-you-mean suggestions.
//! - [`sandbox`]: running untrusted programs (model-written code) in bubblewrap with rlimits.
//! - [`seed`]: deterministic seed mixing (every random choice is a function of seeds, never timing).
//! - [`smoothing`]: the EMA that the workbench and exported plots draw over raw series.
//! - [`allocator`]: mimalloc's settings: freed memory kept for reuse, given back on offload.
//! - [`launch`]: starting and resuming runs recorded in the store (shared by every front-end).
//! - [`headless`]: the `roll-tui run` front-end (progress bar, per-step summaries).
//! - [`worker`]: worker processes (`roll-tui worker ROLE`): the transport (control protocol, spawn,
//!   supervision); what a call means belongs to [`role`].
//! - [`tui`]: the interactive workbench (`roll-tui` with no arguments), a front-end over the store.
//! - [`cli`]: command-line definitions and dispatch.
//!
//! Nothing here but [`cli`] imports a front-end; front-ends only call into these modules.

pub mod algo;
pub mod allocator;
pub mod cli;
pub mod config;
pub mod data;
pub mod debugger;
pub mod device;
pub mod env;
pub mod headless;
pub mod health;
pub mod launch;
pub mod metrics;
pub mod model;
pub mod names;
pub mod parity;
pub mod pipeline;
pub mod plot;
pub mod reward;
pub mod role;
pub mod rollout;
pub mod sandbox;
pub mod scheduler;
pub mod seed;
pub mod smoothing;
pub mod store;
pub mod text;
pub mod train;
pub mod tui;
pub mod worker;
