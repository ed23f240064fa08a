//! Smoothing of metric series, the same in the workbench and in exported plots: an exponential
//! moving average that a live series can extend point by point.

/// The EMA weight the workbench opens with and exported plots draw.
pub const DEFAULT_WEIGHT: f64 = 0.6;

/// TensorBoard-style smoothing: `s_t = w·s_{t−1} + (1 − w)·v_t`, debiased by `1 − w^n` (n = finite
/// values seen) so the curve starts at the first value instead of at 0. Non-finite values are
/// passed through (they stay gaps) and do not enter the average. `weight` is clamped to [0, 0.999].
pub fn ema(values: &[f64], weight: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(values.len());
    Ema::new(weight).extend(values, &mut out);
    out
}

/// [`ema`] as a running state, so that a growing series is smoothed only where it grew: pushing
/// values one piece after another gives, bit for bit, what [`ema`] gives for them all at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ema {
    weight: f64,
    /// The undebiased average.
    acc: f64,
    /// `w^n`, n = finite values seen.
    debias: f64,
}

impl Ema {
    /// Nothing seen yet; `weight` is clamped to [0, 0.999].
    pub fn new(weight: f64) -> Ema {
        Ema {
            weight: weight.clamp(0.0, 0.999),
            acc: 0.0,
            debias: 1.0,
        }
    }

    /// The (clamped) weight.
    pub fn weight(&self) -> f64 {
        self.weight
    }

    /// The smoothed value at `v`, taking it into the average if it is finite.
    pub fn push(&mut self, v: f64) -> f64 {
        if !v.is_finite() {
            return v;
        }
        let w = self.weight;
        self.acc = w * self.acc + (1.0 - w) * v;
        self.debias *= w;
        self.acc / (1.0 - self.debias)
    }

    /// Push every value of `values`, appending the smoothed ones to `out`.
    pub fn extend(&mut self, values: &[f64], out: &mut Vec<f64>) {
        out.extend(values.iter().map(|&v| self.push(v)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ema_is_debiased_and_skips_gaps() {
        // w = 0.5: s1 = 0.5·2 / (1 − 0.5) = 2; s2 = (0.5·1 + 0.5·4) / (1 − 0.25) = 2.5 / 0.75.
        let s = ema(&[2.0, f64::NAN, 4.0], 0.5);
        assert_eq!(s[0], 2.0);
        assert!(s[1].is_nan());
        assert!((s[2] - 2.5 / 0.75).abs() < 1e-12, "{s:?}");
        // No smoothing is the series itself.
        assert_eq!(ema(&[1.0, -3.0, 7.5], 0.0), vec![1.0, -3.0, 7.5]);
    }

    #[test]
    fn ema_in_pieces_is_ema_of_the_whole() {
        // A small linear congruential generator: repeated values, NaN and ±inf among them.
        let mut s: u64 = 42;
        let values: Vec<f64> = (0..1000)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                match (s >> 33) % 11 {
                    0 => f64::NAN,
                    1 => f64::INFINITY,
                    2 => f64::NEG_INFINITY,
                    r => (r as f64 - 5.0) * 0.37,
                }
            })
            .collect();
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for weight in [-1.0, 0.0, 0.6, 0.999, 2.0] {
            let whole = ema(&values, weight);
            for pieces in [&[0, 1, 7, 8, 9, 0, 63, 64, 65][..], &[1000], &[3; 334]] {
                let mut e = Ema::new(weight);
                let mut out = vec![];
                let mut n = 0;
                for &p in pieces {
                    let end = (n + p).min(values.len());
                    e.extend(&values[n..end], &mut out);
                    n = end;
                }
                e.extend(&values[n..], &mut out);
                assert_eq!(
                    bits(&out),
                    bits(&whole),
                    "weight {weight}, pieces {pieces:?}"
                );
            }
            // One at a time, by push.
            let mut e = Ema::new(weight);
            let pushed: Vec<f64> = values.iter().map(|&v| e.push(v)).collect();
            assert_eq!(bits(&pushed), bits(&whole), "weight {weight}");
        }
        assert_eq!(Ema::new(5.0).weight(), 0.999);
        assert_eq!(Ema::new(-5.0).weight(), 0.0);
    }
}
