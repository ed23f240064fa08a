//! Text from worker processes and model output made safe to print in a terminal, and the units times
//! and sizes are shown in. Every front-end (workbench, `roll-tui run`, `runs show`) uses these.

/// `text` made safe to draw, at most `max_chars` characters: ANSI escape sequences dropped, other
/// control and invisible formatting characters shown as `�`, newlines as `⏎` (or kept when
/// `keep_newlines`), tabs as a space.
pub fn clean(text: &str, max_chars: usize, keep_newlines: bool) -> String {
    let mut out = String::new();
    let mut count = 0;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if count == max_chars {
            out.push('…');
            break;
        }
        let shown = match c {
            '\x1b' => {
                skip_escape(&mut chars);
                continue;
            }
            '\r' if chars.peek() == Some(&'\n') => continue,
            '\n' | '\r' if keep_newlines => '\n',
            '\n' | '\r' => '⏎',
            '\t' => ' ',
            c if c.is_control() || is_invisible(c) => '\u{fffd}',
            c => c,
        };
        out.push(shown);
        count += 1;
    }
    out
}

/// Skip the rest of an escape sequence: CSI (`ESC [ … final`), OSC (`ESC ] … BEL` or `ESC \`), or
/// one character after a lone ESC.
fn skip_escape(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) {
    match chars.next() {
        Some('[') => {
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
        Some(']') => {
            while let Some(c) = chars.next() {
                if c == '\x07' || (c == '\x1b' && chars.next_if_eq(&'\\').is_some()) {
                    break;
                }
            }
        }
        _ => {}
    }
}

/// Zero-width and direction-changing characters that would hide or reorder text on screen.
fn is_invisible(c: char) -> bool {
    matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

/// A time relative to the run's start: `+12.3 s`, `+4m05s`, `+2h10m`, `+3d04h`.
pub fn rel_time(ms: i64) -> String {
    let sign = if ms < 0 { "-" } else { "+" };
    let a = ms.unsigned_abs();
    let s = a / 1000;
    match a {
        0..60_000 => format!("{sign}{:.1} s", a as f64 / 1000.0),
        60_000..3_600_000 => format!("{sign}{}m{:02}s", s / 60, s % 60),
        3_600_000..360_000_000 => format!("{sign}{}h{:02}m", s / 3600, s / 60 % 60),
        _ => format!("{sign}{}d{:02}h", s / 86_400, s / 3600 % 24),
    }
}

/// A sum of rewards as a person reads it: at most 6 decimals, no float noise (`-0.3`, not
/// `-0.30000000000000004`), no trailing zeros (`1`, `0.97`).
pub fn reward(x: f64) -> String {
    let r = (x * 1e6).round() / 1e6;
    // -0 reads as 0.
    format!("{}", if r == 0.0 { 0.0 } else { r })
}

/// The plural ending of a count's noun: `""` for 1, `"s"` otherwise (`3 steps`, `1 step`,
/// `0 steps`).
pub fn plural_s<N: PartialEq + From<u8>>(n: N) -> &'static str {
    if n == N::from(1) { "" } else { "s" }
}

/// Bytes with a binary unit: `512 B`, `1.5 KiB`, `3.0 GiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// The closest candidate to `word` if it is plausibly a misspelling of it (case-insensitive
/// Jaro-Winkler similarity of at least 0.8).
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let word = word.to_lowercase();
    candidates
        .into_iter()
        .filter(|c| !c.is_empty())
        .map(|c| (strsim::jaro_winkler(&word, &c.to_lowercase()), c))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

pub fn suggestion_suffix<'a>(word: &str, candidates: impl IntoIterator<Item = &'a str>) -> String {
    did_you_mean(word, candidates)
        .map(|s| format!(" (did you mean '{s}'?)"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #[test]
    fn rewards_print_without_float_noise() {
        // -0.1 three times is -0.30000000000000004 in f64.
        let three = -0.1f64 + -0.1 + -0.1;
        assert_ne!(format!("{three}"), "-0.3");
        assert_eq!(super::reward(three), "-0.3");
        assert_eq!(super::reward(1.0), "1");
        assert_eq!(super::reward(0.97), "0.97");
        assert_eq!(super::reward(-1e-9), "0");
        assert_eq!(super::reward(10.0 - 0.1 * 7.0), "9.3");
    }

    use super::*;

    #[test]
    fn only_one_of_a_thing_is_singular() {
        let steps = |n: usize| format!("{n} step{}", plural_s(n));
        assert_eq!(
            [steps(0), steps(1), steps(2)],
            ["0 steps", "1 step", "2 steps"]
        );
        assert_eq!(plural_s(1u64), "");
        assert_eq!(plural_s(-1i64), "s");
    }

    #[test]
    fn text_is_made_safe_character_by_character() {
        assert_eq!(clean("a\x1b[1;31mred\x1b[0m b", 100, false), "ared b");
        assert_eq!(clean("t\x1b]0;title\x07x", 100, false), "tx");
        assert_eq!(clean("one\r\ntwo\rthree\n", 100, false), "one⏎two⏎three⏎");
        assert_eq!(clean("one\r\ntwo", 100, true), "one\ntwo");
        assert_eq!(clean("a\tb\x00c\x7fd\u{202e}e", 100, false), "a b�c�d�e");
        // Multi-byte characters are cut whole.
        assert_eq!(clean("ééééé", 3, false), "ééé…");
        assert_eq!(clean("日本語", 3, false), "日本語");
        assert_eq!(clean("\x1b", 3, false), "");
    }

    #[test]
    fn times_and_sizes_read_well() {
        assert_eq!(rel_time(12_345), "+12.3 s");
        assert_eq!(rel_time(-1_500), "-1.5 s");
        assert_eq!(rel_time(245_000), "+4m05s");
        assert_eq!(rel_time(2 * 3_600_000 + 600_000), "+2h10m");
        assert_eq!(rel_time(100 * 3_600_000), "+4d04h");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
        assert_eq!(human_bytes(u64::MAX), "16384.0 PiB");
    }
}
