//! Text primitives with the meaning IFEval's checkers give them (they are Python's): words are
//! runs of Python's `\w` (letters, numbers, `_`; not combining marks), whitespace is Python's
//! `str.isspace`, `isupper`/`islower` are Python's, JSON is what `json.loads` accepts.
//!
//! Two are approximations, said where they are: sentences (IFEval uses NLTK's trained Punkt model)
//! and the word tokens of `change_case:capital_word_frequency` (NLTK's Treebank tokenizer).

use std::sync::OnceLock;

use regex::Regex;

/// Python's `str.isspace` (Unicode White_Space plus U+001C..U+001F).
pub fn py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()`.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(py_space)
}

fn word_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    // Python's `\w`: general categories L* and N*, and `_` (no combining marks, unlike Rust's).
    RE.get_or_init(|| Regex::new(r"[\p{L}\p{N}_]+").expect("a valid pattern"))
}

/// Python's `\w` for one char.
pub fn py_word_char(c: char) -> bool {
    let mut buf = [0u8; 4];
    word_regex().is_match(c.encode_utf8(&mut buf))
}

/// `len(re.findall(r"\w+", text))`: "don't" is 2 words, "e-mail" 2, "3.14" 2.
pub fn count_words(text: &str) -> usize {
    word_regex().find_iter(text).count()
}

/// Abbreviations of NLTK's English Punkt model (lowercase, without their final period): a
/// period after one of them does not end a sentence.
const ABBREVIATIONS: [&str; 155] = [
    "a.a", "a.c", "a.d", "a.g", "a.h", "a.m", "a.m.e", "a.s", "a.t", "adm", "ala", "ariz", "aug",
    "ave", "b.f", "b.v", "bros", "c", "c.i.t", "c.o.m.b", "c.v", "calif", "chg", "cie", "co",
    "col", "colo", "conn", "corp", "cos", "ct", "d", "d.c", "d.h", "d.w", "dec", "dr", "e", "e.f",
    "e.h", "e.l", "e.m", "f", "f.g", "f.j", "feb", "fla", "fri", "ft", "g", "g.d", "g.f", "g.k",
    "ga", "gen", "h", "h.c", "h.f", "h.m", "i.m.s", "ill", "inc", "j.b", "j.c", "j.j", "j.k",
    "j.p", "j.r", "jan", "jr", "k", "kan", "ky", "l", "l.a", "l.f", "l.p", "lt", "ltd", "m",
    "m.b.a", "m.d.c", "m.j", "maj", "messrs", "mg", "mich", "minn", "mr", "mrs", "ms", "n", "n.c",
    "n.d", "n.h", "n.j", "n.m", "n.v", "n.y", "nev", "nov", "oct", "ok", "okla", "ore", "p",
    "p.a.m", "p.m", "pa", "ph.d", "prof", "r", "r.a", "r.h", "r.i", "r.j", "r.k", "r.t", "rep",
    "reps", "s", "s.a", "s.a.y", "s.c", "s.g", "s.p.a", "s.s", "sen", "sep", "sept", "sr", "st",
    "sw", "t", "t.j", "tenn", "tues", "u.k", "u.n", "u.s", "u.s.a", "u.s.s.r", "v", "va", "vs",
    "vt", "w", "w.c", "w.r", "w.va", "w.w", "wash", "wed", "wis", "yr",
];

/// Sentences, as Punkt splits English text but without its orthographic statistics: a sentence
/// ends at a run of `.`, `?` or `!` (with closing quotes and brackets after it) that is followed by
/// whitespace or the end of the text, unless the period ends a known abbreviation (`Mr.`, `U.S.`,
/// `p.m.`) or a single letter that starts the next word in lowercase. Text without such an end is one
/// sentence; blank text none. (IFEval uses NLTK's trained Punkt model, whose statistics over
/// 20,000 word types also look at the case of the word after a period; this agrees with it on
/// ordinary prose and on IFEval's own test strings.)
pub fn count_sentences(text: &str) -> usize {
    let chars: Vec<char> = text.chars().collect();
    let mut sentences = 0;
    let mut has_content = false;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if matches!(c, '.' | '?' | '!') {
            let mut end = i;
            while end + 1 < chars.len() && matches!(chars[end + 1], '.' | '?' | '!') {
                end += 1;
            }
            let mut after = end + 1;
            while after < chars.len()
                && matches!(chars[after], '"' | '\'' | ')' | ']' | '}' | '”' | '’')
            {
                after += 1;
            }
            let boundary = after >= chars.len() || py_space(chars[after]);
            if boundary && has_content && !(c == '.' && end == i && abbreviation_before(&chars, i))
            {
                sentences += 1;
                has_content = false;
            }
            i = after;
            continue;
        }
        if !py_space(c) {
            has_content = true;
        }
        i += 1;
    }
    sentences + usize::from(has_content)
}

/// Whether the period at `chars[at]` ends a known abbreviation.
fn abbreviation_before(chars: &[char], at: usize) -> bool {
    let mut start = at;
    while start > 0 && !py_space(chars[start - 1]) && !matches!(chars[start - 1], '(' | '"' | '\'')
    {
        start -= 1;
    }
    let token: String = chars[start..at].iter().collect::<String>().to_lowercase();
    ABBREVIATIONS.contains(&token.as_str())
}

/// Python's `str.isupper()`: at least one cased char and no lowercase or titlecase one.
pub fn py_isupper(s: &str) -> bool {
    let mut cased = false;
    for c in s.chars() {
        if c.is_lowercase() || is_titlecase(c) {
            return false;
        }
        cased |= c.is_uppercase();
    }
    cased
}

/// Python's `str.islower()`.
pub fn py_islower(s: &str) -> bool {
    let mut cased = false;
    for c in s.chars() {
        if c.is_uppercase() || is_titlecase(c) {
            return false;
        }
        cased |= c.is_lowercase();
    }
    cased
}

/// General category Lt (the 31 titlecase letters, `ǅ` and Greek capitals with prosgegrammeni).
fn is_titlecase(c: char) -> bool {
    matches!(c as u32, 0x1C5 | 0x1C8 | 0x1CB | 0x1F2 | 0x1F88..=0x1F8F | 0x1F98..=0x1F9F
        | 0x1FA8..=0x1FAF | 0x1FBC | 0x1FCC | 0x1FFC)
}

/// Word tokens as NLTK's `word_tokenize` cuts them, closely enough to count capital words:
/// whitespace-separated, punctuation at either end split off, `n't` and `'s`-style clitics split
/// from their word (`DON'T` is `DO` and `N'T`, `NASA's` is `NASA` and `'s`); inner periods and
/// hyphens stay (`U.S.`, `WELL-KNOWN`).
pub fn word_tokens(text: &str) -> Vec<String> {
    let mut out = vec![];
    for raw in text.split(py_space).filter(|t| !t.is_empty()) {
        let trimmed = raw.trim_matches(|c: char| !(py_word_char(c) || c == '.' || c == '\''));
        let trimmed = trimmed.trim_start_matches(['.', '\'']);
        // A final period stays only on an abbreviation-like token (`U.S.`).
        let trimmed = if trimmed.matches('.').count() == 1 {
            trimmed.trim_end_matches('.')
        } else {
            trimmed
        };
        if trimmed.is_empty() {
            continue;
        }
        let lower = trimmed.to_lowercase();
        let clitic = ["n't", "'s", "'re", "'ve", "'ll", "'d", "'m"]
            .iter()
            .find(|c| lower.ends_with(*c) && lower.len() > c.len());
        match clitic {
            Some(c) => {
                let cut = trimmed.len() - c.len();
                out.push(trimmed[..cut].to_string());
                out.push(trimmed[cut..].to_string());
            }
            None => out.push(trimmed.to_string()),
        }
    }
    out
}

/// Whether `s` is one JSON value as Python's `json.loads` reads it: standard JSON plus `NaN`,
/// `Infinity`, `-Infinity`, numbers of any size and lone surrogate escapes; whitespace is only
/// space, tab, newline and carriage return; nothing may follow the value.
pub fn py_json(s: &str) -> bool {
    let b = s.as_bytes();
    let mut at = 0;
    let ws = |at: &mut usize| {
        while *at < b.len() && matches!(b[*at], b' ' | b'\t' | b'\n' | b'\r') {
            *at += 1;
        }
    };
    ws(&mut at);
    if !json_value(b, &mut at, 0) {
        return false;
    }
    ws(&mut at);
    at == b.len()
}

fn json_value(b: &[u8], at: &mut usize, depth: usize) -> bool {
    // Python raises RecursionError near 1,000 levels; counted as not JSON.
    if depth > 900 {
        return false;
    }
    let ws = |at: &mut usize| {
        while *at < b.len() && matches!(b[*at], b' ' | b'\t' | b'\n' | b'\r') {
            *at += 1;
        }
    };
    let literal = |at: &mut usize, word: &[u8]| {
        let ok = b[*at..].starts_with(word);
        if ok {
            *at += word.len();
        }
        ok
    };
    match b.get(*at) {
        Some(b'{') | Some(b'[') => {
            let (close, object) = if b[*at] == b'{' {
                (b'}', true)
            } else {
                (b']', false)
            };
            *at += 1;
            ws(at);
            if b.get(*at) == Some(&close) {
                *at += 1;
                return true;
            }
            loop {
                if object {
                    if b.get(*at) != Some(&b'"') || !json_string(b, at) {
                        return false;
                    }
                    ws(at);
                    if b.get(*at) != Some(&b':') {
                        return false;
                    }
                    *at += 1;
                    ws(at);
                }
                if !json_value(b, at, depth + 1) {
                    return false;
                }
                ws(at);
                match b.get(*at) {
                    Some(&c) if c == close => {
                        *at += 1;
                        return true;
                    }
                    Some(b',') => {
                        *at += 1;
                        ws(at);
                    }
                    _ => return false,
                }
            }
        }
        Some(b'"') => json_string(b, at),
        Some(b't') => literal(at, b"true"),
        Some(b'f') => literal(at, b"false"),
        Some(b'n') => literal(at, b"null"),
        Some(b'N') => literal(at, b"NaN"),
        Some(b'I') => literal(at, b"Infinity"),
        Some(b'-') if b[*at..].starts_with(b"-Infinity") => literal(at, b"-Infinity"),
        Some(b'-' | b'0'..=b'9') => json_number(b, at),
        _ => false,
    }
}

fn json_string(b: &[u8], at: &mut usize) -> bool {
    *at += 1;
    while let Some(&c) = b.get(*at) {
        *at += 1;
        match c {
            b'"' => return true,
            0..=0x1f => return false,
            b'\\' => match b.get(*at) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => *at += 1,
                Some(b'u') => {
                    let hex = b.get(*at + 1..*at + 5);
                    if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                        return false;
                    }
                    *at += 5;
                }
                _ => return false,
            },
            _ => {}
        }
    }
    false
}

fn json_number(b: &[u8], at: &mut usize) -> bool {
    let digits = |at: &mut usize| {
        let from = *at;
        while b.get(*at).is_some_and(u8::is_ascii_digit) {
            *at += 1;
        }
        *at > from
    };
    if b.get(*at) == Some(&b'-') {
        *at += 1;
    }
    match b.get(*at) {
        Some(b'0') => *at += 1,
        Some(b'1'..=b'9') => {
            digits(at);
        }
        _ => return false,
    }
    if b.get(*at) == Some(&b'.') {
        *at += 1;
        if !digits(at) {
            return false;
        }
    }
    if matches!(b.get(*at), Some(b'e' | b'E')) {
        *at += 1;
        if matches!(b.get(*at), Some(b'+' | b'-')) {
            *at += 1;
        }
        if !digits(at) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_pythons_word_runs() {
        // The upstream examples and the spec's: punctuation and hyphens split words.
        assert_eq!(count_words("word1, word2, word3, word4."), 4);
        assert_eq!(count_words("Hyphenated-word has two word counts."), 6);
        assert_eq!(count_words("don't e-mail 3.14 hello_world"), 7);
        assert_eq!(count_words("x² ½ ①"), 3);
        // Combining marks are not word chars in Python: नमस्ते दुनिया is 5 runs.
        assert_eq!(count_words("नमस्ते दुनिया"), 5);
        assert_eq!(count_words(""), 0);
    }

    #[test]
    fn sentences_end_at_terminal_punctuation_but_not_abbreviations() {
        for (text, n) in [
            ("xx,x. xx,x! xx/x. x{x}x? x.", 5),
            ("xx,x! xxxx. x(x)x?", 3),
            ("xxxx. xx,x! xx|x. x&x x?", 4),
            ("xx-x]xx,x! x{x}xx,x.", 2),
            ("Is it 5 p.m. now? Yes.", 2),
            ("U.S. citizens vote. Really!", 2),
            ("Mr. Smith went home. He slept.", 2),
            ("Hello.World. Next", 2),
            ("(Sentence one.) Sentence two.", 2),
            ("One. two. Three.", 3),
            ("no end", 1),
            ("   ", 0),
        ] {
            assert_eq!(count_sentences(text), n, "{text}");
        }
    }

    #[test]
    fn case_tests_are_pythons() {
        assert!(py_isupper("HELLO 123!") && !py_isupper("123") && !py_isupper("HeLLO"));
        assert!(py_islower("hello 123") && !py_islower("!!!") && !py_islower("hello I"));
        assert!(!py_isupper("ǅ") && !py_islower("ǅ"));
    }

    #[test]
    fn word_tokens_split_clitics_and_keep_abbreviations() {
        let toks = word_tokens("I DON'T like NASA's U.S. policy (USA), WELL-KNOWN.");
        let upper: Vec<&String> = toks.iter().filter(|t| py_isupper(t)).collect();
        // I, DO, N'T, NASA, U.S., USA, WELL-KNOWN: 7, as NLTK counts them.
        assert_eq!(upper.len(), 7, "{toks:?}");
    }

    #[test]
    fn json_is_what_python_accepts() {
        for ok in [
            "{}",
            "[1, 2]",
            "\"s\"",
            "NaN",
            "-Infinity",
            "1e400",
            " {\"a\": [true, null]} ",
            "\"\\ud800\"",
        ] {
            assert!(py_json(ok), "{ok}");
        }
        for bad in [
            "{'a': 1}",
            "[1,2,]",
            "{\"a\":1}{\"b\":2}",
            "01",
            "",
            "{\"a\" 1}",
            "\"\t\"",
            "[1,]",
        ] {
            assert!(!py_json(bad), "{bad}");
        }
        assert!(
            !py_json(&"[".repeat(5000)),
            "deep nesting is refused, not a stack overflow"
        );
    }
}
