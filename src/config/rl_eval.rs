//! `rl.eval`: the policy scored on held-out prompts as training goes (`data.domains[].val_path` or
//! `val_split`), with the domain's own reward, greedy or sampled, k samples per prompt.

use serde::{Deserialize, Serialize};

use super::RunConfig;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlEval {
    /// Evaluate the policy after steps `every`, 2·`every`, … and after the last step.
    pub every: usize,
    /// Samples per prompt (k of `pass@k` and `mean@k`).
    #[serde(default = "one")]
    pub samples: usize,
    /// Sampling temperature; 0 (the default) is greedy, which gives one answer per prompt.
    #[serde(default)]
    pub temperature: f64,
    /// Evaluate at most this many of each domain's held-out prompts (the first ones; all by
    /// default).
    #[serde(default)]
    pub max_prompts: Option<usize>,
    /// Also score the policy the stage starts from, before its first step, recorded as step 0
    /// (the baseline the curves start from; verl's `val_before_train`). On by default; a
    /// resumed stage does not repeat it.
    #[serde(default = "yes")]
    pub before_training: bool,
}

fn one() -> usize {
    1
}

fn yes() -> bool {
    true
}

impl RlEval {
    /// What is wrong with these settings, in `rl.eval.…` words.
    pub fn problems(&self) -> Vec<String> {
        let mut p = vec![];
        if self.every == 0 || self.samples == 0 || self.max_prompts == Some(0) {
            p.push(
                "rl.eval.every, rl.eval.samples and rl.eval.max_prompts must be at least 1".into(),
            );
        }
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            p.push(format!(
                "rl.eval.temperature must be 0 or more, got {}",
                self.temperature
            ));
        }
        if self.temperature == 0.0 && self.samples > 1 {
            p.push(format!(
                "rl.eval.samples is {} but greedy decoding (temperature 0) gives one answer per \
                 prompt: set rl.eval.temperature above 0, or samples: 1",
                self.samples
            ));
        }
        p
    }

    /// Whether the policy after step `step` of `steps` is evaluated.
    pub fn due(&self, step: usize, steps: usize) -> bool {
        step == steps || (self.every > 0 && step.is_multiple_of(self.every))
    }
}

/// The checks of `rl.eval` and of the domains' held-out data, which need the whole config.
pub(super) fn validate(cfg: &RunConfig, p: &mut Vec<String>) {
    for (i, d) in cfg.data.domains.iter().enumerate() {
        let at = format!("data.domains[{i}] ('{}')", d.name);
        if d.val_path.is_some() && d.val_split.is_some() {
            p.push(format!("{at}: set only one of 'val_path' and 'val_split'"));
        }
        if let Some(f) = d.val_split
            && !(f > 0.0 && f < 1.0)
        {
            p.push(format!(
                "{at}.val_split must be between 0 and 1 (a fraction), got {f}"
            ));
        }
    }
    let Some(rl) = &cfg.rl else { return };
    let Some(eval) = &rl.eval else { return };
    if rl.env.is_some() {
        p.push("rl.eval scores held-out prompts; an agentic run evaluates with rl.env.eval".into());
        return;
    }
    p.extend(eval.problems());
    if rl.async_generation_ratio > 0 {
        p.push(
            "rl.eval runs between steps, with nothing in flight: it needs \
             rl.async_generation_ratio 0"
                .into(),
        );
    }
    if !cfg
        .data
        .domains
        .iter()
        .any(|d| d.val_path.is_some() || d.val_split.is_some())
    {
        p.push(
            "rl.eval needs held-out prompts: give a domain 'val_path' (a JSONL file) or \
             'val_split' (a fraction of its examples)"
                .into(),
        );
    }
}
