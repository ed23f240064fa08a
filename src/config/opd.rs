//! `rl.opd`: on-policy distillation in an RL stage (ROLL's `use_opd` / `is_pure_opd`). The student
//! samples as in RL; each teacher scores the sampled tokens, and the per-token KL of the student
//! to the teacher (`estimator` over the sampling log-probs and the teacher's),
//! weighed by the teacher's `coef`, is subtracted from the RL advantage — or, with `pure: true`,
//! is the whole advantage (`-Σ coef KL`), with no reward and no other KL.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::algo::kl::KlEstimator;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpdConfig {
    /// The advantage is the teachers' KL alone (ROLL's `is_pure_opd`).
    #[serde(default)]
    pub pure: bool,
    /// One or more teachers (ROLL's `teacher`, a dict for several).
    pub teachers: Vec<OpdTeacher>,
    /// The per-token KL estimate (ROLL's `kl_penalty`, `kl` by default: `k1`, log π − log
    /// π_teacher, whose policy gradient is the reverse KL's; `k3` as a reward pushes the student
    /// away from tokens the teacher prefers).
    #[serde(default = "k1")]
    pub estimator: KlEstimator,
}

fn k1() -> KlEstimator {
    KlEstimator::K1
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpdTeacher {
    /// How its metric is named: `opd/kl/<name>`.
    pub name: String,
    /// A Hugging Face model directory with the student's tokenizer (relative to the working
    /// directory, as `model.path`).
    pub path: PathBuf,
    /// Its KL's weight (ROLL's `opd_kl_coef`, 1 by default).
    #[serde(default = "one")]
    pub coef: f64,
    /// The samples it scores: those of these domains (RLVR) or environment tags (agentic); all
    /// of them when empty (ROLL's `tag_included`).
    #[serde(default)]
    pub tags: Vec<String>,
}

fn one() -> f64 {
    1.0
}

impl OpdTeacher {
    /// Whether it scores a sample of `tag`.
    pub fn scores(&self, tag: &str) -> bool {
        self.tags.is_empty() || self.tags.iter().any(|t| t == tag)
    }
}

impl OpdConfig {
    pub fn validate(&self, p: &mut Vec<String>) {
        if self.teachers.is_empty() {
            p.push("rl.opd.teachers must list at least one teacher".into());
        }
        for (i, t) in self.teachers.iter().enumerate() {
            let at = format!("rl.opd.teachers[{i}]");
            if t.name.is_empty() || t.name.contains('/') {
                p.push(format!(
                    "{at}.name must be non-empty and contain no '/', got '{}'",
                    t.name
                ));
            }
            if self.teachers[..i].iter().any(|o| o.name == t.name) {
                p.push(format!("{at}: duplicate teacher name '{}'", t.name));
            }
            if !(t.coef.is_finite() && t.coef >= 0.0) {
                p.push(format!("{at}.coef must be at least 0, got {}", t.coef));
            }
        }
    }
}
