//! Math rule reward: extract the model's final answer and compare it with the ground truth as a number.
//!
//! The final answer is the content of the LAST balanced, non-empty `\boxed{...}` (nested braces such as
//! `\boxed{\frac{1}{2}}` are fine; `\boxed 5` without braces is taken up to the next space or `$`). A
//! `\boxed{` whose braces never close (a truncated response) is ignored. Without any box, the answer is
//! the last number in the text: `"the answer is 46."` gives `46`, `"12+34=46"` gives `46`, and
//! `"x = -3"` gives `-3` (a `-` is a sign only after a space, the start, or one of `=([{,:;$<>~`, so
//! `"5-3"` gives `3`). A text number may carry thousands separators (`1,000`), a decimal part, a
//! `/denominator`, or be a whole `\frac{..}{..}`. See [`number`] for what parses as a number.
//!
//! The ground truth may itself contain `\boxed{...}` (its last box is used) or a GSM8K-style
//! `#### 72` tail (the part after the last `####` is used). When the ground truth is a number the answer
//! must parse to an equal number (exact for fractions, relative tolerance [`number::REL_TOL`]
//! otherwise). When it is not a number, the two are compared as strings after trimming and removing `$`,
//! whitespace and a trailing `.` — so non-numeric answers (`\boxed{A}`, `\boxed{x^2}`) need a box.

pub mod number;

use super::RewardOutcome;
use number::{Number, brace_group, parse_number};

/// Scores one response. No extractable answer: `format_ok` false, score 0.
pub fn score(response: &str, ground_truth: &str) -> RewardOutcome {
    match extract_answer(response) {
        None => RewardOutcome::unformatted(),
        Some(answer) => {
            let correct = answers_match(&answer, ground_truth);
            RewardOutcome::graded(answer, correct)
        }
    }
}

/// The final answer of a response: the last `\boxed{...}`, else the last number; trimmed.
pub fn extract_answer(response: &str) -> Option<String> {
    last_boxed(response)
        .or_else(|| last_number(response))
        .map(|s| s.trim().to_string())
}

/// Whether an extracted `answer` matches `ground_truth` (see the module docs for the rules).
pub fn answers_match(answer: &str, ground_truth: &str) -> bool {
    let truth = truth_answer(ground_truth);
    match parse_number(truth) {
        Some(expected) => parse_number(answer).is_some_and(|got: Number| got.approx_eq(expected)),
        None => {
            let expected = normalize_text(truth);
            !expected.is_empty() && normalize_text(answer) == expected
        }
    }
}

/// The answer part of a ground truth: its last box, the tail after `####`, or the whole string.
fn truth_answer(ground_truth: &str) -> &str {
    if let Some(boxed) = last_boxed(ground_truth) {
        return boxed;
    }
    match ground_truth.rsplit_once("####") {
        Some((_, tail)) => tail.trim(),
        None => ground_truth.trim(),
    }
}

fn normalize_text(s: &str) -> String {
    let mut out: String = s
        .trim()
        .chars()
        .filter(|&c| c != '$' && !c.is_whitespace())
        .collect();
    while out.ends_with('.') {
        out.pop();
    }
    out
}

/// Content of the last balanced, non-empty `\boxed{...}` (or `\boxed X`).
fn last_boxed(text: &str) -> Option<&str> {
    const MACRO: &str = "\\boxed";
    let mut found = None;
    for (at, _) in text.match_indices(MACRO) {
        let rest = &text[at + MACRO.len()..];
        // `\boxedfoo` would be another macro.
        if rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
            continue;
        }
        let rest = rest.trim_start();
        let content = if rest.starts_with('{') {
            brace_group(rest).map(|(inner, _)| inner)
        } else {
            let end = rest
                .find(|c: char| c.is_whitespace() || c == '$')
                .unwrap_or(rest.len());
            Some(&rest[..end])
        };
        if let Some(content) = content.filter(|c| !c.trim().is_empty()) {
            found = Some(content);
        }
    }
    found
}

/// The last number-like token of free text (see the module docs).
fn last_number(text: &str) -> Option<&str> {
    last_number_span(text).map(|(start, end)| &text[start..end])
}

/// Byte range of the last number-like token of free text (see the module docs).
pub(crate) fn last_number_span(text: &str) -> Option<(usize, usize)> {
    let bytes = text.as_bytes();
    let mut last = None;
    let mut i = 0;
    while i < bytes.len() {
        if let Some(end) = frac_macro_at(text, i) {
            last = Some((i, end));
            i = end;
        } else if let Some((start, end)) = number_at(text, i) {
            last = Some((start, end));
            i = end;
        } else {
            i += 1;
        }
    }
    last
}

/// End of a parseable `\frac{..}{..}` (or `\dfrac`, `\tfrac`) starting at byte `i`.
fn frac_macro_at(text: &str, i: usize) -> Option<usize> {
    // Only slice at an ASCII byte, which is always a char boundary.
    if text.as_bytes()[i] != b'\\' {
        return None;
    }
    let rest = &text[i..];
    let after = ["\\frac", "\\dfrac", "\\tfrac"]
        .iter()
        .find_map(|m| rest.strip_prefix(m))?;
    let (_, tail) = brace_group(after)?;
    let (_, tail) = brace_group(tail)?;
    let end = text.len() - tail.len();
    parse_number(&text[i..end]).map(|_| end)
}

/// A number starting at byte `i` (at a digit, or at `.` followed by a digit): `(start, end)`, where
/// `start` may move back over a sign.
fn number_at(text: &str, i: usize) -> Option<(usize, usize)> {
    let bytes = text.as_bytes();
    let digit_at = |k: usize| bytes.get(k).is_some_and(u8::is_ascii_digit);
    let starts = digit_at(i) || (bytes[i] == b'.' && digit_at(i + 1));
    if !starts {
        return None;
    }
    let start = sign_before(text, i).unwrap_or(i);
    let run = |mut k: usize| {
        while digit_at(k) {
            k += 1;
        }
        k
    };
    let mut end = run(i);
    // Thousands groups: only after a head of 1-3 digits, exactly three digits each, not followed by
    // a further digit (so "1,2,3" stays three numbers and "1,0000" is "1" then "0000").
    if (1..=3).contains(&(end - i)) {
        while bytes.get(end) == Some(&b',')
            && (1..=3).all(|d| digit_at(end + d))
            && !digit_at(end + 4)
        {
            end += 4;
        }
    }
    if bytes.get(end) == Some(&b'.') && digit_at(end + 1) {
        end = run(end + 1);
    }
    if bytes.get(end) == Some(&b'/') && digit_at(end + 1) {
        end = run(end + 1);
        if bytes.get(end) == Some(&b'.') && digit_at(end + 1) {
            end = run(end + 1);
        }
    }
    Some((start, end))
}

/// Byte index of a sign directly before byte `i`, if it reads as a sign rather than a minus operator.
fn sign_before(text: &str, i: usize) -> Option<usize> {
    let before = &text[..i];
    let sign = before
        .strip_suffix('-')
        .or_else(|| before.strip_suffix('\u{2212}'))?;
    let ok = match sign.chars().next_back() {
        None => true,
        Some(c) => c.is_whitespace() || "=([{,:;$<>~".contains(c),
    };
    ok.then_some(sign.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(response: &str, truth: &str) -> RewardOutcome {
        score(response, truth)
    }

    #[test]
    fn last_box_wins() {
        let out = check("first \\boxed{3}, then I fix it: \\boxed{4}", "4");
        assert!(out.correct);
        assert_eq!(out.extracted.as_deref(), Some("4"));
        assert!(!check("\\boxed{4} no wait \\boxed{3}", "4").correct);
    }

    #[test]
    fn nested_braces_in_box() {
        let out = check("so $\\boxed{\\frac{1}{2}}$.", "0.5");
        assert_eq!(out.extracted.as_deref(), Some("\\frac{1}{2}"));
        assert!(out.correct);
        assert_eq!(out.score, 1.0);
        assert!(check("\\boxed{\\dfrac{3}{4}}", "3/4").correct);
        assert!(check("\\boxed{{\\frac{6}{8}}}", "\\frac{3}{4}").correct);
    }

    #[test]
    fn box_without_braces() {
        assert_eq!(
            extract_answer("the answer is $\\boxed 5$").as_deref(),
            Some("5")
        );
        assert_eq!(
            extract_answer("\\boxed   -12 apples").as_deref(),
            Some("-12")
        );
    }

    #[test]
    fn unbalanced_box_is_ignored() {
        // Truncated: the box never closes, so the last number of the text is used.
        let out = check("we get 7 and so \\boxed{12", "12");
        assert_eq!(out.extracted.as_deref(), Some("12"));
        assert!(out.correct);
        // An earlier complete box beats text numbers.
        let out = check("\\boxed{5} ... \\boxed{\\frac{1}{2}", "5");
        assert_eq!(out.extracted.as_deref(), Some("5"));
        // Extra closing braces after a box do not matter.
        assert!(check("\\boxed{9}}}", "9").correct);
        // Unbalanced and no number anywhere.
        assert!(!check("\\boxed{x", "3").format_ok);
    }

    #[test]
    fn empty_box_is_no_answer() {
        assert_eq!(extract_answer("\\boxed{}"), None);
        assert_eq!(extract_answer("\\boxed{ } so 8").as_deref(), Some("8"));
    }

    #[test]
    fn other_macros_are_not_boxes() {
        assert_eq!(extract_answer("\\boxedfoo{3} then 4").as_deref(), Some("4"));
    }

    #[test]
    fn last_number_in_text() {
        assert_eq!(extract_answer("the answer is 46.").as_deref(), Some("46"));
        assert_eq!(extract_answer("12+34=46").as_deref(), Some("46"));
        assert_eq!(extract_answer("x = -3").as_deref(), Some("-3"));
        assert_eq!(extract_answer("-3").as_deref(), Some("-3"));
        assert_eq!(extract_answer("5-3").as_deref(), Some("3"));
        assert_eq!(
            extract_answer("costs 1,000 dollars").as_deref(),
            Some("1,000")
        );
        assert_eq!(extract_answer("1,2,3").as_deref(), Some("3"));
        assert_eq!(extract_answer("it is 3.50 now").as_deref(), Some("3.50"));
        assert_eq!(extract_answer("about .5").as_deref(), Some(".5"));
        assert_eq!(extract_answer("ratio 7/2, done").as_deref(), Some("7/2"));
        assert_eq!(
            extract_answer("so $\\frac{1}{2}$").as_deref(),
            Some("\\frac{1}{2}")
        );
        assert_eq!(extract_answer("(-4)").as_deref(), Some("-4"));
        assert_eq!(extract_answer("is \u{2212}4").as_deref(), Some("\u{2212}4"));
    }

    #[test]
    fn text_numbers_score() {
        assert!(check("the answer is 46.", "46").correct);
        assert!(check("12+34=46", "46").correct);
        assert!(check("x = -3", "-3").correct);
        assert!(!check("x = -3", "3").correct);
        assert!(check("so we need 1,000 bricks", "1000").correct);
        assert!(check("is \u{2212}4", "-4").correct);
    }

    #[test]
    fn numeric_equivalences() {
        assert!(check("\\boxed{1,000}", "1000").correct);
        assert!(check("\\boxed{1000}", "1,000").correct);
        assert!(check("\\boxed{3.50}", "7/2").correct);
        assert!(check("\\boxed{7/2}", "3.5").correct);
        assert!(check("\\boxed{0.5}", "\\frac{1}{2}").correct);
        assert!(check("\\boxed{-0.25}", "-\\frac{1}{4}").correct);
        assert!(check("\\boxed{x = 5}", "5").correct);
        assert!(check("\\boxed{\\$18}", "18").correct);
        assert!(check("\\boxed{46}", "46.0").correct);
        assert!(!check("\\boxed{0.333}", "1/3").correct);
        assert!(!check("\\boxed{-5}", "5").correct);
    }

    #[test]
    fn float_tolerance() {
        // 1e-6 relative: 2.5e3 vs 2500.0001 differs by 4e-8 relative.
        assert!(check("\\boxed{2.5e3}", "2500.0001").correct);
        assert!(!check("\\boxed{2.5e3}", "2501").correct);
    }

    #[test]
    fn ground_truth_forms() {
        assert!(check("\\boxed{72}", "Natalia sold 48/2 = 24 clips ... #### 72").correct);
        assert!(check("so 72", "\\boxed{72}").correct);
        assert!(check("\\boxed{72}", "  72  ").correct);
    }

    #[test]
    fn non_numeric_truth_compares_strings() {
        assert!(check("\\boxed{A}", "A").correct);
        assert!(check("\\boxed{ x^2 + 1 }", "$x^2+1$").correct);
        assert!(!check("\\boxed{B}", "A").correct);
        assert!(!check("\\boxed{a}", "A").correct);
        // Without a box, a non-numeric answer cannot be extracted.
        let out = check("The answer is A", "A");
        assert!(!out.format_ok && !out.correct);
        // An empty ground truth never matches.
        assert!(!check("\\boxed{x}", "").correct);
    }

    #[test]
    fn unparsable_answer_against_numeric_truth() {
        let out = check("\\boxed{x+1}", "3");
        assert!(out.format_ok);
        assert!(!out.correct);
        assert_eq!(out.score, 0.0);
        assert_eq!(out.extracted.as_deref(), Some("x+1"));
    }

    #[test]
    fn no_answer_at_all() {
        for response in ["", "   ", "I don't know.", "\\boxed{}", "one, two, three"] {
            let out = check(response, "3");
            assert!(!out.format_ok, "{response:?}");
            assert!(!out.correct);
            assert_eq!(out.score, 0.0);
            assert_eq!(out.extracted, None);
        }
    }

    #[test]
    fn unicode_text_does_not_split_characters() {
        assert!(check("答案是 42。", "42").correct);
        assert!(check("ünïcödé → \\boxed{7} ✓", "7").correct);
        assert_eq!(extract_answer("¿ − ?"), None);
    }

    #[test]
    fn malformed_input_never_panics() {
        let nasty = [
            "\\",
            "\\frac",
            "\\frac{",
            "{{{{",
            "}}}}",
            "\\boxed{\\}",
            "-",
            ".",
            "1,",
            "1/",
            "\\boxed",
            "\\boxed{\\frac{1}{0}}",
            "−",
            "1,000,",
            "\\frac{1}{\\frac{1}{\\frac{1}{\\frac{1}{\\frac{1}{\\frac{1}{\\frac{1}{\\frac{1}{\\frac{1}{\\frac{1}{2}}}}}}}}}}",
        ];
        for response in nasty {
            let _ = check(response, "1");
            let _ = check("\\boxed{1}", response);
        }
        assert!(!check("\\boxed{1/0}", "1").correct);
        // Every truncation of a realistic response (as a length limit would cut it).
        let full =
            "Let x = −3. Then \\boxed{\\dfrac{1,000}{8}} — i.e. 125 ✓, not \\boxed 7 or 12/4=3.";
        for (cut, _) in full.char_indices() {
            let _ = check(&full[..cut], "125");
        }
        assert!(check(full, "7").correct);
    }
}
