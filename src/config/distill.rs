//! The `distill:` section: offline knowledge distillation. The student (the run's model) learns
//! the run's demonstrations (as SFT does) and a teacher model's token distributions over its top
//! k. Names follow ROLL's distill pipeline (`logits_topk`, `distill_loss_weight`,
//! `kd_temperature`, `teacher_temperature`, `kd_objective`, `adaptive_kl_alpha`, `skew_lambda`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::algo::distill::{KdObjective, KdParams};
use crate::train::OptimizerConfig;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistillConfig {
    /// The teacher: a Hugging Face model directory (a relative path is relative to the working
    /// directory, as `model.path`), which must share the student's tokenizer.
    pub teacher: PathBuf,
    /// Optimizer steps.
    pub steps: usize,
    /// Demonstrations per optimizer step.
    pub batch_size: usize,
    /// Rows per forward and backward pass; gradients accumulate up to `batch_size`.
    #[serde(default)]
    pub micro_batch_size: Option<usize>,
    /// The teacher's most likely tokens per position that the student learns (ROLL's 64).
    #[serde(default = "default_topk")]
    pub logits_topk: usize,
    /// w in `(1 − w) CE + w KD` (ROLL's 0.5); 0 is SFT.
    #[serde(default = "half")]
    pub distill_loss_weight: f64,
    /// Divides the student's and the teacher's logits.
    #[serde(default = "one")]
    pub kd_temperature: f64,
    /// Divides the teacher's logits further.
    #[serde(default = "one")]
    pub teacher_temperature: f64,
    #[serde(default)]
    pub kd_objective: KdObjective,
    #[serde(default = "half")]
    pub adaptive_kl_alpha: f64,
    #[serde(default = "skew")]
    pub skew_lambda: f64,
    /// A directory to keep the teacher's top k of each batch in, for runs that see the same
    /// batches again (the same data, seed and batch size); a cache of another teacher is
    /// refused.
    #[serde(default)]
    pub cache: Option<PathBuf>,
    #[serde(default)]
    pub optimizer: OptimizerConfig,
}

fn default_topk() -> usize {
    64
}

fn half() -> f64 {
    0.5
}

fn one() -> f64 {
    1.0
}

fn skew() -> f64 {
    0.1
}

impl DistillConfig {
    /// The divergence's parameters.
    pub fn params(&self) -> KdParams {
        KdParams {
            objective: self.kd_objective,
            kd_temperature: self.kd_temperature,
            adaptive_kl_alpha: self.adaptive_kl_alpha,
            skew_lambda: self.skew_lambda,
        }
    }

    /// Rows per forward and backward pass.
    pub fn micro(&self) -> usize {
        self.micro_batch_size
            .unwrap_or(self.batch_size)
            .min(self.batch_size)
    }

    pub fn validate(&self, p: &mut Vec<String>) {
        if self.steps == 0 || self.batch_size == 0 {
            p.push("distill.steps and distill.batch_size must be at least 1".into());
        }
        if self.micro_batch_size == Some(0) {
            p.push("distill.micro_batch_size must be at least 1".into());
        }
        if self.logits_topk == 0 {
            p.push("distill.logits_topk must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.distill_loss_weight) {
            p.push(format!(
                "distill.distill_loss_weight must be in [0, 1], got {}",
                self.distill_loss_weight
            ));
        }
        for (key, t) in [
            ("kd_temperature", self.kd_temperature),
            ("teacher_temperature", self.teacher_temperature),
        ] {
            if !(t.is_finite() && t > 0.0) {
                p.push(format!("distill.{key} must be above 0, got {t}"));
            }
        }
        if !(0.0..=1.0).contains(&self.adaptive_kl_alpha) {
            p.push(format!(
                "distill.adaptive_kl_alpha must be in [0, 1], got {}",
                self.adaptive_kl_alpha
            ));
        }
        if !(0.0..=1.0).contains(&self.skew_lambda) {
            p.push(format!(
                "distill.skew_lambda must be in [0, 1], got {}",
                self.skew_lambda
            ));
        }
        self.optimizer.validate("distill.optimizer", p);
    }
}
