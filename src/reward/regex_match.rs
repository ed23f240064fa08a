//! Format reward (`regex_match`): 1 when the response matches a regular expression (a boxed answer,
//! a code block, a required phrase), so that a weighted reward can pay for format apart from
//! correctness. The pattern is checked when the config is loaded; the ground truth is not read.

use regex::Regex;

use super::RewardOutcome;

/// Longest pattern accepted (the regex crate bounds matching time; this bounds compiling).
pub const MAX_PATTERN: usize = 1_000;

/// Compiles `pattern`, or says why it is not one.
pub fn compile(pattern: &str) -> Result<Regex, String> {
    if pattern.len() > MAX_PATTERN {
        return Err(format!(
            "the pattern is longer than {MAX_PATTERN} characters"
        ));
    }
    Regex::new(pattern).map_err(|e| format!("'{pattern}' is not a regular expression: {e}"))
}

/// Scores one response: 1 when `pattern` matches somewhere in it; `extracted` is the match.
pub fn score(response: &str, pattern: &str) -> RewardOutcome {
    let re = match compile(pattern) {
        Ok(re) => re,
        Err(e) => {
            return RewardOutcome {
                error: Some(format!("regex_match: {e}")),
                ..RewardOutcome::unformatted()
            };
        }
    };
    match re.find(response) {
        Some(m) => RewardOutcome::graded(m.as_str().to_string(), true),
        None => RewardOutcome::unformatted(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_score_one_and_say_what_matched() {
        let boxed = r"\\boxed\{[^}]*\}";
        let out = score("so \\boxed{12} done", boxed);
        assert_eq!((out.score, out.correct), (1.0, true));
        assert_eq!(out.extracted.as_deref(), Some("\\boxed{12}"));
        let out = score("so 12", boxed);
        assert_eq!((out.score, out.format_ok), (0.0, false));
        assert!(
            compile("(unclosed")
                .unwrap_err()
                .contains("is not a regular expression")
        );
        assert!(score("x", "(").error.is_some());
    }
}
