//! Math verifier reward (`math_verify`): the final answer of a response against the ground truth,
//! compared as mathematics rather than as one number.
//!
//! [`extract`] finds the answer (boxes, answer phrases, math spans, the last number); [`lex`] and
//! [`parse`] read LaTeX or plain text into a tree (numbers with thousands separators, decimals,
//! scientific notation, fractions, mixed numbers, percentages, degrees and units stripped, `\sqrt`,
//! `\pi`, powers, products, functions, tuples, intervals, sets, unions, equations, several answers);
//! [`compare`] decides equality by value and by evaluation at sample points. What does not parse
//! (`\text{Monday}`, an inequality) is compared as normalised text.
//!
//! Like every rule reward, it is total and bounded: any input gets an outcome, answers longer than
//! [`MAX_ANSWER_CHARS`] are compared as text, and parsing stops at [`parse::MAX_DEPTH`].

pub mod compare;
pub mod extract;
pub mod lex;
pub mod parse;

use std::borrow::Cow;

use super::RewardOutcome;
pub use compare::Options;

/// Longest answer parsed as mathematics; longer ones are compared as text.
pub const MAX_ANSWER_CHARS: usize = 2_000;
const MAX_TOKENS: usize = 2_000;

impl Default for Options {
    fn default() -> Self {
        Options {
            percent_is_fraction: true,
        }
    }
}

/// Scores one response: 1 when its final answer equals the ground truth's.
pub fn score(response: &str, ground_truth: &str, options: Options) -> RewardOutcome {
    match extract::extract_answer(response) {
        None => RewardOutcome::unformatted(),
        Some(answer) => {
            let correct = answers_match(&answer, &extract::truth_answer(ground_truth), options);
            RewardOutcome::graded(answer, correct)
        }
    }
}

/// Whether an extracted answer equals a ground truth's answer part.
pub fn answers_match(answer: &str, truth: &str, options: Options) -> bool {
    match (parsed(answer), parsed(truth)) {
        (Some(a), Some(t)) => compare::items_equal(&a, &t, options),
        _ => {
            let t = normalize_text(truth);
            !t.is_empty() && normalize_text(answer) == t
        }
    }
}

fn parsed(s: &str) -> Option<Vec<parse::Node>> {
    if s.len() > MAX_ANSWER_CHARS {
        return None;
    }
    let toks = lex::lex(&without_thousands_commas(s), MAX_TOKENS)?;
    parse::parse_answer(&toks)
}

/// `1,000` and `12,345.6` lose their commas, but only when every comma of the answer is such a
/// separator and no bracket makes commas part of a tuple (`(1,234)` is a pair, `2,7` two answers).
fn without_thousands_commas(s: &str) -> Cow<'_, str> {
    let b = s.as_bytes();
    if !s.contains(',') || s.contains(['(', '[', '{']) {
        return Cow::Borrowed(s);
    }
    let digit = |k: usize| b.get(k).is_some_and(u8::is_ascii_digit);
    let all_separators = b
        .iter()
        .enumerate()
        .filter(|&(_, &c)| c == b',')
        .all(|(k, _)| {
            let head = (0..k).rev().take_while(|&j| digit(j)).count();
            head >= 1 && (1..=3).all(|d| digit(k + d)) && !digit(k + 4)
        });
    if all_separators {
        Cow::Owned(s.replace(',', ""))
    } else {
        Cow::Borrowed(s)
    }
}

/// Text for the fallback comparison: lowercase, without spacing, `$`, braces, text macros and a
/// final full stop.
fn normalize_text(s: &str) -> String {
    let mut t = s.to_lowercase();
    for noise in [
        "\\text", "\\mathrm", "\\textbf", "\\mathbf", "\\left", "\\right", "\\!", "\\,", "\\;",
    ] {
        t = t.replace(noise, "");
    }
    let mut out: String = t
        .chars()
        .filter(|c| !c.is_whitespace() && !matches!(c, '$' | '{' | '}'))
        .collect();
    while out.ends_with('.') {
        out.pop();
    }
    // A choice written `(C)` is the choice `C`.
    match out.strip_prefix('(').and_then(|o| o.strip_suffix(')')) {
        Some(inner) if inner.chars().count() == 1 => inner.to_string(),
        _ => out,
    }
}

#[cfg(test)]
mod tests;
