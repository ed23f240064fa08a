//! Choosing the next token from logits: greedy, temperature, top-k and top-p, with a seeded RNG.

use rand::{Rng, rngs::StdRng};
use serde::{Deserialize, Serialize};

/// How to sample a completion. `temperature == 0` is greedy decoding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingParams {
    pub temperature: f64,
    /// Keep only the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches top_p (1.0 = off).
    pub top_p: f64,
    pub max_new_tokens: usize,
    /// Generation stops once the decoded completion contains one of these.
    pub stop_strings: Vec<String>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            max_new_tokens: 64,
            stop_strings: vec![],
        }
    }
}

impl SamplingParams {
    pub fn validate(&self, at: &str, problems: &mut Vec<String>) {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            problems.push(format!(
                "{at}.temperature must be >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            problems.push(format!("{at}.top_p must be in (0, 1], got {}", self.top_p));
        }
        if self.max_new_tokens == 0 {
            problems.push(format!("{at}.max_new_tokens must be at least 1"));
        }
    }
}

/// Sample one token from `logits` (vocab,). Returns the token and its log-probability under the
/// temperature-scaled distribution *before* top-k/top-p truncation — the same quantity the trainer
/// computes as `log_softmax(logits / temperature)`, so generation and training log-probs agree.
/// For greedy decoding the temperature is taken as 1.
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut StdRng) -> (u32, f32) {
    let temp = if params.temperature > 0.0 {
        params.temperature
    } else {
        1.0
    };
    let scaled: Vec<f64> = logits.iter().map(|&l| l as f64 / temp).collect();
    let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    // Each exp once: they make log Z, and untruncated they are the sampling weights (with
    // 151,936 tokens a row, the second pass over them was ~5% of a Qwen2.5-0.5B generation).
    let weights: Vec<f64> = scaled.iter().map(|&s| (s - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    let log_z = max + total.ln();
    let logprob = |i: usize| (scaled[i] - log_z) as f32;
    if params.temperature <= 0.0 {
        let best = argmax(&scaled);
        return (best as u32, logprob(best));
    }
    let truncating = params.top_k > 0 || params.top_p < 1.0;
    if !truncating {
        return pick(0..scaled.len(), &weights, total, rng, logprob);
    }
    let mut order: Vec<usize> = (0..scaled.len()).collect();
    order.sort_by(|&a, &b| scaled[b].total_cmp(&scaled[a]).then(a.cmp(&b)));
    if params.top_k > 0 {
        order.truncate(params.top_k.min(order.len()));
    }
    if params.top_p < 1.0 {
        let mut mass = 0.0;
        let mut keep = 0;
        for &i in &order {
            mass += (scaled[i] - log_z).exp();
            keep += 1;
            if mass >= params.top_p {
                break;
            }
        }
        order.truncate(keep.max(1));
    }
    let kept: f64 = order.iter().map(|&i| weights[i]).sum();
    pick(order.iter().copied(), &weights, kept, rng, logprob)
}

/// A token of `tokens` drawn in proportion to its weight (`total` their sum), with its log-prob.
fn pick(
    tokens: impl Iterator<Item = usize>,
    weights: &[f64],
    total: f64,
    rng: &mut StdRng,
    logprob: impl Fn(usize) -> f32,
) -> (u32, f32) {
    let mut u = rng.random::<f64>() * total;
    let mut last = 0;
    for i in tokens {
        if u < weights[i] {
            return (i as u32, logprob(i));
        }
        u -= weights[i];
        last = i;
    }
    // Rounding left u just above the last weight: take the last kept token.
    (last as u32, logprob(last))
}

fn argmax(xs: &[f64]) -> usize {
    let mut best = 0;
    for (i, x) in xs.iter().enumerate() {
        if *x > xs[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn params(temperature: f64, top_k: usize, top_p: f64) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_takes_argmax_with_its_logprob() {
        let mut rng = StdRng::seed_from_u64(0);
        // log_softmax([1, 3, 2])[1] = 3 - ln(e^1 + e^3 + e^2) = 3 - 3.40760596 = -0.40760596
        let (tok, lp) = sample(&[1.0, 3.0, 2.0], &params(0.0, 0, 1.0), &mut rng);
        assert_eq!(tok, 1);
        assert!((lp - -0.407_606).abs() < 1e-6, "{lp}");
    }

    #[test]
    fn top_k_one_is_greedy_and_logprob_ignores_truncation() {
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..20 {
            let (tok, lp) = sample(&[1.0, 3.0, 2.0], &params(2.0, 1, 1.0), &mut rng);
            assert_eq!(tok, 1);
            // temperature 2: log_softmax([0.5, 1.5, 1.0])[1] = 1.5 - ln(e^.5 + e^1.5 + e) = -0.68026967
            assert!((lp - -0.680_269_7).abs() < 1e-6, "{lp}");
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_the_mass() {
        // probs = softmax([ln .6, ln .3, ln .1]) = [.6, .3, .1]; top_p .85 keeps {0, 1} only.
        let logits = [0.6f32.ln(), 0.3f32.ln(), 0.1f32.ln()];
        let mut rng = StdRng::seed_from_u64(2);
        let mut counts = [0usize; 3];
        for _ in 0..3000 {
            counts[sample(&logits, &params(1.0, 0, 0.85), &mut rng).0 as usize] += 1;
        }
        assert_eq!(counts[2], 0);
        // Renormalised: 2/3 vs 1/3; 3000 draws give a standard error of ~0.009.
        let frac = counts[0] as f64 / 3000.0;
        assert!((frac - 2.0 / 3.0).abs() < 0.04, "{counts:?}");
    }

    #[test]
    fn untruncated_draws_by_the_inverse_cdf_of_the_softmax() {
        // softmax([0, ln 2, ln 3]) = [1/6, 2/6, 3/6]; with u the rng's next draw, the token is
        // the first whose cumulative mass passes u (u < 1/6: 0, u < 3/6: 1, else 2), and its
        // log-prob is ln of its mass.
        let logits = [0.0f32, 2f32.ln(), 3f32.ln()];
        for seed in 0..200 {
            let mut rng = StdRng::seed_from_u64(seed);
            let u = rng.clone().random::<f64>();
            let want = if u < 1.0 / 6.0 {
                0
            } else if u < 3.0 / 6.0 {
                1
            } else {
                2
            };
            let (tok, lp) = sample(&logits, &params(1.0, 0, 1.0), &mut rng);
            assert_eq!(tok, want, "seed {seed}, u {u}");
            let mass = [1.0f32 / 6.0, 2.0 / 6.0, 3.0 / 6.0][want as usize];
            assert!((lp - mass.ln()).abs() < 1e-6, "seed {seed}: {lp}");
        }
    }

    #[test]
    fn same_seed_same_samples() {
        let logits = [0.1f32, 0.2, 0.3, 0.4];
        let draw = |seed| {
            let mut rng = StdRng::seed_from_u64(seed);
            (0..32)
                .map(|_| sample(&logits, &params(1.0, 0, 1.0), &mut rng).0)
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }
}
