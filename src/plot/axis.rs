//! Round axis ranges and labels, shared by the workbench's charts and the exported plots so that
//! both read alike: `0`, `0.5`, `1` for a reward, not `0.035`, `0.541`, `1.046`.

/// `lo..hi` widened to multiples of a round step (1, 2, 2.5 or 5 × 10^k) with at most four steps
/// between them; `None` when the span is empty or not finite (the caller pads it its own way).
/// It never crosses zero unless the values do: the floor of a positive multiple is at least 0.
pub fn round_bounds(lo: f64, hi: f64) -> Option<(f64, f64)> {
    let span = hi - lo;
    if !(span > 0.0 && span.is_finite()) {
        return None;
    }
    let mut step = round_step(span / 4.0);
    // At most three rounds: a step of at least span/4 leaves at most 6 steps, of span/2 at most 4.
    for _ in 0..8 {
        if !(step.is_finite() && step > 0.0) {
            return None;
        }
        // A value a billionth of a step past a round number (an EMA's rounding) is on it.
        let low = (lo / step + 1e-9).floor() * step;
        let high = ((hi / step - 1e-9).ceil() * step).max(low + step);
        // A span below the resolution of its values (1e15 + 0.1) rounds to nothing.
        let slack = step * 1e-6;
        if !(low.is_finite() && high.is_finite())
            || high <= low
            || low > lo + slack
            || high < hi - slack
        {
            return None;
        }
        if (high - low) / step <= 4.0 + 1e-9 {
            return Some((low, high));
        }
        step = round_step(step * 1.000_001);
    }
    None
}

/// The smallest of 1, 2, 2.5, 5 × 10^k that is at least `x` (> 0).
fn round_step(x: f64) -> f64 {
    let unit = 10f64.powf(x.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|m| m * unit)
        .find(|s| *s >= x * (1.0 - 1e-12))
        .unwrap_or(10.0 * unit)
}

/// `text` (a number) without the trailing zeros of its decimals: `0.5`, not `0.500`; `50000`,
/// not `50000.0`. Exponent forms are left alone.
pub fn trim_zeros(text: String) -> String {
    if text.contains('.') && !text.contains(['e', 'E']) {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// A tick's label: six decimals at most, without float noise or trailing zeros (`0.3`, not
/// `0.30000000000000004`; `50000`, not `50000.0`), and an exponent for the very small or large.
pub fn label(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-3..1e6).contains(&a) {
        format!("{v:.1e}")
    } else {
        // -0 reads as 0.
        trim_zeros(format!("{:.6}", if a < 5e-7 { 0.0 } else { v }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: Option<(f64, f64)>, want: (f64, f64)) {
        let (a, b) = got.unwrap();
        assert!(
            (a - want.0).abs() < 1e-9 && (b - want.1).abs() < 1e-9,
            "{a} {b} vs {want:?}"
        );
    }

    #[test]
    fn bounds_are_round_with_at_most_four_steps() {
        // Rewards from 0.081 to 1.0: a quarter of the span is 0.23, rounded up to 0.25; 0..1.
        close(round_bounds(0.081, 1.0), (0.0, 1.0));
        close(round_bounds(-1.0, 1.0), (-1.0, 1.0));
        close(round_bounds(-2.0, -1.0), (-2.0, -1.0));
        // Throughput 45,300..49,800: 4,500 / 4 = 1,125, rounded up to 2,000; 44,000..50,000 is
        // 3 steps of it.
        close(round_bounds(45_300.0, 49_800.0), (44_000.0, 50_000.0));
        // A loss from 0.0004 to 0.0187: 0.0046 rounds up to 0.005; 0..0.02.
        close(round_bounds(0.0004, 0.0187), (0.0, 0.02));
        // -0.3..0.7 in steps of 0.25 is -0.5..0.75, 5 steps: too many; 0.5 gives -0.5..1 (3).
        close(round_bounds(-0.3, 0.7), (-0.5, 1.0));
        // A value a hair past a round number does not open another step.
        close(round_bounds(0.0, 1.000_000_000_01), (0.0, 1.0));
        // Nothing to round, or nothing finite: the caller's padding decides.
        assert_eq!(round_bounds(2.0, 2.0), None);
        assert_eq!(round_bounds(-f64::MAX, f64::MAX), None);
        assert_eq!(round_bounds(0.0, f64::NAN), None);
        // A span under the resolution of its values: left to the caller, not an empty range.
        assert_eq!(round_bounds(1e15, 1e15 + 0.125), None);
    }

    #[test]
    fn labels_lose_the_zeros_of_round_numbers() {
        let t = |s: &str| trim_zeros(s.to_string());
        assert_eq!(
            [
                t("0.500"),
                t("1.000"),
                t("0.250"),
                t("50000.0"),
                t("1.0e-3"),
                t("120")
            ],
            ["0.5", "1", "0.25", "50000", "1.0e-3", "120"]
        );
        assert_eq!(
            [
                label(0.1 + 0.2),
                label(50_000.0),
                label(-0.0),
                label(2.5e-5),
                label(0.005)
            ],
            ["0.3", "50000", "0", "2.5e-5", "0.005"]
        );
    }
}
