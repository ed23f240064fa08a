//! The `dpo:` section: preference optimisation (DPO, cDPO, IPO) on pairs of completions, trained
//! through actor_train against the reference role. Names follow TRL's `DPOConfig` where it has
//! one (`beta`, `loss_type`, `loss_weights`, `label_smoothing`, `precompute_ref_log_probs` as
//! `precompute_ref`).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::algo::preference::{PreferenceLossType, PreferenceParams};
use crate::train::OptimizerConfig;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DpoConfig {
    /// JSONL preference pairs in either of TRL's formats (`data::pairs`); a relative path is
    /// relative to the config file.
    pub data: PathBuf,
    /// Optimizer steps.
    pub steps: usize,
    /// Pairs per optimizer step.
    pub batch_size: usize,
    /// Pairs per forward and backward pass; gradients accumulate up to `batch_size`.
    #[serde(default)]
    pub micro_batch_size: Option<usize>,
    /// How far the policy may move from the reference (TRL's default 0.1).
    #[serde(default = "default_beta")]
    pub beta: f64,
    /// One loss type or a list whose losses are added (TRL's list form): `sigmoid` or `ipo` (the
    /// pairwise loss, at most one of them), and `sft` (the chosen completions' likelihood).
    #[serde(default)]
    pub loss_type: DpoLossTypes,
    /// Each listed loss type's weight (TRL's `loss_weights`; all 1 without it).
    #[serde(default)]
    pub loss_weights: Option<Vec<f64>>,
    /// cDPO: the probability that a pair's labels are flipped (`sigmoid` only), in [0, 0.5).
    #[serde(default)]
    pub label_smoothing: f64,
    /// Compute the reference's log-probs of every pair once, before the first step, instead of
    /// for each batch; the reference is then unloaded for the rest of the stage.
    #[serde(default)]
    pub precompute_ref: bool,
    /// Held-out pairs scored (`eval/rewards/*`, `eval/loss`) before the first step and every
    /// `every` steps.
    #[serde(default)]
    pub eval: Option<DpoEvalConfig>,
    #[serde(default)]
    pub optimizer: OptimizerConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DpoEvalConfig {
    /// JSONL preference pairs, as `dpo.data`.
    pub data: PathBuf,
    /// Steps between evaluations (the last step is always evaluated).
    #[serde(default = "default_eval_every")]
    pub every: usize,
}

/// A loss type `dpo.loss_type` may list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DpoLoss {
    Sigmoid,
    Ipo,
    /// The negative log-likelihood of the chosen completions, a mean over their tokens.
    Sft,
}

/// `dpo.loss_type`: one name, or a list of them (TRL's `loss_type: [sigmoid, sft]`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum DpoLossTypes {
    One(DpoLoss),
    Many(Vec<DpoLoss>),
}

/// By hand: serde's untagged enums say only that nothing matched; this names the bad entry.
impl<'de> Deserialize<'de> for DpoLossTypes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            One(String),
            Many(Vec<String>),
        }
        let parse = |name: &str| match name {
            "sigmoid" => Ok(DpoLoss::Sigmoid),
            "ipo" => Ok(DpoLoss::Ipo),
            "sft" => Ok(DpoLoss::Sft),
            other => Err(serde::de::Error::custom(format!(
                "unknown loss type '{other}': expected sigmoid, ipo or sft (one, or a list)"
            ))),
        };
        match Raw::deserialize(d).map_err(|_| {
            serde::de::Error::custom("expected a loss type (sigmoid, ipo, sft) or a list of them")
        })? {
            Raw::One(name) => Ok(DpoLossTypes::One(parse(&name)?)),
            Raw::Many(names) => Ok(DpoLossTypes::Many(
                names.iter().map(|n| parse(n)).collect::<Result<_, _>>()?,
            )),
        }
    }
}

impl Default for DpoLossTypes {
    fn default() -> Self {
        DpoLossTypes::One(DpoLoss::Sigmoid)
    }
}

impl DpoLossTypes {
    pub fn list(&self) -> Vec<DpoLoss> {
        match self {
            DpoLossTypes::One(l) => vec![*l],
            DpoLossTypes::Many(ls) => ls.clone(),
        }
    }
}

fn default_beta() -> f64 {
    0.1
}

fn default_eval_every() -> usize {
    10
}

impl DpoConfig {
    /// The loss's parameters.
    pub fn params(&self) -> PreferenceParams {
        let list = self.loss_type.list();
        let weights = match &self.loss_weights {
            Some(w) => w.clone(),
            None => vec![1.0; list.len()],
        };
        let weight_of = |l: DpoLoss| {
            list.iter()
                .zip(&weights)
                .find(|(x, _)| **x == l)
                .map_or(0.0, |(_, w)| *w)
        };
        let loss_type = if list.contains(&DpoLoss::Ipo) {
            PreferenceLossType::Ipo
        } else {
            PreferenceLossType::Sigmoid
        };
        PreferenceParams {
            loss_type,
            beta: self.beta,
            label_smoothing: self.label_smoothing,
            weight: weight_of(DpoLoss::Sigmoid) + weight_of(DpoLoss::Ipo),
            sft_weight: weight_of(DpoLoss::Sft),
        }
    }

    /// Pairs per forward and backward pass.
    pub fn micro_pairs(&self) -> usize {
        self.micro_batch_size
            .unwrap_or(self.batch_size)
            .min(self.batch_size)
    }

    /// Relative data paths made relative to `dir` (the config file's directory).
    pub fn rebase(&mut self, dir: &Path) {
        for p in self.paths_mut() {
            if p.is_relative() {
                *p = dir.join(&*p);
            }
        }
    }

    /// Every data path, to make absolute or rebase.
    pub fn paths_mut(&mut self) -> Vec<&mut PathBuf> {
        let mut paths = vec![&mut self.data];
        if let Some(e) = &mut self.eval {
            paths.push(&mut e.data);
        }
        paths
    }

    pub fn validate(&self, p: &mut Vec<String>) {
        if self.steps == 0 || self.batch_size == 0 {
            p.push("dpo.steps and dpo.batch_size must be at least 1".into());
        }
        if self.micro_batch_size == Some(0) {
            p.push("dpo.micro_batch_size must be at least 1".into());
        }
        if !(self.beta.is_finite() && self.beta > 0.0) {
            p.push(format!("dpo.beta must be above 0, got {}", self.beta));
        }
        if !(0.0..0.5).contains(&self.label_smoothing) {
            p.push(format!(
                "dpo.label_smoothing must be in [0, 0.5), got {}",
                self.label_smoothing
            ));
        }
        let list = self.loss_type.list();
        if list.is_empty() {
            p.push("dpo.loss_type lists no loss".into());
        }
        for (i, l) in list.iter().enumerate() {
            if list[..i].contains(l) {
                p.push(format!("dpo.loss_type lists '{}' twice", name_of(*l)));
            }
        }
        if list.contains(&DpoLoss::Sigmoid) && list.contains(&DpoLoss::Ipo) {
            p.push(
                "dpo.loss_type lists both 'sigmoid' and 'ipo': one pairwise loss at a time".into(),
            );
        }
        if let Some(w) = &self.loss_weights {
            if w.len() != list.len() {
                p.push(format!(
                    "dpo.loss_weights has {} weights for the {} loss types of dpo.loss_type",
                    w.len(),
                    list.len()
                ));
            }
            if let Some(bad) = w.iter().find(|x| !(x.is_finite() && **x >= 0.0)) {
                p.push(format!("dpo.loss_weights must be 0 or more, got {bad}"));
            }
        }
        if list.contains(&DpoLoss::Ipo) && self.label_smoothing != 0.0 {
            p.push("dpo.label_smoothing applies to loss_type 'sigmoid' (cDPO), not 'ipo'".into());
        }
        if self.eval.as_ref().is_some_and(|e| e.every == 0) {
            p.push("dpo.eval.every must be at least 1".into());
        }
        self.optimizer.validate("dpo.optimizer", p);
    }
}

fn name_of(l: DpoLoss) -> &'static str {
    match l {
        DpoLoss::Sigmoid => "sigmoid",
        DpoLoss::Ipo => "ipo",
        DpoLoss::Sft => "sft",
    }
}
