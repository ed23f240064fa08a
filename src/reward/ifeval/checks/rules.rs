//! The instructions whose rules take more than a line (IFEval's quirks kept, each in a comment).

use std::sync::OnceLock;

use regex::Regex;

use super::super::text::{py_space, py_strip, py_word_char};

fn cached(cell: &'static OnceLock<Regex>, pattern: &str) -> &'static Regex {
    cell.get_or_init(|| Regex::new(pattern).expect("a valid pattern"))
}

/// `\[.*?\]`: lazy, within a line, `[]` counts.
pub fn placeholder_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    cached(&RE, r"\[.*?\]")
}

/// `<<[^\n]+>>`, greedy within a line.
pub fn title_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    cached(&RE, r"<<[^\n]+>>")
}

/// IFEval's bullet patterns, `^\s*\*[^\*].*$` and `^\s*-.*$` (multi-line; `\s` and `[^\*]` may
/// cross a line end, so `*\n* item` is one bullet, as in IFEval).
pub fn bullet_regexes() -> (&'static Regex, &'static Regex) {
    static STARS: OnceLock<Regex> = OnceLock::new();
    static DASHES: OnceLock<Regex> = OnceLock::new();
    (
        cached(&STARS, r"(?m)^\s*\*[^\*].*$"),
        cached(&DASHES, r"(?m)^\s*-.*$"),
    )
}

/// `w` as a whole word (Python's `\b` on both sides), case-insensitively.
pub fn whole_word_in(word: &str, text: &str) -> bool {
    let Ok(re) = regex::RegexBuilder::new(&regex::escape(word))
        .case_insensitive(true)
        .build()
    else {
        return false;
    };
    // Every overlapping start, since a match failing the boundary test may hide one that passes.
    let mut from = 0;
    while let Some(m) = re.find_at(text, from) {
        let before = text[..m.start()].chars().next_back();
        let after = text[m.end()..].chars().next();
        let first = m.as_str().chars().next();
        let last = m.as_str().chars().next_back();
        let edge = |outside: Option<char>, inside: Option<char>| {
            outside.map(py_word_char) != inside.map(py_word_char) || outside.is_none()
        };
        if edge(before, first) && edge(after, last) {
            return true;
        }
        from = m.start() + m.as_str().chars().next().map_or(1, char::len_utf8);
    }
    false
}

/// Paragraphs separated by `***` (one optional whitespace char each side); an empty piece in the
/// middle fails (None), empty first and last pieces are not paragraphs.
pub fn star_paragraphs(value: &str) -> Option<usize> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let parts: Vec<&str> = cached(&RE, r"\s?\*\*\*\s?").split(value).collect();
    let mut n = parts.len();
    for (i, p) in parts.iter().enumerate() {
        if py_strip(p).is_empty() {
            if i == 0 || i == parts.len() - 1 {
                n -= 1;
            } else {
                return None;
            }
        }
    }
    Some(n)
}

/// IFEval's `nth_paragraph_first_word`: paragraphs split on `\n\n`; blank pieces do not count but
/// still take their index; the first word loses leading quotes and is cut at `. , ? ! ' "`.
pub fn nth_paragraph_first_word(value: &str, paragraphs: usize, nth: usize, word: &str) -> bool {
    let pieces: Vec<&str> = value.split("\n\n").collect();
    let n = pieces.len() - pieces.iter().filter(|p| py_strip(p).is_empty()).count();
    if nth == 0 || nth > n {
        return false;
    }
    let p = py_strip(pieces[nth - 1]);
    let Some(first) = p.split(py_space).find(|t| !t.is_empty()) else {
        return false;
    };
    let first = first.trim_start_matches('\'').trim_start_matches('"');
    let fw: String = first
        .chars()
        .take_while(|c| !matches!(c, '.' | ',' | '?' | '!' | '\'' | '"'))
        .flat_map(char::to_lowercase)
        .collect();
    n == paragraphs && fw == word
}

/// `*span*` and `**span**` parts with non-blank text (both patterns counted, as IFEval does:
/// `***x***` counts twice).
pub fn highlights(value: &str) -> usize {
    static SINGLE: OnceLock<Regex> = OnceLock::new();
    static DOUBLE: OnceLock<Regex> = OnceLock::new();
    let single = cached(&SINGLE, r"\*[^\n\*]*\*")
        .find_iter(value)
        .filter(|m| !py_strip(m.as_str().trim_matches('*')).is_empty())
        .count();
    let double = cached(&DOUBLE, r"\*\*[^\n\*]*\*\*")
        .find_iter(value)
        .filter(|m| {
            let inner = &m.as_str()[2..m.as_str().len() - 2];
            !py_strip(inner).is_empty()
        })
        .count();
    single + double
}

/// Exactly two different non-blank responses separated by `******` (blank pieces only at the ends).
pub fn two_responses(value: &str) -> bool {
    let parts: Vec<&str> = value.split("******").collect();
    let mut valid = vec![];
    for (i, p) in parts.iter().enumerate() {
        if py_strip(p).is_empty() {
            if i != 0 && i != parts.len() - 1 {
                return false;
            }
        } else {
            valid.push(*p);
        }
    }
    valid.len() == 2 && py_strip(valid[0]) != py_strip(valid[1])
}

/// langdetect (seed 0, so the same text always gets the same answer) says `code`; text in which it
/// finds no features (digits, symbols) counts as followed, as IFEval counts it.
pub fn detected_language_is(value: &str, code: &str) -> bool {
    static FACTORY: OnceLock<langdetect::DetectorFactory> = OnceLock::new();
    let factory = FACTORY.get_or_init(|| {
        let mut f = langdetect::DetectorFactory::builtin().clone();
        f.seed = langdetect::Seed::Int(0);
        f
    });
    match factory.detect(value) {
        Ok(lang) => lang == code,
        Err(_) => true,
    }
}
