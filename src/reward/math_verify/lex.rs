//! Tokens of a math answer written in LaTeX or plain text.
//!
//! The lexer does the normalising that answers need before they can be compared: LaTeX spacing
//! (`\,` `\!` `\;` `\quad`, so `1\,000` is one number), sizing (`\left`, `\right`, `\big`),
//! dollars (math delimiters and currency), degrees (`^\circ`, `°`, `\degree`), the `{,}` of a
//! thousands separator, Unicode minus/times/division/π/∞/√, and the spelling variants of one
//! macro (`\dfrac`, `\tfrac` and `\frac`). `\text{..}`-like groups are lexed in text mode, where a
//! run of letters is a word (a unit, `and`, a name) rather than a product of variables.
//!
//! Anything the comparison cannot use becomes [`Tok::Word`], and an answer with a word where an
//! operand should be is compared as text.

/// One token.
#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    /// A number literal; `int` when written without a decimal point or exponent.
    Num {
        value: f64,
        int: bool,
    },
    /// A variable: one letter, possibly with a subscript (`x`, `x_1`, `a_{n}`).
    Var(String),
    /// A run of letters that is neither a variable nor a known macro (a unit, a name, `\mathbb`).
    Word(String),
    Pi,
    Euler,
    Infinity,
    Func(Func),
    Frac,
    Sqrt,
    Binom,
    Plus,
    Minus,
    PlusMinus,
    Star,
    Slash,
    Caret,
    Bang,
    Percent,
    /// `,` or `;` between items.
    Comma,
    /// `and`, `or` between items.
    Conj,
    Eq,
    /// `<`, `\le`, `\lt`, …: `less` for `<`-like, `strict` without equality.
    Compare {
        less: bool,
        strict: bool,
    },
    /// `\neq` and the like: not compared structurally, so the answer falls back to text.
    Ineq,
    /// `^\circ`, `°`, `\degree`.
    Degree,
    LParen,
    RParen,
    LBrack,
    RBrack,
    /// `{`, the TeX group.
    LBrace,
    RBrace,
    /// `\{`, a set.
    LSet,
    RSet,
    Bar,
    Cup,
    Underscore,
}

/// The functions evaluated by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    Sin,
    Cos,
    Tan,
    Cot,
    Sec,
    Csc,
    Asin,
    Acos,
    Atan,
    Ln,
    Log,
    Exp,
}

impl Func {
    fn named(name: &str) -> Option<Func> {
        Some(match name {
            "sin" => Func::Sin,
            "cos" => Func::Cos,
            "tan" => Func::Tan,
            "cot" => Func::Cot,
            "sec" => Func::Sec,
            "csc" => Func::Csc,
            "arcsin" => Func::Asin,
            "arccos" => Func::Acos,
            "arctan" => Func::Atan,
            "ln" => Func::Ln,
            "log" => Func::Log,
            "exp" => Func::Exp,
            _ => return None,
        })
    }
}

/// Two-letter units that would otherwise read as a product of two variables (`5 cm` is not
/// `5·c·m`). Single letters (`m`, `s`, `g`) stay variables: they are far more often unknowns.
const SHORT_UNITS: [&str; 14] = [
    "cm", "mm", "km", "kg", "mg", "ml", "ft", "yd", "lb", "oz", "hr", "sq", "mi", "in",
];

/// Macros that only change how something looks.
const IGNORED_MACROS: [&str; 15] = [
    "left",
    "right",
    "big",
    "Big",
    "bigl",
    "bigr",
    "Bigl",
    "Bigr",
    "displaystyle",
    "textstyle",
    "limits",
    "quad",
    "qquad",
    "boxed",
    "fbox",
];

/// Macros whose brace group is text (`\text{ cm}`, `\mathrm{and}`).
const TEXT_MACROS: [&str; 9] = [
    "text",
    "textbf",
    "textit",
    "textrm",
    "mathrm",
    "mathbf",
    "mathit",
    "mbox",
    "operatorname",
];

/// Tokens of `s`; `None` when it has more than `max_tokens` (pathological input is compared as
/// text instead of parsed).
pub fn lex(s: &str, max_tokens: usize) -> Option<Vec<Tok>> {
    let mut out = Vec::new();
    lex_into(s, false, &mut out, max_tokens)?;
    Some(out)
}

fn lex_into(s: &str, text_mode: bool, out: &mut Vec<Tok>, max: usize) -> Option<()> {
    let chars: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if out.len() > max {
            return None;
        }
        let c = chars[i];
        i += 1;
        match c {
            c if c.is_whitespace() || c == '$' || c == '~' => {}
            '0'..='9' | '.' => {
                let (tok, end) = number(&chars, i - 1)?;
                out.push(tok);
                i = end;
            }
            c if c.is_alphabetic() => {
                let start = i - 1;
                while i < chars.len() && chars[i].is_alphabetic() {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                i = letters(&word, &chars, i, text_mode, out);
            }
            '\\' => i = command(&chars, i, out, max)?,
            '{' if chars.get(i) == Some(&',') && chars.get(i + 1) == Some(&'}') => i += 2,
            '^' if starts_degree(&chars[i..]) => {
                i += degree_len(&chars[i..]);
                out.push(Tok::Degree);
            }
            _ => out.push(match c {
                '+' => Tok::Plus,
                '-' | '−' | '–' => Tok::Minus,
                '±' => Tok::PlusMinus,
                '*' | '×' | '·' | '⋅' => Tok::Star,
                '/' | '÷' => Tok::Slash,
                '^' => Tok::Caret,
                '!' => Tok::Bang,
                '%' => Tok::Percent,
                ',' | ';' => Tok::Comma,
                '=' => Tok::Eq,
                '<' if chars.get(i) == Some(&'=') => {
                    i += 1;
                    Tok::Compare {
                        less: true,
                        strict: false,
                    }
                }
                '>' if chars.get(i) == Some(&'=') => {
                    i += 1;
                    Tok::Compare {
                        less: false,
                        strict: false,
                    }
                }
                '<' | '>' | '≤' | '≥' => Tok::Compare {
                    less: matches!(c, '<' | '≤'),
                    strict: matches!(c, '<' | '>'),
                },
                '≠' => Tok::Ineq,
                '°' => Tok::Degree,
                '(' => Tok::LParen,
                ')' => Tok::RParen,
                '[' => Tok::LBrack,
                ']' => Tok::RBrack,
                '{' => Tok::LBrace,
                '}' => Tok::RBrace,
                '|' => Tok::Bar,
                '_' => Tok::Underscore,
                'π' => Tok::Pi,
                '∞' => Tok::Infinity,
                '√' => Tok::Sqrt,
                '∪' => Tok::Cup,
                other => Tok::Word(other.to_string()),
            }),
        }
    }
    Some(())
}

/// A number at `chars[at]`: digits (in groups of three after a `\,` or `{,}` thousands
/// separator), a decimal part, an exponent (`1.5e-3`); `(token, end)`.
fn number(chars: &[char], at: usize) -> Option<(Tok, usize)> {
    let mut text = String::new();
    let mut i = at;
    let digits = |i: &mut usize, text: &mut String| {
        let from = *i;
        while *i < chars.len() && chars[*i].is_ascii_digit() {
            text.push(chars[*i]);
            *i += 1;
        }
        *i - from
    };
    let whole = digits(&mut i, &mut text);
    while whole > 0 && i < chars.len() {
        // `1\,000` and `1{,}000`: a separator then exactly three digits.
        let sep = match (chars.get(i), chars.get(i + 1), chars.get(i + 2)) {
            (Some('\\'), Some(','), _) => 2,
            (Some('{'), Some(','), Some('}')) => 3,
            _ => break,
        };
        let group = &chars[(i + sep).min(chars.len())..];
        let three = group.len() >= 3 && group[..3].iter().all(char::is_ascii_digit);
        if !three || group.get(3).is_some_and(char::is_ascii_digit) {
            break;
        }
        i += sep;
        digits(&mut i, &mut text);
    }
    let mut int = true;
    if chars.get(i) == Some(&'.') && chars.get(i + 1).is_some_and(char::is_ascii_digit) {
        text.push('.');
        i += 1;
        digits(&mut i, &mut text);
        int = false;
    } else if chars.get(i) == Some(&'.') && whole > 0 {
        // `5.` is 5 (a sentence's full stop, or a decimal point with no digits after it).
        i += 1;
    } else if whole == 0 {
        // A lone `.`: nothing to compare.
        return Some((Tok::Word(".".into()), i + 1));
    }
    if matches!(chars.get(i), Some('e' | 'E')) {
        let mut j = i + 1;
        let mut exponent = String::from("e");
        if let Some(&sign @ ('+' | '-')) = chars.get(j) {
            exponent.push(sign);
            j += 1;
        }
        if digits(&mut j, &mut exponent) > 0 {
            text.push_str(&exponent);
            i = j;
            int = false;
        }
    }
    let mut value: f64 = text.parse().ok()?;
    if let Some((block, end)) = repeating_block(chars, i) {
        // `0.1\overline{6}` = 0.1 + 6 / (10 · 9): the block repeats after the written decimals.
        let decimals = text.split_once('.').map_or(0, |(_, d)| d.len());
        let period = 10f64.powi(block.len() as i32) - 1.0;
        let block: f64 = block.parse().ok()?;
        value += block / (10f64.powi(decimals as i32) * period);
        return Some((Tok::Num { value, int: false }, end));
    }
    Some((Tok::Num { value, int }, i))
}

/// The digits of a `\overline{..}` (or `\dot{..}`) at `chars[at]`, and where it ends.
fn repeating_block(chars: &[char], at: usize) -> Option<(String, usize)> {
    let rest: String = chars[at..].iter().take(40).collect();
    let name_len = ["\\overline", "\\dot"]
        .iter()
        .find(|m| rest.starts_with(*m))?
        .len();
    let open = at + name_len;
    if chars.get(open) != Some(&'{') {
        return None;
    }
    let close = group_end(chars, open)?;
    let block: String = chars[open + 1..close].iter().collect();
    let ok = !block.is_empty() && block.len() <= 12 && block.chars().all(|c| c.is_ascii_digit());
    ok.then_some((block, close + 1))
}

/// Tokens for a run of letters ending at `end`; returns where lexing goes on.
fn letters(word: &str, chars: &[char], end: usize, text_mode: bool, out: &mut Vec<Tok>) -> usize {
    let lower = word.to_lowercase();
    if lower == "and" || lower == "or" {
        out.push(Tok::Conj);
    } else if let Some(f) = Func::named(&lower) {
        out.push(Tok::Func(f));
    } else if lower == "pi" {
        out.push(Tok::Pi);
    } else if lower == "sqrt" {
        out.push(Tok::Sqrt);
    } else if lower == "infinity" || lower == "inf" {
        out.push(Tok::Infinity);
    } else if lower == "percent" {
        out.push(Tok::Percent);
    } else if text_mode || word.chars().count() >= 3 || SHORT_UNITS.contains(&lower.as_str()) {
        out.push(Tok::Word(lower));
    } else {
        // `xy` is x·y; only the last letter can carry a subscript.
        let letters: Vec<char> = word.chars().collect();
        for (k, &c) in letters.iter().enumerate() {
            if k + 1 == letters.len() {
                let (name, next) = subscripted(c, chars, end);
                out.push(if name == "e" {
                    Tok::Euler
                } else {
                    Tok::Var(name)
                });
                return next;
            }
            out.push(if c == 'e' {
                Tok::Euler
            } else {
                Tok::Var(c.to_string())
            });
        }
    }
    end
}

/// A variable's name with its subscript (`x_1`, `a_{n}`) and where lexing goes on.
fn subscripted(c: char, chars: &[char], at: usize) -> (String, usize) {
    if chars.get(at) != Some(&'_') {
        return (c.to_string(), at);
    }
    match chars.get(at + 1) {
        Some('{') => match group_end(chars, at + 1) {
            Some(close) => {
                let sub: String = chars[at + 2..close]
                    .iter()
                    .filter(|c| !c.is_whitespace())
                    .collect();
                (format!("{c}_{sub}"), close + 1)
            }
            None => (c.to_string(), at),
        },
        Some(&s) if s.is_alphanumeric() => (format!("{c}_{s}"), at + 2),
        _ => (c.to_string(), at),
    }
}

/// Index of the `}` closing the `{` at `open`.
fn group_end(chars: &[char], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (k, &c) in chars.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(k);
                }
            }
            _ => {}
        }
    }
    None
}

fn starts_degree(rest: &[char]) -> bool {
    degree_len(rest) > 0
}

/// Length of `\circ`, `{\circ}` or `{ \circ }` after a `^` (0 when something else follows).
fn degree_len(rest: &[char]) -> usize {
    let text: String = rest.iter().take(12).collect();
    let compact: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    for form in ["\\circ", "{\\circ}"] {
        if compact.starts_with(form) {
            // Count the original characters up to and including the form's last one.
            let mut seen = 0;
            for (k, c) in rest.iter().enumerate() {
                if !c.is_whitespace() {
                    seen += 1;
                }
                if seen == form.chars().count() {
                    return k + 1;
                }
            }
        }
    }
    0
}

/// A macro after the `\` at `chars[at - 1]`; returns where lexing goes on.
fn command(chars: &[char], at: usize, out: &mut Vec<Tok>, max: usize) -> Option<usize> {
    let Some(&first) = chars.get(at) else {
        return Some(at);
    };
    if !first.is_ascii_alphabetic() {
        match first {
            '{' => out.push(Tok::LSet),
            '}' => out.push(Tok::RSet),
            '%' => out.push(Tok::Percent),
            '|' => out.push(Tok::Bar),
            // Spacing (`\,` `\!` `\;` `\:` `\ `), currency (`\$`), a line break (`\\`).
            ',' | '!' | ';' | ':' | ' ' | '$' | '\\' => {}
            other => out.push(Tok::Word(format!("\\{other}"))),
        }
        return Some(at + 1);
    }
    let mut end = at;
    while end < chars.len() && chars[end].is_ascii_alphabetic() {
        end += 1;
    }
    let name: String = chars[at..end].iter().collect();
    if name == "left" || name == "right" {
        // `\left.` is an invisible delimiter.
        if chars.get(end) == Some(&'.') {
            end += 1;
        }
        return Some(end);
    }
    if IGNORED_MACROS.contains(&name.as_str()) {
        return Some(end);
    }
    if TEXT_MACROS.contains(&name.as_str()) {
        let mut open = end;
        while chars.get(open).is_some_and(|c| c.is_whitespace()) {
            open += 1;
        }
        if chars.get(open) != Some(&'{') {
            return Some(end);
        }
        let close = group_end(chars, open)?;
        let inner: String = chars[open + 1..close].iter().collect();
        lex_into(&inner, true, out, max)?;
        return Some(close + 1);
    }
    let tok = match name.as_str() {
        "frac" | "dfrac" | "tfrac" | "cfrac" => Tok::Frac,
        "sqrt" => Tok::Sqrt,
        "binom" | "dbinom" | "tbinom" => Tok::Binom,
        "pi" => Tok::Pi,
        "infty" | "infin" => Tok::Infinity,
        "cdot" | "times" | "ast" => Tok::Star,
        "div" => Tok::Slash,
        "pm" => Tok::PlusMinus,
        "cup" => Tok::Cup,
        "lbrace" => Tok::LSet,
        "rbrace" => Tok::RSet,
        "lvert" | "rvert" | "vert" | "mid" => Tok::Bar,
        "le" | "leq" | "leqslant" => Tok::Compare {
            less: true,
            strict: false,
        },
        "ge" | "geq" | "geqslant" => Tok::Compare {
            less: false,
            strict: false,
        },
        "lt" => Tok::Compare {
            less: true,
            strict: true,
        },
        "gt" => Tok::Compare {
            less: false,
            strict: true,
        },
        "ne" | "neq" => Tok::Ineq,
        "circ" | "degree" => Tok::Degree,
        "approx" => Tok::Eq,
        other => match Func::named(other) {
            Some(f) => Tok::Func(f),
            None => Tok::Word(format!("\\{other}")),
        },
    };
    let digit_args = match tok {
        Tok::Frac | Tok::Binom => 2,
        Tok::Sqrt => 1,
        _ => 0,
    };
    out.push(tok);
    Some(digit_arguments(chars, end, digit_args, out))
}

/// TeX takes a one-character argument without braces: `\frac12` is 1/2 and `\sqrt32` is √3·2.
/// Emits up to `n` leading digits at `at` as separate numbers; returns where lexing goes on.
fn digit_arguments(chars: &[char], mut at: usize, n: usize, out: &mut Vec<Tok>) -> usize {
    for _ in 0..n {
        while chars.get(at).is_some_and(|c| *c == ' ') {
            at += 1;
        }
        match chars.get(at).and_then(|c| c.to_digit(10)) {
            Some(d) => {
                out.push(Tok::Num {
                    value: f64::from(d),
                    int: true,
                });
                at += 1;
            }
            None => break,
        }
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok> {
        lex(s, 1000).unwrap_or_default()
    }

    #[test]
    fn numbers_with_decimals_exponents_and_spacing() {
        let num = |value: f64| Tok::Num { value, int: true };
        assert_eq!(toks("1\\,000"), [num(1000.0)]);
        assert_eq!(toks("12{,}345\\,678"), [num(12345678.0)]);
        // Not a group of three: spacing between two numbers.
        assert_eq!(toks("1\\,00"), [num(1.0), num(0.0)]);
        assert_eq!(
            toks("1.5e-3"),
            [Tok::Num {
                value: 0.0015,
                int: false
            }]
        );
        assert_eq!(
            toks("5."),
            [Tok::Num {
                value: 5.0,
                int: true
            }]
        );
        assert_eq!(
            toks("2e"),
            [
                Tok::Num {
                    value: 2.0,
                    int: true
                },
                Tok::Euler
            ]
        );
    }

    #[test]
    fn text_groups_units_and_degrees() {
        assert_eq!(
            toks("5\\text{ cm}"),
            [
                Tok::Num {
                    value: 5.0,
                    int: true
                },
                Tok::Word("cm".into())
            ]
        );
        assert_eq!(toks("2 \\text{ and } 7")[1], Tok::Conj);
        for degrees in [
            "30^\\circ",
            "30^{\\circ}",
            "30 ^ { \\circ }",
            "30°",
            "30\\degree",
        ] {
            assert_eq!(toks(degrees).get(1), Some(&Tok::Degree), "{degrees}");
        }
        let le = Tok::Compare {
            less: true,
            strict: false,
        };
        assert_eq!(toks("x \\leq 2")[1], le);
        assert_eq!(toks("x <= 2")[1], le);
        assert_eq!(
            toks("\\$1{,}000"),
            [Tok::Num {
                value: 1000.0,
                int: true
            }]
        );
        assert_eq!(toks("xy"), [Tok::Var("x".into()), Tok::Var("y".into())]);
        assert_eq!(toks("x_{12} a_n")[0], Tok::Var("x_12".into()));
        assert_eq!(toks("x_{12} a_n")[1], Tok::Var("a_n".into()));
        assert_eq!(toks("\\text{Monday}"), [Tok::Word("monday".into())]);
        assert_eq!(
            toks("\\left( x \\right)"),
            [Tok::LParen, Tok::Var("x".into()), Tok::RParen]
        );
        assert_eq!(toks("−3")[0], Tok::Minus);
    }

    #[test]
    fn a_token_flood_is_refused() {
        assert!(lex(&"1+".repeat(600), 1000).is_none());
        assert!(lex("\\text{unclosed", 1000).is_none());
    }
}
