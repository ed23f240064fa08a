//! Numbers as they appear in math answers: parsing and comparison.
//!
//! Accepted (after removing `$`, whitespace, LaTeX spacing `\,` `\!` `\;` `\:` `\ `, `\left`/`\right`,
//! `{,}` thousands commas, a trailing `.`, and everything up to the last `=`; wrapping `{}`/`()` are peeled):
//! - integers with an optional sign: `42`, `-7`, `+3`, with thousands separators in groups of three:
//!   `1,000`, `-12,345,678` (but `1,00` is not a number);
//! - decimals: `3.50`, `.5`, `5.`, `-0.125`;
//! - scientific notation: `1e-6`, `2.5E3` (compared with tolerance);
//! - fractions of those: `7/2`, `-1/3`, `\frac{1}{2}`, `\dfrac{3}{4}`, `\tfrac12`, `\frac{-1}{\frac{1}{2}}`.
//!
//! Not accepted (such answers fall back to string comparison, or are wrong against a numeric truth):
//! percentages, units (`5 cm`, `\text{...}`), `\sqrt`, `\pi`, mixed numbers, expressions like `1+2`.
//!
//! Values are kept as reduced `i128` fractions whenever they fit, so `0.5 == 1/2 == \frac{1}{2}` and
//! `3.50 == 7/2` hold exactly; otherwise they are `f64` and compared with relative tolerance [`REL_TOL`].

/// Relative tolerance for comparisons that involve a non-rational (`f64`) value.
pub const REL_TOL: f64 = 1e-6;

/// A parsed numeric answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Number {
    /// `num / den` in lowest terms, `den > 0`.
    Rational { num: i128, den: i128 },
    /// Anything that did not fit an `i128` fraction (or came from scientific notation).
    Float(f64),
}

impl Number {
    /// Builds a reduced fraction; `None` when `den == 0` or the reduction overflows.
    pub fn ratio(num: i128, den: i128) -> Option<Number> {
        if den == 0 {
            return None;
        }
        let negative = (num < 0) != (den < 0);
        let g = gcd(num.unsigned_abs(), den.unsigned_abs());
        // g >= 1 because den != 0; the quotients fit back into i128 unless a side was i128::MIN.
        let num = i128::try_from(num.unsigned_abs() / g).ok()?;
        let den = i128::try_from(den.unsigned_abs() / g).ok()?;
        let num = if negative { -num } else { num };
        Some(Number::Rational { num, den })
    }

    /// The value as `f64` (possibly rounded).
    pub fn to_f64(self) -> f64 {
        match self {
            Number::Rational { num, den } => num as f64 / den as f64,
            Number::Float(x) => x,
        }
    }

    fn neg(self) -> Option<Number> {
        match self {
            Number::Rational { num, den } => Some(Number::Rational {
                num: num.checked_neg()?,
                den,
            }),
            Number::Float(x) => Some(Number::Float(-x)),
        }
    }

    /// `self / other`; `None` on division by zero.
    fn div(self, other: Number) -> Option<Number> {
        if let (Number::Rational { num: a, den: b }, Number::Rational { num: c, den: d }) =
            (self, other)
        {
            if c == 0 {
                return None;
            }
            // (a/b) / (c/d) = (a*d) / (b*c); fall through to f64 if the products overflow.
            if let (Some(n), Some(m)) = (a.checked_mul(d), b.checked_mul(c)) {
                return Number::ratio(n, m).or_else(|| float(n as f64 / m as f64));
            }
        }
        let divisor = other.to_f64();
        if divisor == 0.0 {
            return None;
        }
        float(self.to_f64() / divisor)
    }

    /// Exact equality for two fractions; relative tolerance [`REL_TOL`] as soon as one side is a float.
    pub fn approx_eq(self, other: Number) -> bool {
        match (self, other) {
            (Number::Rational { .. }, Number::Rational { .. }) => self == other,
            _ => {
                let (a, b) = (self.to_f64(), other.to_f64());
                a == b || (a - b).abs() <= REL_TOL * a.abs().max(b.abs())
            }
        }
    }
}

fn float(x: f64) -> Option<Number> {
    x.is_finite().then_some(Number::Float(x))
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Parses a final answer or a ground truth; see the module docs for what is accepted.
pub fn parse_number(text: &str) -> Option<Number> {
    let cleaned = normalize(text);
    parse_expr(&cleaned, 0)
}

/// The cleaning shared by numeric parsing: LaTeX spacing, `$`, whitespace, trailing `.`, `lhs =`.
pub(crate) fn normalize(text: &str) -> String {
    let mut s = text.replace('\u{2212}', "-");
    for latex in [
        "\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\ ", "\\$",
    ] {
        s = s.replace(latex, "");
    }
    s = s.replace("{,}", ",");
    s.retain(|c| c != '$' && !c.is_whitespace());
    if let Some((_, rhs)) = s.rsplit_once('=') {
        s = rhs.to_string();
    }
    while s.ends_with('.') {
        s.pop();
    }
    s
}

// Nesting limit for \frac inside \frac: answers never need more, and it bounds recursion.
const MAX_DEPTH: usize = 8;

fn parse_expr(s: &str, depth: usize) -> Option<Number> {
    if depth > MAX_DEPTH || s.is_empty() {
        return None;
    }
    let s = peel(s);
    if let Some(rest) = s.strip_prefix('-') {
        return parse_unsigned(rest, depth)?.neg();
    }
    parse_unsigned(s.strip_prefix('+').unwrap_or(s), depth)
}

fn parse_unsigned(s: &str, depth: usize) -> Option<Number> {
    let s = peel(s);
    if s.starts_with(['-', '+']) {
        return None; // "--5" is not a number
    }
    for macro_name in ["\\frac", "\\dfrac", "\\tfrac"] {
        if let Some(rest) = s.strip_prefix(macro_name) {
            let (num, den) = frac_args(rest)?;
            return parse_expr(num, depth + 1)?.div(parse_expr(den, depth + 1)?);
        }
    }
    // One slash only: "1/2/3" is ambiguous enough in model output to refuse.
    if s.matches('/').count() == 1
        && let Some((num, den)) = s.split_once('/')
    {
        return parse_expr(num, depth + 1)?.div(parse_expr(den, depth + 1)?);
    }
    if s.contains('/') {
        return None;
    }
    parse_plain(s)
}

/// The two arguments of `\frac`: `{a}{b}` covering the whole rest, or the shorthand `\frac12`.
fn frac_args(rest: &str) -> Option<(&str, &str)> {
    let bytes = rest.as_bytes();
    if bytes.len() == 2 && bytes.iter().all(u8::is_ascii_digit) {
        return Some((&rest[..1], &rest[1..]));
    }
    let (num, after) = brace_group(rest)?;
    let (den, tail) = brace_group(after)?;
    tail.is_empty().then_some((num, den))
}

/// Splits `{inner}tail` into `(inner, tail)` with balanced braces; `\{` and `\}` do not count.
pub(crate) fn brace_group(s: &str) -> Option<(&str, &str)> {
    let bytes = s.as_bytes();
    if bytes.first() != Some(&b'{') {
        return None;
    }
    let mut depth = 0usize;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 1, // skip the escaped character
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some((&s[1..i], &s[i + 1..]));
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Removes wrapping `{...}` or `(...)` that enclose the whole string.
fn peel(mut s: &str) -> &str {
    loop {
        if let Some((inner, "")) = brace_group(s) {
            s = inner;
        } else if s.starts_with('(')
            && s.ends_with(')')
            && s.len() >= 2
            && !s[1..s.len() - 1].contains(['(', ')'])
        {
            s = &s[1..s.len() - 1];
        } else {
            return s;
        }
    }
}

/// An unsigned integer (optionally with `,` thousands groups) or decimal, or scientific notation.
fn parse_plain(s: &str) -> Option<Number> {
    let (int_part, frac_part) = match s.split_once('.') {
        Some((i, f)) => (i, Some(f)),
        None => (s, None),
    };
    let int_digits = strip_thousands(int_part);
    let frac_ok = frac_part.is_none_or(|f| f.bytes().all(|b| b.is_ascii_digit()));
    if let Some(int_digits) = int_digits.filter(|_| frac_ok) {
        let frac_digits = frac_part.unwrap_or("");
        if int_digits.is_empty() && frac_digits.is_empty() {
            return None; // a lone "."
        }
        let digits = format!("{int_digits}{frac_digits}");
        let exact = digits.parse::<i128>().ok().and_then(|num| {
            let den = 10i128.checked_pow(u32::try_from(frac_digits.len()).ok()?)?;
            Number::ratio(num, den)
        });
        return exact.or_else(|| float(format!("{int_digits}.{frac_digits}0").parse().ok()?));
    }
    // Scientific notation only: f64's parser would also take "inf" and "NaN".
    let scientific = s.contains(['e', 'E'])
        && s.bytes()
            .all(|b| b.is_ascii_digit() || b"eE+-.".contains(&b))
        && s.starts_with(|c: char| c.is_ascii_digit() || c == '.');
    if scientific {
        return float(s.parse().ok()?);
    }
    None
}

/// `"12,345"` -> `"12345"`; plain digit runs pass through; bad grouping or other characters -> `None`.
fn strip_thousands(s: &str) -> Option<String> {
    if !s.bytes().all(|b| b.is_ascii_digit() || b == b',') {
        return None;
    }
    if !s.contains(',') {
        return Some(s.to_string());
    }
    let mut groups = s.split(',');
    let first = groups.next()?;
    let head_ok = (1..=3).contains(&first.len());
    (head_ok && groups.all(|g| g.len() == 3)).then(|| s.replace(',', ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(num: i128, den: i128) -> Number {
        Number::ratio(num, den).unwrap()
    }

    #[test]
    fn integers_with_sign_and_thousands() {
        assert_eq!(parse_number("42"), Some(q(42, 1)));
        assert_eq!(parse_number("-7"), Some(q(-7, 1)));
        assert_eq!(parse_number("+3"), Some(q(3, 1)));
        assert_eq!(parse_number("1,000"), Some(q(1000, 1)));
        assert_eq!(parse_number("-12,345,678"), Some(q(-12_345_678, 1)));
        assert_eq!(parse_number("1{,}000"), Some(q(1000, 1)));
        assert_eq!(parse_number("-0"), Some(q(0, 1)));
    }

    #[test]
    fn bad_thousands_grouping_is_not_a_number() {
        for s in ["1,00", "1234,567", ",100", "1,,000", "1,000,"] {
            assert_eq!(parse_number(s), None, "{s}");
        }
    }

    #[test]
    fn decimals_are_exact_fractions() {
        // 3.50 = 350/100 = 7/2; 0.125 = 125/1000 = 1/8.
        assert_eq!(parse_number("3.50"), Some(q(7, 2)));
        assert_eq!(parse_number("-0.125"), Some(q(-1, 8)));
        assert_eq!(parse_number(".5"), Some(q(1, 2)));
        assert_eq!(parse_number("5."), Some(q(5, 1)));
        assert_eq!(parse_number("1,234.5"), Some(q(2469, 2)));
        assert_eq!(parse_number("."), None);
        assert_eq!(parse_number("1.2.3"), None);
    }

    #[test]
    fn fractions_in_every_spelling() {
        for s in [
            "1/2",
            "\\frac{1}{2}",
            "\\dfrac{1}{2}",
            "\\tfrac12",
            "{1}/{2}",
            "\\frac{2}{4}",
            "0.5",
        ] {
            assert_eq!(parse_number(s), Some(q(1, 2)), "{s}");
        }
        assert_eq!(parse_number("-\\frac{3}{4}"), Some(q(-3, 4)));
        assert_eq!(parse_number("\\frac{-3}{4}"), Some(q(-3, 4)));
        assert_eq!(parse_number("\\frac{3}{-4}"), Some(q(-3, 4)));
        assert_eq!(parse_number("\\frac{-3}{-4}"), Some(q(3, 4)));
        // 1 / (1/2) = 2
        assert_eq!(parse_number("\\frac{1}{\\frac{1}{2}}"), Some(q(2, 1)));
        assert_eq!(parse_number("\\frac{1.5}{3}"), Some(q(1, 2)));
        assert_eq!(parse_number("(1)/(2)"), Some(q(1, 2)));
        assert_eq!(parse_number("1/-2"), Some(q(-1, 2)));
        assert_eq!(parse_number("1/2/3"), None);
    }

    #[test]
    fn division_by_zero_and_malformed_fracs() {
        for s in [
            "1/0",
            "\\frac{1}{0}",
            "\\frac{1}{2",
            "\\frac{1}",
            "\\frac{1}{2}{3}",
            "\\frac{a}{2}",
            "1/",
        ] {
            assert_eq!(parse_number(s), None, "{s}");
        }
    }

    #[test]
    fn latex_noise_and_equations() {
        assert_eq!(parse_number("$ 1\\,000 $"), Some(q(1000, 1)));
        assert_eq!(parse_number("x = -5"), Some(q(-5, 1)));
        assert_eq!(parse_number("\\left(\\frac{1}{3}\\right)"), Some(q(1, 3)));
        assert_eq!(parse_number("46."), Some(q(46, 1)));
        assert_eq!(parse_number("\\$5"), Some(q(5, 1)));
        assert_eq!(parse_number("\u{2212}2"), Some(q(-2, 1)));
        assert_eq!(parse_number("{{7}}"), Some(q(7, 1)));
    }

    #[test]
    fn not_numbers() {
        for s in [
            "",
            "x",
            "--5",
            "1+2",
            "inf",
            "NaN",
            "5%",
            "\\pi",
            "\\sqrt{2}",
            "5cm",
            "2^3",
            "(1,2)",
        ] {
            assert_eq!(parse_number(s), None, "{s}");
        }
    }

    #[test]
    fn scientific_notation_is_float() {
        assert_eq!(parse_number("1e-6"), Some(Number::Float(1e-6)));
        assert_eq!(parse_number("2.5E3"), Some(Number::Float(2500.0)));
        assert!(parse_number("2.5E3").unwrap().approx_eq(q(2500, 1)));
        assert_eq!(parse_number("e5"), None);
    }

    #[test]
    fn overflow_falls_back_to_float() {
        // 40 digits do not fit i128 (max ~1.7e38).
        let big = "1234567890123456789012345678901234567890";
        let n = parse_number(big).unwrap();
        assert!(matches!(n, Number::Float(_)));
        assert!(n.approx_eq(Number::Float(1.2345678901234568e39)));
        // A decimal with 40 fractional digits: the denominator 10^40 overflows.
        let tiny = format!("0.{}1", "0".repeat(39));
        assert!(parse_number(&tiny).unwrap().approx_eq(Number::Float(1e-40)));
    }

    #[test]
    fn comparison_is_exact_for_rationals_and_relative_for_floats() {
        assert!(q(1, 3).approx_eq(q(2, 6)));
        assert!(!q(1, 3).approx_eq(q(333_333, 1_000_000)));
        // Float vs rational: 0.3333333 differs from 1/3 by ~3.3e-8, relative ~1e-7 < 1e-6.
        assert!(Number::Float(0.3333333).approx_eq(q(1, 3)));
        // 0.33333 differs by ~3.3e-6, relative ~1e-5 > 1e-6.
        assert!(!Number::Float(0.33333).approx_eq(q(1, 3)));
        assert!(Number::Float(0.0).approx_eq(q(0, 1)));
        assert!(!Number::Float(1e-9).approx_eq(q(0, 1)));
    }

    #[test]
    fn ratio_reduces_and_normalises_sign() {
        assert_eq!(
            Number::ratio(6, -4),
            Some(Number::Rational { num: -3, den: 2 })
        );
        assert_eq!(
            Number::ratio(-6, -4),
            Some(Number::Rational { num: 3, den: 2 })
        );
        assert_eq!(
            Number::ratio(0, -5),
            Some(Number::Rational { num: 0, den: 1 })
        );
        assert_eq!(Number::ratio(1, 0), None);
        assert_eq!(Number::ratio(i128::MIN, 1), None);
    }
}
