//! Exact-match reward: the whole response, trimmed, must equal the ground truth, trimmed.
//!
//! No normalisation beyond surrounding whitespace: case, punctuation and inner spacing all count. Use
//! `math_rule` for anything numeric.

use super::RewardOutcome;

/// Scores `response` against `ground_truth`; an empty (all-whitespace) response is unformatted.
pub fn score(response: &str, ground_truth: &str) -> RewardOutcome {
    let answer = response.trim();
    if answer.is_empty() {
        return RewardOutcome::unformatted();
    }
    RewardOutcome::graded(answer.to_string(), answer == ground_truth.trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_both_sides() {
        let out = score("  Paris\n", "Paris ");
        assert!(out.correct);
        assert_eq!(out.score, 1.0);
        assert_eq!(out.extracted.as_deref(), Some("Paris"));
    }

    #[test]
    fn case_and_inner_space_matter() {
        assert!(!score("paris", "Paris").correct);
        assert!(!score("New  York", "New York").correct);
        assert!(!score("Paris.", "Paris").correct);
    }

    #[test]
    fn empty_response_is_unformatted() {
        for response in ["", "   ", "\n\t"] {
            let out = score(response, "Paris");
            assert!(!out.format_ok);
            assert!(!out.correct);
            assert_eq!(out.score, 0.0);
            assert_eq!(out.extracted, None);
        }
    }

    #[test]
    fn wrong_answer_is_formatted_but_scores_zero() {
        let out = score("Lyon", "Paris");
        assert!(out.format_ok);
        assert!(!out.correct);
        assert_eq!(out.score, 0.0);
    }
}
