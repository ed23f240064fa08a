//! Rule rewards: turn a model response and a ground truth into a score.
//!
//! Owns the verifiable, rule-based reward functions, one per file: [`math_rule`] (final numeric answer,
//! compared exactly as rationals), [`math_verify`] (final answer compared as mathematics: any
//! notation, expressions, tuples, intervals, sets) and [`exact_match`] (trimmed string equality); and [`spec`], a
//! domain's reward as data (a kind with parameters, or a weighted combination). Every function here is
//! pure and total: any response, however malformed or truncated, gets a [`RewardOutcome`], never a panic
//! or an error, because a bad sample is data to show in the TUI, not a failure of the run.
//!
//! This module must not do IO (except [`code_sandbox`], which runs programs through
//! [`crate::sandbox`] and still never fails), know about workers or tokenizers, or shape rewards
//! (normalisation, clipping and KL penalties belong to `algo`).

pub mod code_sandbox;
pub mod exact_match;
pub mod ifeval;
pub mod llm_judge;
pub mod math_rule;
pub mod math_verify;
pub mod regex_match;
pub mod spec;

use serde::{Deserialize, Serialize};

pub use spec::{Reward, RewardFn, RewardSpec};

/// Which rule scores a domain's responses; the YAML name is the snake_case variant (`math_rule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardKind {
    /// Final answer (last `\boxed{...}`, else the last number) compared numerically.
    MathRule,
    /// Final answer (box, answer phrase, math span, number) compared as mathematics: numbers in
    /// any notation, expressions, tuples, intervals, sets, equations ([`math_verify`]).
    MathVerify,
    /// `response.trim() == ground_truth.trim()`.
    ExactMatch,
    /// The response's last Python code block, run on the ground truth's tests in a sandbox.
    CodeSandbox,
    /// IFEval's verifiable instructions (the ground truth lists them with their kwargs).
    Ifeval,
    /// 1 when the response matches a regular expression (a format term).
    RegexMatch,
    /// A judge model's verdict (P(yes), or a 1-10 score it writes).
    LlmJudge,
}

impl RewardKind {
    /// Every kind, in declaration order (for help text and config suggestions).
    pub const ALL: [RewardKind; 7] = [
        RewardKind::MathRule,
        RewardKind::MathVerify,
        RewardKind::ExactMatch,
        RewardKind::CodeSandbox,
        RewardKind::Ifeval,
        RewardKind::RegexMatch,
        RewardKind::LlmJudge,
    ];

    /// The stable snake_case name used in configs and metric keys.
    pub fn as_str(self) -> &'static str {
        match self {
            RewardKind::MathRule => "math_rule",
            RewardKind::MathVerify => "math_verify",
            RewardKind::ExactMatch => "exact_match",
            RewardKind::CodeSandbox => "code_sandbox",
            RewardKind::Ifeval => "ifeval",
            RewardKind::RegexMatch => "regex_match",
            RewardKind::LlmJudge => "llm_judge",
        }
    }
}

impl std::fmt::Display for RewardKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a reward with several checks (tests, instructions) makes its score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scoring {
    /// 1 when every check passes, else 0.
    #[default]
    All,
    /// The fraction of checks passed.
    Fraction,
}

/// The verdict on one response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewardOutcome {
    /// 1.0 when correct, 0.0 otherwise.
    pub score: f32,
    /// The extracted answer matched the ground truth.
    pub correct: bool,
    /// An answer could be extracted at all (a `\boxed{}` or a number for `math_rule`; a non-empty
    /// response for `exact_match`). Tracked apart from `correct` so format collapse is visible.
    pub format_ok: bool,
    /// The answer as extracted from the response, before normalisation.
    pub extracted: Option<String>,
    /// A weighted reward's terms and their scores (empty for a single kind).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<(String, f32)>,
    /// Why the response could not be judged although it was well formed (a ground truth that is
    /// not what the reward reads, no sandbox for code): the score is 0 and this says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RewardOutcome {
    /// No answer could be extracted: score 0, `format_ok` false.
    pub fn unformatted() -> Self {
        RewardOutcome {
            score: 0.0,
            correct: false,
            format_ok: false,
            extracted: None,
            components: vec![],
            error: None,
        }
    }

    /// An answer was extracted and judged.
    pub fn graded(extracted: String, correct: bool) -> Self {
        RewardOutcome {
            score: if correct { 1.0 } else { 0.0 },
            correct,
            format_ok: true,
            extracted: Some(extracted),
            components: vec![],
            error: None,
        }
    }

    /// The parts the score was made of, by name, as a stored sample records them: `correct` and
    /// `format_ok` (1 or 0), then a weighted reward's terms with their scores.
    pub fn breakdown(&self) -> std::collections::BTreeMap<String, f64> {
        [("correct", self.correct), ("format_ok", self.format_ok)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), f64::from(u8::from(v))))
            .chain(
                self.components
                    .iter()
                    .map(|(k, v)| (k.clone(), f64::from(*v))),
            )
            .collect()
    }
}

/// Scores `response` against `ground_truth` with the rule `kind`.
pub fn score(kind: RewardKind, response: &str, ground_truth: &str) -> RewardOutcome {
    match kind {
        RewardKind::MathRule => math_rule::score(response, ground_truth),
        RewardKind::MathVerify => {
            math_verify::score(response, ground_truth, math_verify::Options::default())
        }
        RewardKind::ExactMatch => exact_match::score(response, ground_truth),
        RewardKind::CodeSandbox => {
            code_sandbox::score(response, ground_truth, &code_sandbox::Params::default())
        }
        RewardKind::Ifeval => ifeval::score(response, ground_truth, &ifeval::Params::default()),
        // Without a pattern, any non-empty response is "formatted".
        RewardKind::RegexMatch => regex_match::score(response, r"\S"),
        // A judge needs its model: without one, the outcome says so.
        RewardKind::LlmJudge => RewardOutcome {
            error: Some("llm_judge needs 'model' (a Hugging Face directory)".into()),
            ..RewardOutcome::unformatted()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dispatches_by_kind() {
        // "46" and "46.0" are the same number but not the same string.
        let math = score(RewardKind::MathRule, "so \\boxed{46.0}", "46");
        assert!(math.correct);
        assert_eq!(math.score, 1.0);
        let exact = score(RewardKind::ExactMatch, "46.0", "46");
        assert!(!exact.correct);
        assert_eq!(exact.score, 0.0);
        assert!(exact.format_ok);
    }

    #[test]
    fn kind_serde_names_are_snake_case() {
        for kind in RewardKind::ALL {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            let back: RewardKind = serde_json::from_str(&json).unwrap();
            assert_eq!(back, kind);
        }
        assert!(serde_json::from_str::<RewardKind>("\"math\"").is_err());
    }

    #[test]
    fn outcome_constructors() {
        let none = RewardOutcome::unformatted();
        assert_eq!(
            (none.score, none.correct, none.format_ok, none.extracted),
            (0.0, false, false, None)
        );
        let wrong = RewardOutcome::graded("3".into(), false);
        assert_eq!((wrong.score, wrong.format_ok), (0.0, true));
        let right = RewardOutcome::graded("3".into(), true);
        assert_eq!((right.score, right.correct), (1.0, true));
    }
}
