//! Finding the final answer in a response, and the answer part of a ground truth.
//!
//! In order of preference:
//! 1. the last `\boxed{..}` or `\fbox{..}` (nested braces are fine). When the LAST box never closes
//!    the response was cut off inside its answer, and it has none: earlier boxes were drafts.
//! 2. the text after the last "final answer is", "the answer is", "answer:" (and the like), up
//!    to the end of its sentence or line; a math span there (`$..$`, `\(..\)`, `\[..\]`) is the
//!    answer. So "The answer is 118. Then we add 5 to get 123." answers 118.
//! 3. the last math span, joined with the spans just before it when only `,`/`and`/`or` separate
//!    them ("$2$ and $7$"), unless a bare number comes after it;
//! 4. the last number.
//!
//! Every scan is linear in the response's length.

use crate::reward::math_rule;

/// Phrases that introduce a final answer, lowercase; the last one in the text wins.
const ANSWER_PHRASES: [&str; 9] = [
    "final answer is",
    "final answer:",
    "answer is",
    "answer:",
    "answer would be",
    "answer should be",
    "answer =",
    "solution is",
    "result is",
];

/// The final answer of `response`, or `None` when it has none.
pub fn extract_answer(response: &str) -> Option<String> {
    let phrase = after_answer_phrase(response);
    match last_box(response) {
        // A box, unless the response goes on to state another final answer (a correction).
        Box::Closed { content, end } => {
            return match phrase {
                Some((at, answer)) if at > end && !answer.contains("boxed") => Some(answer),
                _ => Some(content.trim().to_string()),
            };
        }
        Box::Truncated => return None,
        Box::Absent => {}
    }
    if let Some((_, answer)) = phrase {
        return Some(answer);
    }
    let number = math_rule::last_number_span(response);
    if let Some((end, content)) = last_math_spans(response) {
        let number_after = number.is_some_and(|(n_start, _)| n_start >= end);
        if !number_after && !content.trim().is_empty() {
            return Some(content.trim().to_string());
        }
    }
    number.map(|span| last_number_with_words(response, span))
}

/// The last number with what makes it a different number in prose: the whole part of a mixed
/// number before it (`1 1/2`) and a scale word after it (`1 million`).
fn last_number_with_words(text: &str, (mut start, mut end): (usize, usize)) -> String {
    let before = &text[..start];
    if text[start..end].contains('/') {
        let head = before.strip_suffix(' ').unwrap_or("");
        let digits = head.len() - head.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 && head.len() < before.len() {
            start -= digits + 1;
        }
    }
    let after = text[end..].to_ascii_lowercase();
    for word in [" thousand", " million", " billion", " trillion"] {
        if after.starts_with(word) {
            end += word.len();
        }
    }
    text[start..end].to_string()
}

/// The answer part of a ground truth: its last box, the tail after a GSM8K `####`, or all of it.
pub fn truth_answer(ground_truth: &str) -> String {
    if let Box::Closed { content, .. } = last_box(ground_truth) {
        return content.trim().to_string();
    }
    match ground_truth.rsplit_once("####") {
        Some((_, tail)) => tail.trim().to_string(),
        None => ground_truth.trim().to_string(),
    }
}

enum Box {
    /// The box's content and the byte offset where it ends.
    Closed {
        content: String,
        end: usize,
    },
    Truncated,
    Absent,
}

/// The last `\boxed`/`\fbox` of `text`.
fn last_box(text: &str) -> Box {
    let mut last: Option<usize> = None;
    for name in ["\\boxed", "\\fbox"] {
        for (at, _) in text.match_indices(name) {
            let after = &text[at + name.len()..];
            // `\boxedfoo` would be another macro.
            if !after.starts_with(|c: char| c.is_ascii_alphabetic()) {
                let end = at + name.len();
                last = last.max(Some(end));
            }
        }
    }
    let Some(end) = last else {
        return Box::Absent;
    };
    let rest = text[end..].trim_start();
    let rest_at = text.len() - rest.len();
    if rest.starts_with('{') {
        return match brace_content(rest) {
            Some(inner) if !inner.trim().is_empty() => Box::Closed {
                content: inner.to_string(),
                end: rest_at + inner.len() + 2,
            },
            Some(_) => Box::Absent,
            None => Box::Truncated,
        };
    }
    let token_end = rest
        .find(|c: char| c.is_whitespace() || c == '$')
        .unwrap_or(rest.len());
    match rest[..token_end].trim_end_matches('.') {
        "" => Box::Absent,
        token => Box::Closed {
            content: token.to_string(),
            end: rest_at + token_end,
        },
    }
}

/// The content of the brace group `s` starts with (`None` when it never closes).
pub fn brace_content(s: &str) -> Option<&str> {
    let mut depth = 0usize;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '{' => depth += 1,
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(&s[1..i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// The answer after the last answer phrase (see the module docs), and where the phrase is.
/// Without a math span, the sentence after the phrase must look like an answer (a number, or a
/// choice like `(B)`), so that "the answer is that we need…" is not one.
fn after_answer_phrase(text: &str) -> Option<(usize, String)> {
    // ASCII lowercase keeps byte offsets.
    let lower = text.to_ascii_lowercase();
    let (at, end) = ANSWER_PHRASES
        .iter()
        .filter_map(|p| lower.rfind(p).map(|at| (at, at + p.len())))
        .max_by_key(|&(_, end)| end)?;
    let rest = text[end..].trim_start_matches(|c: char| c.is_whitespace() || c == ':' || c == '*');
    let rest = rest.strip_prefix("is").unwrap_or(rest).trim_start();
    if let Some((_, content)) = math_span_at(rest, 0) {
        let content = content.trim();
        return (!content.is_empty()).then(|| (at, content.to_string()));
    }
    let sentence = sentence_of(rest).trim().trim_end_matches(['*', ',', ';']);
    let words = sentence.split_whitespace().count();
    let answer_like = sentence.contains(|c: char| c.is_ascii_digit() || c == '\\')
        || sentence.chars().filter(|c| c.is_alphanumeric()).count() == 1;
    (answer_like && words <= 4).then(|| (at, sentence.to_string()))
}

/// `s` up to the end of its first sentence: a newline, or a `.` that is not a decimal point.
fn sentence_of(s: &str) -> &str {
    let bytes = s.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        let next_is_digit = bytes.get(i + 1).is_some_and(u8::is_ascii_digit);
        if b == b'\n' || (b == b'.' && !next_is_digit) {
            return &s[..i];
        }
    }
    s
}

/// A math span starting exactly at byte `at`: `(end, content)`.
fn math_span_at(text: &str, at: usize) -> Option<(usize, &str)> {
    let rest = &text[at..];
    for (open, close) in [("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$")] {
        if let Some(body) = rest.strip_prefix(open) {
            let stop = find_unescaped(body, close)?;
            return Some((at + open.len() + stop + close.len(), &body[..stop]));
        }
    }
    None
}

/// Byte index of the first `pat` in `s` that is not escaped by a backslash (`\$` is currency).
fn find_unescaped(s: &str, pat: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(k) = s[from..].find(pat) {
        let at = from + k;
        let escaped = pat == "$" && s[..at].ends_with('\\');
        if !escaped {
            return Some(at);
        }
        from = at + pat.len();
    }
    None
}

/// The last math span of `text`, with the spans before it that only separators divide from it:
/// `(end, content joined by ", ")`.
fn last_math_spans(text: &str) -> Option<(usize, String)> {
    let mut spans: Vec<(usize, usize, &str)> = vec![];
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let escaped_dollar = bytes[i] == b'$' && i > 0 && bytes[i - 1] == b'\\';
        let opens = (bytes[i] == b'$' && !escaped_dollar)
            || (bytes[i] == b'\\' && matches!(bytes.get(i + 1), Some(b'(' | b'[')));
        match opens.then(|| math_span_at(text, i)).flatten() {
            Some((end, content)) => {
                spans.push((i, end, content));
                i = end;
            }
            None => i += 1,
        }
    }
    let (mut start, end, last) = *spans.last()?;
    let mut parts = vec![last.trim()];
    for &(s, e, content) in spans.iter().rev().skip(1) {
        let between = text[e..start].trim().to_ascii_lowercase();
        let separator = matches!(
            between.as_str(),
            "," | "and" | "or" | ", and" | ", or" | ";"
        );
        if !separator {
            break;
        }
        parts.push(content.trim());
        start = s;
    }
    parts.reverse();
    Some((end, parts.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(s: &str) -> Option<String> {
        extract_answer(s)
    }

    #[test]
    fn boxes_nested_and_truncated() {
        assert_eq!(
            answer("so \\boxed{\\frac{1}{2}} ok").as_deref(),
            Some("\\frac{1}{2}")
        );
        assert_eq!(answer("\\fbox{3} then \\boxed{4}").as_deref(), Some("4"));
        assert_eq!(answer("\\boxed{3} then \\fbox{5}").as_deref(), Some("5"));
        // Cut off inside the final box: no answer, even with an earlier box.
        assert_eq!(answer("\\boxed{3}. Wait, \\boxed{\\frac{1}{"), None);
        assert_eq!(answer("\\boxed 7 is it").as_deref(), Some("7"));
        assert_eq!(answer("\\boxed{} so 12").as_deref(), Some("12"));
    }

    #[test]
    fn answer_phrases_beat_later_numbers_and_correct_a_box() {
        assert_eq!(
            answer("So $\\boxed{23}$.\n\nWait, I double-counted: 25.\n\nFinal answer: 25")
                .as_deref(),
            Some("25")
        );
        assert_eq!(answer("Final answer: \\boxed{7}").as_deref(), Some("7"));
        assert_eq!(
            answer("the only solution is $f(x) = x$ for all real $x$").as_deref(),
            Some("f(x) = x")
        );
        assert_eq!(
            answer("The answer is 118. Then we add 5 to get 123.").as_deref(),
            Some("118")
        );
        assert_eq!(
            answer("Final answer: $\\frac{3}{4}$.").as_deref(),
            Some("\\frac{3}{4}")
        );
        assert_eq!(
            answer("**Answer:** 3.5\nCheck: 7/2").as_deref(),
            Some("3.5")
        );
        assert_eq!(answer("The answer is (B).").as_deref(), Some("(B)"));
        // An explanation after the phrase falls back to the last number.
        assert_eq!(
            answer("The answer is that we need to count 6 ways").as_deref(),
            Some("6")
        );
    }

    #[test]
    fn math_spans_and_numbers() {
        assert_eq!(answer("so $x = 5$").as_deref(), Some("x = 5"));
        assert_eq!(answer("roots $2$ and $7$").as_deref(), Some("2, 7"));
        assert_eq!(answer("\\[ \\sqrt{12} \\]").as_deref(), Some("\\sqrt{12}"));
        // A number after the last span is the later statement.
        assert_eq!(answer("with $x=5$ we get 12 apples").as_deref(), Some("12"));
        assert_eq!(answer("costs \\$5 and \\$7").as_deref(), Some("7"));
        assert_eq!(answer("no answer here"), None);
        assert_eq!(answer("It takes 1 1/2 hours.").as_deref(), Some("1 1/2"));
        assert_eq!(
            answer("It is 1 Million dollars.").as_deref(),
            Some("1 Million")
        );
        assert_eq!(answer("We need 12 1/2 = 6 pairs").as_deref(), Some("6"));
    }

    #[test]
    fn truth_forms() {
        assert_eq!(truth_answer("steps\n#### 1,000"), "1,000");
        assert_eq!(truth_answer("\\boxed{(1, 2)}"), "(1, 2)");
        assert_eq!(truth_answer(" 5 "), "5");
    }
}
