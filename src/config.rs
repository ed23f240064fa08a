//! Run configuration: the YAML schema of `roll-tui run CONFIG`, read strictly.
//!
//! Owns the schema ([`RunConfig`] and its sections), defaults, and cross-field validation; the generic
//! strict-YAML machinery (line numbers, did-you-mean, `key.sub=value` overrides) is in [`load`]. Every
//! field here is read by a pipeline; docs/configs.md documents them. A dataset's relative path is relative to the
//! directory of the file that writes it (the config, or an included fragment); every other relative
//! path to the working directory.

mod cluster;
mod devices;
mod distill;
mod dpo;
mod env;
mod include;
pub mod load;
mod opd;
pub mod overrides;
mod rl_eval;
mod stage;
pub mod workers;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::algo::advantage::AdvantageEstimator;
use crate::algo::kl::{KlControllerKind, KlEstimator, KlMode};
use crate::algo::loss::PolicyLossParams;
use crate::algo::normalize::RewardNorm;
use crate::model::Arch;
use crate::model::chat_template::TemplateOptions;
pub use crate::names::Role;
pub use crate::names::Stage;
use crate::reward::RewardSpec;
use crate::rollout::SamplingParams;
use crate::train::OptimizerConfig;
pub use cluster::{ClusterConfig, Launcher};
pub use devices::{DeviceKind, DevicesConfig, Kernels};
pub use distill::DistillConfig;
pub use dpo::{DpoConfig, DpoEvalConfig};
pub use env::{EnvConfig, EnvMode};
pub use load::{ConfigError, Validate};
pub use opd::{OpdConfig, OpdTeacher};
pub use rl_eval::RlEval;
pub use stage::StageConfig;
pub use workers::{PlacementMode, RolePlacement, WorkersConfig};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// Run name; also the default output directory `runs/<name>`.
    pub name: String,
    /// Seed of every random choice (init, data order, sampling).
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Where metrics, samples and checkpoints go (default `runs/<name>`).
    #[serde(default)]
    pub output_dir: Option<PathBuf>,
    pub model: ModelSource,
    /// Prompt datasets (SFT, and RL without `rl.env`); an agentic run without SFT needs none.
    #[serde(default)]
    pub data: DataConfig,
    /// Supervised fine-tuning on (prompt, ground_truth) pairs, run before `rl` when both are present.
    #[serde(default)]
    pub sft: Option<SftConfig>,
    /// Offline knowledge distillation from a teacher model, run after `sft` and before `dpo`.
    #[serde(default)]
    pub distill: Option<DistillConfig>,
    /// Preference optimisation on pairs (DPO, cDPO, IPO), run after `sft` and before `rl`.
    #[serde(default)]
    pub dpo: Option<DpoConfig>,
    #[serde(default)]
    pub rl: Option<RlConfig>,
    #[serde(default)]
    pub checkpoint: CheckpointConfig,
    /// Where roles run (in this process, or in worker processes).
    #[serde(default)]
    pub workers: WorkersConfig,
    /// Worker processes connect over TCP, authenticated, instead of Unix sockets.
    #[serde(default)]
    pub cluster: Option<ClusterConfig>,
}

fn default_seed() -> u64 {
    42
}

/// The policy: a local Hugging Face directory, or a fresh random model with a character tokenizer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSource {
    #[serde(default)]
    pub path: Option<PathBuf>,
    #[serde(default)]
    pub init: Option<ModelInitConfig>,
    /// Compute dtype: float32 (default) or bfloat16.
    #[serde(default)]
    pub dtype: Dtype,
    /// Train a LoRA adapter instead of the weights: the base stays frozen
    /// and checkpoints hold the adapter in PEFT's format.
    #[serde(default)]
    pub lora: Option<crate::model::lora::LoraSettings>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Dtype {
    #[default]
    Float32,
    Bfloat16,
}

impl Dtype {
    pub fn candle(self) -> candle_core::DType {
        match self {
            Dtype::Float32 => candle_core::DType::F32,
            Dtype::Bfloat16 => candle_core::DType::BF16,
        }
    }

    pub fn hf_name(self) -> &'static str {
        match self {
            Dtype::Float32 => "float32",
            Dtype::Bfloat16 => "bfloat16",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelInitConfig {
    pub arch: Arch,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub intermediate: usize,
    #[serde(default)]
    pub head_dim: Option<usize>,
    #[serde(default = "yes")]
    pub tie_embeddings: bool,
    #[serde(default = "default_max_positions")]
    pub max_positions: usize,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    /// The character-level tokenizer's alphabet, one token per character.
    pub chars: String,
}

fn yes() -> bool {
    true
}
fn default_max_positions() -> usize {
    256
}
fn default_rope_theta() -> f64 {
    10_000.0
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    #[serde(default)]
    pub domains: Vec<DomainConfig>,
    /// Wrap each prompt as a user message with the tokenizer's chat template.
    #[serde(default)]
    pub chat_template: bool,
    /// Variables the chat template renders with beside the messages, as `apply_chat_template`'s
    /// keyword arguments: `enable_thinking: false` (Qwen3), `tools` (function descriptions),
    /// `date_string` (Llama 3). `roll-tui model template DIR --set k=v` shows their effect.
    #[serde(default, skip_serializing_if = "TemplateOptions::is_empty")]
    pub chat_template_options: TemplateOptions,
}

/// One task domain: its prompts, its share of each batch, and its reward.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DomainConfig {
    pub name: String,
    /// A JSONL dataset (`prompt`, `ground_truth`, optional `domain`); a relative path is relative
    /// to the directory of the file that writes it (the config, or an included fragment).
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// Or a generated one.
    #[serde(default)]
    pub synthetic: Option<crate::data::synthetic::SyntheticConfig>,
    /// Held-out prompts for `rl.eval`, never trained on: a JSONL file like `path` (relative to
    /// the file that writes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_path: Option<PathBuf>,
    /// Or this fraction of the domain's examples, drawn by the seed and kept out of every
    /// stage's training.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub val_split: Option<f64>,
    /// Relative weight of this domain in every batch.
    #[serde(default = "one")]
    pub ratio: f64,
    /// How responses are scored: a kind (`math_rule`), a kind with parameters, or a weighted
    /// combination (see `reward::spec`).
    pub reward: RewardSpec,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SftConfig {
    pub steps: usize,
    pub batch_size: usize,
    /// Rows per forward/backward; gradients are accumulated up to `batch_size`.
    #[serde(default)]
    pub micro_batch_size: Option<usize>,
    #[serde(default)]
    pub optimizer: OptimizerConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlConfig {
    pub steps: usize,
    pub prompts_per_step: usize,
    /// Samples per prompt.
    pub group_size: usize,
    #[serde(default)]
    pub sampling: SamplingParams,
    /// Sequences decoded at once by the continuous-batching engine.
    #[serde(default = "default_max_batch")]
    pub rollout_batch: usize,
    #[serde(default)]
    pub adv_estimator: AdvantageEstimator,
    #[serde(default = "one")]
    pub gamma: f64,
    #[serde(default = "one")]
    pub lambda: f64,
    /// grpo: divide by the group std (false = Dr.GRPO).
    #[serde(default = "yes")]
    pub std_normalize: bool,
    #[serde(default)]
    pub reward_norm: RewardNorm,
    #[serde(default)]
    pub reward_clip: Option<f32>,
    /// Whiten advantages over the batch's valid tokens.
    #[serde(default)]
    pub adv_whiten: bool,
    #[serde(default)]
    pub adv_clip: Option<f64>,
    #[serde(default)]
    pub kl: KlConfig,
    #[serde(default)]
    pub policy_loss: PolicyLossParams,
    #[serde(default)]
    pub entropy_coef: f64,
    /// Optimisation passes over each rollout batch.
    #[serde(default = "one_usize")]
    pub ppo_epochs: usize,
    /// Optimizer steps per epoch (the batch is split into this many mini-batches).
    #[serde(default = "one_usize")]
    pub mini_batches: usize,
    #[serde(default)]
    pub micro_batch_size: Option<usize>,
    #[serde(default)]
    pub optimizer: OptimizerConfig,
    #[serde(default)]
    pub dynamic_sampling: DynamicSampling,
    /// α: a sample generated by policy version v may train step t only if t − v <= α. 0 = synchronous
    /// (generate, then train); above 0 rollout runs ahead on its own devices while training runs.
    #[serde(default)]
    pub async_generation_ratio: usize,
    /// Drop responses cut at max_new_tokens from the loss.
    #[serde(default)]
    pub max_length_mask: bool,
    /// Keep only prompts whose group accuracy is within [low, high].
    #[serde(default)]
    pub difficulty_mask: Option<crate::algo::mask::DifficultyMask>,
    /// Required by `adv_estimator: gae`.
    #[serde(default)]
    pub critic: Option<CriticConfig>,
    /// On-policy distillation: teachers score the sampled tokens, and their KL joins (or, with
    /// `pure`, is) the advantage.
    #[serde(default)]
    pub opd: Option<OpdConfig>,
    /// Agentic RL: act in this environment over many turns instead of answering `data` prompts
    /// (each of `prompts_per_step` groups is `group_size` episodes from one seed).
    #[serde(default)]
    pub env: Option<EnvConfig>,
    /// Score the policy on the domains' held-out prompts every N steps (`val/<domain>/…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval: Option<RlEval>,
}

fn default_max_batch() -> usize {
    64
}
fn one_usize() -> usize {
    1
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KlConfig {
    pub mode: KlMode,
    pub estimator: KlEstimator,
    pub coef: f64,
    pub controller: KlControllerKind,
    /// Adaptive controller: target KL and horizon (in samples).
    pub target: f64,
    pub horizon: f64,
    /// Replace the reference with the current policy after every this many steps (0: never; the
    /// reference stays the policy the stage started from).
    pub refresh_every: usize,
}

impl Default for KlConfig {
    fn default() -> Self {
        KlConfig {
            mode: KlMode::None,
            estimator: KlEstimator::K3,
            coef: 0.0,
            controller: KlControllerKind::Fixed,
            target: 0.1,
            horizon: 10_000.0,
            refresh_every: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct DynamicSampling {
    /// Drop groups whose rewards are all equal and sample more prompts to refill the batch.
    pub enabled: bool,
    /// Extra rollout rounds allowed per step to refill (0 = just drop): a step dispatches at most
    /// `prompts_per_step × (1 + max_rounds)` prompts.
    pub max_rounds: usize,
    /// Prompts kept in flight beyond what the step still needs, as a fraction of that need (0.5 = 50%
    /// more), so that the groups the filter drops are replaced without waiting for a new round.
    pub oversample: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CriticConfig {
    #[serde(default)]
    pub optimizer: OptimizerConfig,
    /// Clip the value update around the rollout-time value (PPO value clipping).
    #[serde(default)]
    pub value_clip: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Save every N optimizer steps of each stage (0 = not by step count).
    pub every: usize,
    /// Also save after the first step that ends this many minutes after the last save (or the
    /// start), so that a crash in a long stage loses at most about that much work; each such save
    /// replaces the previous one on disk; 0 = not by time. Checkpoints are always written (and
    /// kept) at the end of each stage and on Ctrl-C.
    pub every_minutes: f64,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        CheckpointConfig {
            every: 0,
            every_minutes: 30.0,
        }
    }
}

/// A setting's value as a config writes it (`grpo`, `in_reward`), for messages: the serde name,
/// never the Rust one (`Grpo`).
fn yaml_name<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

/// Whether a YAML file is a run config rather than a fragment to include: it names its run
/// (`name:` at the top level).
pub fn is_runnable(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|text| {
        text.lines().any(|l| {
            l.strip_prefix("name")
                .is_some_and(|rest| rest.trim_start().starts_with(':'))
        })
    })
}

impl RunConfig {
    /// The compute threads of a worker process of `role` on this machine
    /// ([`WorkersConfig::threads`]).
    pub fn worker_threads(&self, role: Role) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let async_ratio = self.rl.as_ref().map_or(0, |rl| rl.async_generation_ratio);
        self.workers.threads(role, async_ratio, cores)
    }

    /// Load, apply overrides, validate: every problem in the file is reported at once.
    pub fn load(path: &Path, overrides: &[String]) -> Result<RunConfig, ConfigError> {
        let mut cfg: RunConfig = include::load_with_includes(path)?;
        // A dataset the file names is found beside the file, wherever the command runs; one
        // given in an override is where the command line says (the working directory).
        let dir = path.parent().unwrap_or(Path::new(""));
        for d in &mut cfg.data.domains {
            for p in [&mut d.path, &mut d.val_path] {
                if let Some(p) = p.as_mut().filter(|p| p.is_relative()) {
                    *p = dir.join(&*p);
                }
            }
        }
        if let Some(dpo) = &mut cfg.dpo {
            dpo.rebase(dir);
        }
        let cfg = load::apply_overrides(cfg, overrides)?;
        load::validated_with(cfg, path, overrides)
    }

    /// A config already loaded (a stored run's) with `overrides` applied and checked, problems
    /// reported as of `origin`.
    pub fn with_overrides(
        self,
        origin: &str,
        overrides: &[String],
    ) -> Result<RunConfig, ConfigError> {
        let cfg = load::apply_overrides(self, overrides)?;
        load::validated_with(cfg, Path::new(origin), overrides)
    }

    pub fn output_dir(&self) -> PathBuf {
        self.output_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("runs").join(&self.name))
    }

    /// The same config with every path (output directory, model, datasets) made absolute against the
    /// working directory, so a stored run can be resumed from anywhere.
    pub fn with_absolute_paths(mut self) -> RunConfig {
        let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        self.output_dir = Some(abs(&self.output_dir()));
        if let Some(p) = &self.model.path {
            self.model.path = Some(abs(p));
        }
        for d in &mut self.data.domains {
            for p in [&mut d.path, &mut d.val_path].into_iter().flatten() {
                *p = abs(p);
            }
        }
        if let Some(dpo) = &mut self.dpo {
            for p in dpo.paths_mut() {
                *p = abs(p);
            }
        }
        self
    }

    /// Stable hash of the resolved config (stored with checkpoints to refuse resuming another run).
    pub fn hash(&self) -> String {
        let text = serde_json::to_string(self).unwrap_or_default();
        // FNV-1a: stable across Rust versions, unlike DefaultHasher.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in text.bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{h:016x}")
    }
}

/// The longest run name: a directory name (`runs/NAME`) well within a filesystem's 255 bytes.
pub const MAX_NAME_CHARS: usize = 100;

impl Validate for RunConfig {
    fn validate(&self, p: &mut Vec<String>) {
        // The name is a directory's (`runs/NAME`) and a column in every listing.
        let chars = self.name.chars().count();
        if self.name.trim().is_empty()
            || self.name.contains(['/', '\\'])
            || self.name.chars().any(char::is_control)
            || chars > MAX_NAME_CHARS
        {
            p.push(format!(
                "name '{}'{} must be non-empty, at most {MAX_NAME_CHARS} characters, with no path \
                 separators or control characters",
                crate::text::clean(&self.name, 40, false),
                if chars > 40 {
                    format!(" ({chars} characters)")
                } else {
                    String::new()
                }
            ));
        }
        match (&self.model.path, &self.model.init) {
            (None, None) => {
                p.push("model: set either 'path' (a Hugging Face directory) or 'init'".into())
            }
            (Some(_), Some(_)) => p.push(
                "model: set only one of 'path' and 'init' (to use a directory instead of an \
                 included init, add model.init=null)"
                    .into(),
            ),
            _ => {}
        }
        if let Some(c) = &self.cluster {
            c.validate(p);
        }
        let minutes = self.checkpoint.every_minutes;
        if !(minutes.is_finite() && minutes >= 0.0) {
            p.push(format!(
                "checkpoint.every_minutes must be 0 (off) or a positive number of minutes, got {minutes}"
            ));
        }
        if let Some(init) = &self.model.init {
            if init.chars.is_empty() {
                p.push("model.init.chars must list at least one character".into());
            }
            if init.heads == 0 || init.kv_heads == 0 || !init.heads.is_multiple_of(init.kv_heads) {
                p.push(format!(
                    "model.init.heads ({}) must be a positive multiple of model.init.kv_heads ({})",
                    init.heads, init.kv_heads
                ));
            }
        }
        // SFT and RL on prompts read the domains; DPO reads its pairs, agentic RL its env.
        let reads_domains =
            self.sft.is_some() || self.rl.as_ref().is_some_and(|rl| rl.env.is_none());
        if self.data.domains.is_empty() && reads_domains {
            p.push("data.domains must list at least one domain".into());
        }
        for (i, d) in self.data.domains.iter().enumerate() {
            let at = format!("data.domains[{i}] ('{}')", d.name);
            match (&d.path, &d.synthetic) {
                (None, None) => p.push(format!("{at}: set either 'path' or 'synthetic'")),
                (Some(_), Some(_)) => {
                    p.push(format!("{at}: set only one of 'path' and 'synthetic'"))
                }
                _ => {}
            }
            if !(d.ratio > 0.0 && d.ratio.is_finite()) {
                p.push(format!("{at}.ratio must be positive, got {}", d.ratio));
            }
            if let Some(s) = &d.synthetic {
                s.validate(&format!("{at}.synthetic"), p);
            }
            if let Err(e) = d.reward.resolve(&format!("{at}.reward")) {
                p.push(e);
            }
            if self.data.domains[..i].iter().any(|o| o.name == d.name) {
                p.push(format!("{at}: duplicate domain name '{}'", d.name));
            }
        }
        rl_eval::validate(self, p);
        if self.stages().is_empty() {
            p.push("nothing to do: add an 'sft', 'distill', 'dpo' or 'rl' section".into());
        }
        if let Some(dpo) = &self.dpo {
            dpo.validate(p);
        }
        if let Some(distill) = &self.distill {
            distill.validate(p);
        }
        if let Some(lora) = &self.model.lora {
            lora.validate(p);
            if lora.dropout > 0.0 && self.workers.devices.kind == DeviceKind::Cuda {
                p.push(
                    "model.lora.dropout above 0 trains through the fused CPU layers; on CUDA set \
                     model.lora.dropout to 0"
                        .into(),
                );
            }
            if self.workers.reference.mode == PlacementMode::Process {
                p.push(
                    "model.lora: workers.reference.mode 'process' would hold a second copy of \
                     the base; under LoRA the reference is the policy's own frozen base with a \
                     copy of the adapter, so it stays in the trainer's process (use 'in_process')"
                        .into(),
                );
            }
        }
        if let Some(sft) = &self.sft {
            if sft.steps == 0 || sft.batch_size == 0 {
                p.push("sft.steps and sft.batch_size must be at least 1".into());
            }
            if sft.micro_batch_size == Some(0) {
                p.push("sft.micro_batch_size must be at least 1".into());
            }
            sft.optimizer.validate("sft.optimizer", p);
        }
        if let Some(rl) = &self.rl {
            rl.validate(p);
        }
        self.workers.validate(
            self.rl.as_ref().map_or(0, |rl| rl.async_generation_ratio),
            p,
        );
    }
}

/// Largest accepted α (ROLL's users run 1–2).
pub const MAX_ASYNC_RATIO: usize = 16;

impl RlConfig {
    fn validate(&self, p: &mut Vec<String>) {
        if let Some(opd) = &self.opd {
            opd.validate(p);
            if opd.pure {
                // ROLL's pure OPD: the teachers' KL is the whole advantage.
                if self.kl.mode != KlMode::None {
                    p.push(
                        "rl.opd.pure: the teachers' KL is the whole advantage; set rl.kl.mode: \
                         none (no other KL)"
                            .into(),
                    );
                }
                if self.critic.is_some() {
                    p.push("rl.opd.pure takes no critic: remove rl.critic".into());
                }
            }
        }
        if self.steps == 0 || self.prompts_per_step == 0 || self.group_size == 0 {
            p.push("rl.steps, rl.prompts_per_step and rl.group_size must be at least 1".into());
        }
        use AdvantageEstimator as A;
        if matches!(self.adv_estimator, A::Grpo | A::Rloo) && self.group_size < 2 {
            p.push(format!(
                "rl.adv_estimator {} needs rl.group_size >= 2, got {}",
                yaml_name(&self.adv_estimator),
                self.group_size
            ));
        }
        if self.adv_estimator == A::Gae && self.critic.is_none() {
            p.push("rl.adv_estimator 'gae' needs an rl.critic section".into());
        }
        if self.adv_estimator != A::Gae && self.critic.is_some() {
            p.push("rl.critic is only used with rl.adv_estimator 'gae'".into());
        }
        if !(0.0..=1.0).contains(&self.gamma) || !(0.0..=1.0).contains(&self.lambda) {
            p.push(format!(
                "rl.gamma ({}) and rl.lambda ({}) must be in [0, 1]",
                self.gamma, self.lambda
            ));
        }
        if self.ppo_epochs == 0 || self.mini_batches == 0 || self.rollout_batch == 0 {
            p.push("rl.ppo_epochs, rl.mini_batches and rl.rollout_batch must be at least 1".into());
        }
        if self.mini_batches > self.prompts_per_step {
            p.push(format!(
                "rl.mini_batches ({}) cannot exceed rl.prompts_per_step ({}): mini-batches split whole groups",
                self.mini_batches, self.prompts_per_step
            ));
        }
        if self.micro_batch_size == Some(0) {
            p.push("rl.micro_batch_size must be at least 1".into());
        }
        if self.kl.mode != KlMode::None && self.kl.coef <= 0.0 {
            p.push(format!(
                "rl.kl.mode {} needs rl.kl.coef > 0",
                yaml_name(&self.kl.mode)
            ));
        }
        if self.kl.refresh_every > 0 && self.kl.mode == KlMode::None {
            p.push(format!(
                "rl.kl.refresh_every is {} but rl.kl.mode is none: there is no reference to refresh",
                self.kl.refresh_every
            ));
        }
        if self.kl.coef < 0.0 {
            p.push(format!("rl.kl.coef must be >= 0, got {}", self.kl.coef));
        }
        let pl = &self.policy_loss;
        if !(0.0..1.0).contains(&pl.clip_low) || pl.clip_high < 0.0 {
            p.push(format!(
                "rl.policy_loss clip range needs 0 <= clip_low < 1 and clip_high >= 0, got {} and {}",
                pl.clip_low, pl.clip_high
            ));
        }
        if let Some(c) = pl.dual_clip
            && c <= 1.0
        {
            p.push(format!("rl.policy_loss.dual_clip must be > 1, got {c}"));
        }
        if let Some(d) = &self.difficulty_mask
            && !(0.0 <= d.low && d.low <= d.high && d.high <= 1.0)
        {
            p.push(format!(
                "rl.difficulty_mask needs 0 <= low <= high <= 1, got {} and {}",
                d.low, d.high
            ));
        }
        let o = self.dynamic_sampling.oversample;
        if !(o.is_finite() && (0.0..=10.0).contains(&o)) {
            p.push(format!(
                "rl.dynamic_sampling.oversample must be in [0, 10], got {o}"
            ));
        }
        if self.async_generation_ratio > MAX_ASYNC_RATIO {
            p.push(format!(
                "rl.async_generation_ratio must be at most {MAX_ASYNC_RATIO}, got {} (samples that \
                 stale are no longer on-policy enough to learn from)",
                self.async_generation_ratio
            ));
        }
        let est = self.adv_estimator;
        let est_name = yaml_name(&est);
        match (&self.env, est) {
            (None, _) if est.is_per_env_step() => p.push(format!(
                "rl.adv_estimator {est_name} is for agentic runs: add an rl.env section"
            )),
            (Some(env), A::Gigpo | A::StepReinforce) if env.mode != EnvMode::Step => {
                p.push(format!(
                    "rl.adv_estimator {est_name} trains one sample per env step: set rl.env.mode to step"
                ))
            }
            (Some(env), _) if env.mode == EnvMode::Step && !matches!(est, A::Gigpo | A::StepReinforce) => {
                p.push(format!(
                    "rl.env.mode step needs rl.adv_estimator gigpo or step_reinforce, got {est_name}"
                ))
            }
            _ => {}
        }
        if self.env.as_ref().is_some_and(|e| e.mode == EnvMode::Step)
            && self.difficulty_mask.is_some()
        {
            p.push(
                "rl.difficulty_mask judges a prompt's group; rl.env.mode step trains single turns, \
                 so it would judge each turn alone: remove it or use mode trajectory"
                    .into(),
            );
        }
        if est.is_per_env_step() && self.kl.mode == KlMode::InReward {
            p.push(format!(
                "rl.adv_estimator {est_name} computes advantages from env rewards per step, so \
                 rl.kl.mode in_reward cannot shape them; use in_loss"
            ));
        }
        if est == A::Gigpo && self.group_size < 2 {
            p.push(format!(
                "rl.adv_estimator gigpo needs rl.group_size >= 2, got {}",
                self.group_size
            ));
        }
        if let Some(env) = &self.env {
            env.validate("rl.env", p);
            if self.dynamic_sampling.enabled {
                p.push(
                    "rl.env: dynamic sampling of episode groups is not supported in this version; \
                     set rl.dynamic_sampling.enabled to false"
                        .into(),
                );
            }
        }
        self.sampling.validate("rl.sampling", p);
        self.optimizer.validate("rl.optimizer", p);
        if let Some(c) = &self.critic {
            c.optimizer.validate("rl.critic.optimizer", p);
        }
    }
}
