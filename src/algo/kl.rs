//! KL between the policy and a reference: per-token estimators, fixed and adaptive coefficient
//! controllers, and where the KL term goes (reward or loss).

use candle_core::{Result, Tensor};
use serde::{Deserialize, Serialize};

/// Log-ratio bound before exponentiating in k3: `exp(20)` is finite in f32, `exp(89)` is not.
const K3_LOG_RATIO_CLAMP: f64 = 20.0;

/// Per-token estimator of `KL(policy || reference)` from log-probs of the sampled tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// `logp - ref_logp` (unbiased, high variance, can be negative).
    K1,
    /// `|logp - ref_logp|`.
    Abs,
    /// `0.5 (logp - ref_logp)^2` (a.k.a. k2).
    Mse,
    /// `exp(ref - logp) - (ref - logp) - 1` (unbiased, low variance, non-negative).
    #[default]
    K3,
}

/// Elementwise KL penalty; differentiable wrt both inputs.
/// logp: (batch, seq), ref_logp: (batch, seq) -> (batch, seq)
pub fn kl_penalty(est: KlEstimator, logp: &Tensor, ref_logp: &Tensor) -> Result<Tensor> {
    let diff = (logp - ref_logp)?;
    match est {
        KlEstimator::K1 => Ok(diff),
        KlEstimator::Abs => diff.abs(),
        KlEstimator::Mse => diff.sqr()?.affine(0.5, 0.0),
        KlEstimator::K3 => {
            // x = ref - logp, clamped so exp(x) stays finite for wildly off-policy tokens.
            let x = diff.neg()?.clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)?;
            (x.exp()? - x)?.affine(1.0, -1.0)
        }
    }
}

/// Whether the KL coefficient is fixed or adapted towards a target KL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum KlControllerKind {
    #[default]
    Fixed,
    Adaptive,
}

/// Where the KL term is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum KlMode {
    /// No KL term.
    #[default]
    None,
    /// Subtracted from the token rewards before advantages (`r_t - coef * kl_t`).
    InReward,
    /// Added to the loss (`loss + coef * aggregate(kl)`).
    InLoss,
}

/// KL coefficient controller (Ziegler et al. 2019, as in PPO-for-LMs implementations).
#[derive(Debug, Clone, PartialEq)]
pub struct KlController {
    kind: KlControllerKind,
    coef: f64,
    target: f64,
    horizon: f64,
}

impl KlController {
    /// `target` and `horizon` are only used by the adaptive controller.
    pub fn new(kind: KlControllerKind, init_coef: f64, target: f64, horizon: f64) -> Self {
        Self {
            kind,
            coef: init_coef,
            target,
            horizon,
        }
    }

    /// Current coefficient.
    pub fn coef(&self) -> f64 {
        self.coef
    }

    /// Continue from a coefficient saved in a checkpoint.
    pub fn set_coef(&mut self, coef: f64) {
        self.coef = coef;
    }

    /// Adaptive: `err = clip(kl / target - 1, -0.2, 0.2)`, `coef *= 1 + err * n_steps / horizon`.
    /// Fixed: no change. A non-positive target or horizon leaves the coefficient unchanged.
    pub fn update(&mut self, current_kl: f64, n_steps: usize) {
        if self.kind == KlControllerKind::Fixed || self.target <= 0.0 || self.horizon <= 0.0 {
            return;
        }
        let err = (current_kl / self.target - 1.0).clamp(-0.2, 0.2);
        self.coef *= 1.0 + err * n_steps as f64 / self.horizon;
    }
}

/// Token rewards with the KL penalty folded in: `scores - coef * kl(logp, ref_logp)`, 0 where masked.
/// scores, logp, ref_logp, mask: (batch, seq) -> (batch, seq)
pub fn kl_in_reward(
    scores: &Tensor,
    logp: &Tensor,
    ref_logp: &Tensor,
    mask: &Tensor,
    est: KlEstimator,
    coef: f64,
) -> Result<Tensor> {
    let kl = kl_penalty(est, &logp.detach(), &ref_logp.detach())?;
    (scores - kl.affine(coef, 0.0)?)? * mask
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on failure
mod tests {
    use super::*;
    use candle_core::Device;

    fn pair() -> (Tensor, Tensor) {
        let d = Device::Cpu;
        // logp - ref = [0.5, -1.0]
        let logp = Tensor::new(&[[-1.0f32, -2.0]], &d).unwrap();
        let r = Tensor::new(&[[-1.5f32, -1.0]], &d).unwrap();
        (logp, r)
    }

    fn kl(est: KlEstimator) -> Vec<f32> {
        let (l, r) = pair();
        kl_penalty(est, &l, &r)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap()
            .concat()
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn estimators_by_hand() {
        close(&kl(KlEstimator::K1), &[0.5, -1.0]);
        close(&kl(KlEstimator::Abs), &[0.5, 1.0]);
        // 0.5 * 0.25 = 0.125, 0.5 * 1 = 0.5
        close(&kl(KlEstimator::Mse), &[0.125, 0.5]);
        // x = ref - logp = [-0.5, 1]: exp(-0.5) + 0.5 - 1 = 0.1065307; e - 1 - 1 = 0.7182818
        close(&kl(KlEstimator::K3), &[0.106_530_66, 0.718_281_8]);
    }

    #[test]
    fn k3_clamps_log_ratio() {
        // x = -100 clamps to -20: exp(-20) + 20 - 1 = 19.000000002; x = +100 would be inf unclamped.
        let d = Device::Cpu;
        let logp = Tensor::new(&[[0.0f32, -100.0]], &d).unwrap();
        let r = Tensor::new(&[[-100.0f32, 0.0]], &d).unwrap();
        let v = kl_penalty(KlEstimator::K3, &logp, &r)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap()
            .concat();
        assert!((v[0] - 19.0).abs() < 1e-4);
        // x = 20: exp(20) - 21 = 485165174.4 (finite)
        assert!(v[1].is_finite() && (v[1] / 485_165_174.4 - 1.0).abs() < 1e-5);
    }

    #[test]
    fn adaptive_controller_by_hand() {
        let mut c = KlController::new(KlControllerKind::Adaptive, 0.1, 6.0, 10_000.0);
        // kl 9: err = 9/6 - 1 = 0.5 -> clipped 0.2; mult = 1 + 0.2 * 1000 / 10000 = 1.02 -> 0.102
        c.update(9.0, 1000);
        assert!((c.coef() - 0.102).abs() < 1e-12);
        // kl 3: err = -0.5 -> -0.2; mult = 1 - 0.2 * 500 / 10000 = 0.99 -> 0.10098
        c.update(3.0, 500);
        assert!((c.coef() - 0.100_98).abs() < 1e-12);
        // kl 6.6: err = 0.1 (unclipped); mult = 1 + 0.1 * 1000 / 10000 = 1.01 -> 0.1019898
        c.update(6.6, 1000);
        assert!((c.coef() - 0.101_989_8).abs() < 1e-9);
    }

    #[test]
    fn fixed_controller_never_moves() {
        let mut c = KlController::new(KlControllerKind::Fixed, 0.05, 6.0, 10_000.0);
        c.update(100.0, 1000);
        assert_eq!(c.coef(), 0.05);
    }

    #[test]
    fn kl_in_reward_by_hand() {
        // scores [[0, 1]] - 0.1 * k1 [0.5, -1.0] = [-0.05, 1.1]; mask [1, 1].
        let (l, r) = pair();
        let d = Device::Cpu;
        let s = Tensor::new(&[[0.0f32, 1.0]], &d).unwrap();
        let m = Tensor::new(&[[1.0f32, 1.0]], &d).unwrap();
        let out = kl_in_reward(&s, &l, &r, &m, KlEstimator::K1, 0.1).unwrap();
        close(&out.to_vec2::<f32>().unwrap().concat(), &[-0.05, 1.1]);
    }

    #[test]
    fn serde_names_and_defaults() {
        let est = [
            (KlEstimator::K1, "k1"),
            (KlEstimator::Abs, "abs"),
            (KlEstimator::Mse, "mse"),
            (KlEstimator::K3, "k3"),
        ];
        for (k, s) in est {
            assert_eq!(serde_json::to_string(&k).unwrap(), format!("\"{s}\""));
        }
        let modes = [
            (KlMode::None, "none"),
            (KlMode::InReward, "in_reward"),
            (KlMode::InLoss, "in_loss"),
        ];
        for (k, s) in modes {
            assert_eq!(
                serde_json::from_str::<KlMode>(&format!("\"{s}\"")).unwrap(),
                k
            );
        }
        for (k, s) in [
            (KlControllerKind::Fixed, "fixed"),
            (KlControllerKind::Adaptive, "adaptive"),
        ] {
            assert_eq!(
                serde_json::from_str::<KlControllerKind>(&format!("\"{s}\"")).unwrap(),
                k
            );
        }
        assert_eq!(KlEstimator::default(), KlEstimator::K3);
        assert_eq!(KlMode::default(), KlMode::None);
        assert_eq!(KlControllerKind::default(), KlControllerKind::Fixed);
    }
}
