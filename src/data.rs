//! Prompt datasets: strict JSONL loading and writing ([`jsonl`]), generated quickstart tasks
//! ([`synthetic`]) and domain mixing ([`mix`]).
//!
//! Owns the on-disk prompt format and the order in which prompts reach a pipeline. It must not know
//! about tokenizers, chat templates or rewards: an [`Example`] is plain text plus the ground truth that
//! a reward function in `reward` will read, and a domain name that keys per-domain metrics
//! (`reward/<domain>/mean`).

pub mod jsonl;
pub mod mix;
pub mod pairs;

pub mod synthetic;

pub use crate::seed::mix_seed;
pub use jsonl::{load_jsonl, write_jsonl};
pub use mix::DomainMixer;

use serde::{Deserialize, Serialize};

/// One prompt of a dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Example {
    /// The user turn, before any chat template.
    pub prompt: String,
    /// What the reward function compares the response with (numbers are stored as text).
    pub ground_truth: String,
    /// Which domain this prompt counts towards (metric keys, mixing ratios).
    pub domain: String,
    /// A demonstration to imitate in SFT when it differs from the bare answer (e.g. a worked solution
    /// ending in the answer); SFT uses `ground_truth` when absent. RL never reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<String>,
    /// Whatever else a reward needs about this prompt (test cases, instructions, a rubric), as the
    /// dataset line's `metadata` object; passed to the reward untouched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
}

/// Errors of dataset files and domain mixes; messages say which file and line, and quote values.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("dataset '{path}': cannot read: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("dataset '{path}': cannot write: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A bad record; `message` says what is wrong with it.
    #[error("dataset '{path}' line {line}: {message}")]
    Line {
        path: String,
        line: usize,
        message: String,
    },
    #[error("dataset '{path}': no examples")]
    Empty { path: String },
    #[error("domain mix: no domains")]
    NoDomains,
    #[error("domain mix: domain '{domain}' has ratio {ratio} (must be a finite number > 0)")]
    BadRatio { domain: String, ratio: f64 },
    #[error("domain mix: domain '{domain}' has no examples")]
    EmptyDomain { domain: String },
    #[error("domain mix: domain '{domain}' is listed twice")]
    DuplicateDomain { domain: String },
    #[error("resume: {0}")]
    Resume(String),
}

/// Splits examples by domain, keeping the order in which domains first appear and the order of the
/// examples within each domain (the shape [`DomainMixer::new`] takes, once ratios are attached).
pub fn group_by_domain(examples: Vec<Example>) -> Vec<(String, Vec<Example>)> {
    let mut groups: Vec<(String, Vec<Example>)> = Vec::new();
    for example in examples {
        match groups.iter_mut().find(|(d, _)| *d == example.domain) {
            Some((_, group)) => group.push(example),
            None => groups.push((example.domain.clone(), vec![example])),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(prompt: &str, domain: &str) -> Example {
        Example {
            response: None,
            metadata: None,
            prompt: prompt.into(),
            ground_truth: "0".into(),
            domain: domain.into(),
        }
    }

    #[test]
    fn group_by_domain_keeps_first_seen_order() {
        let groups = group_by_domain(vec![
            ex("a", "math"),
            ex("b", "code"),
            ex("c", "math"),
            ex("d", "logic"),
        ]);
        let names: Vec<&str> = groups.iter().map(|(d, _)| d.as_str()).collect();
        assert_eq!(names, ["math", "code", "logic"]);
        let math: Vec<&str> = groups[0].1.iter().map(|e| e.prompt.as_str()).collect();
        assert_eq!(math, ["a", "c"]);
        assert!(group_by_domain(Vec::new()).is_empty());
    }

    #[test]
    fn mixer_error_messages() {
        let err = DataError::BadRatio {
            domain: "math".into(),
            ratio: -1.0,
        };
        assert_eq!(
            err.to_string(),
            "domain mix: domain 'math' has ratio -1 (must be a finite number > 0)"
        );
        let err = DataError::EmptyDomain {
            domain: "code".into(),
        };
        assert_eq!(err.to_string(), "domain mix: domain 'code' has no examples");
    }
}
