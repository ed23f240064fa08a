//! Per-token log-probabilities, entropies and the masked SFT cross-entropy from logits.
//!
//! f32 logits on the CPU go through the fused kernel of [`fused_logprobs`] (one pass per row,
//! hand-written backward), f32 logits on a GPU through roll-cuda-kernels' (`--features cuda`);
//! elsewhere through candle's differentiable ops (`log_softmax` is
//! max/sub/exp/sum/log). The trainer should prefer [`token_logprobs_and_entropy`] when it needs
//! both.

use candle_core::{D, DType, Result, Tensor, bail};

use super::aggregate::masked_mean;
use super::fused_logprobs;

/// The targets' shape against the logits'.
fn check_targets(logits: &Tensor, targets: &Tensor) -> Result<()> {
    let (b, s, _v) = logits.dims3()?;
    if targets.dims() != [b, s] {
        bail!(
            "targets must have shape ({b}, {s}) to match logits {:?}, got {:?}",
            logits.dims(),
            targets.dims()
        );
    }
    Ok(())
}

/// Log-softmax over the vocabulary, with shape checks against the targets.
fn log_probs(logits: &Tensor, targets: Option<&Tensor>) -> Result<Tensor> {
    if let Some(t) = targets {
        check_targets(logits, t)?;
    }
    candle_nn::ops::log_softmax(logits, D::Minus1)
}

/// Gathers `logp[b, s, targets[b, s]]`.
fn gather_targets(logp: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let idx = match targets.dtype() {
        DType::U32 | DType::I64 => targets.clone(),
        _ => targets.to_dtype(DType::U32)?,
    };
    logp.gather(&idx.unsqueeze(2)?.contiguous()?, 2)?.squeeze(2)
}

/// `-sum_v p log p` from log-probs.
fn entropy_from(logp: &Tensor) -> Result<Tensor> {
    (logp.exp()? * logp)?.sum(D::Minus1)?.neg()
}

/// One of our kernels where it applies — the CPU's on f32 CPU logits, the GPU's on f32 CUDA
/// logits (`--features cuda`) — as (log-probs, entropies or zeros); `None` where candle's ops
/// compute them.
fn kernel(logits: &Tensor, targets: &Tensor, entropy: bool) -> Option<Result<(Tensor, Tensor)>> {
    if fused_logprobs::applies(logits) {
        return Some(
            check_targets(logits, targets)
                .and_then(|()| fused_logprobs::logprobs_and_entropy(logits, targets, entropy)),
        );
    }
    #[cfg(feature = "cuda")]
    if roll_cuda_kernels::applies(logits) {
        return Some(check_targets(logits, targets).and_then(|()| {
            roll_cuda_kernels::logprobs::logprobs_and_entropy(logits, targets, entropy)
        }));
    }
    None
}

/// Log-probability of each target token.
/// logits: (batch, seq, vocab), targets: (batch, seq) u32 -> (batch, seq)
pub fn token_logprobs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    if let Some(both) = kernel(logits, targets, false) {
        return Ok(both?.0);
    }
    gather_targets(&log_probs(logits, Some(targets))?, targets)
}

/// Entropy of the softmax at each position.
/// logits: (batch, seq, vocab) -> (batch, seq)
pub fn token_entropy(logits: &Tensor) -> Result<Tensor> {
    let (b, s, _) = logits.dims3()?;
    let any = Tensor::zeros((b, s), DType::U32, logits.device())?;
    if let Some(both) = kernel(logits, &any, true) {
        return Ok(both?.1);
    }
    entropy_from(&log_probs(logits, None)?)
}

/// Both of the above from one pass over the vocabulary (f32 on the CPU or a GPU: our kernels,
/// which never materialise the log-softmax), else one `log_softmax`.
/// logits: (batch, seq, vocab), targets: (batch, seq) u32 -> (logprobs: (batch, seq), entropy: (batch, seq))
pub fn token_logprobs_and_entropy(logits: &Tensor, targets: &Tensor) -> Result<(Tensor, Tensor)> {
    if let Some(both) = kernel(logits, targets, true) {
        return both;
    }
    let logp = log_probs(logits, Some(targets))?;
    Ok((gather_targets(&logp, targets)?, entropy_from(&logp)?))
}

/// Mean negative log-likelihood of the targets over valid tokens (0 when none are valid).
/// logits: (batch, seq, vocab), targets: (batch, seq) u32, mask: (batch, seq) -> scalar
pub fn masked_cross_entropy(logits: &Tensor, targets: &Tensor, mask: &Tensor) -> Result<Tensor> {
    masked_mean(&token_logprobs(logits, targets)?.neg()?, mask)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on failure
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    const LN2: f32 = std::f32::consts::LN_2;
    const LN3: f32 = 1.098_612_3;
    const LN4: f32 = 2.0 * LN2;

    /// (1, 2, 3): position 0 logits [0, 0, 0] -> p = 1/3 each;
    /// position 1 logits [0, ln 2, 0] -> p = [1/4, 1/2, 1/4]. Targets [1, 0].
    fn inputs() -> (Tensor, Tensor) {
        let d = Device::Cpu;
        let logits = Tensor::new(&[[[0.0f32, 0.0, 0.0], [0.0, LN2, 0.0]]], &d).unwrap();
        let targets = Tensor::new(&[[1u32, 0]], &d).unwrap();
        (logits, targets)
    }

    fn close(a: &[f32], b: &[f32]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() < 1e-5, "{a:?} vs {b:?}");
        }
    }

    #[test]
    fn logprobs_and_entropy_by_hand() {
        // logp: [-ln 3, -ln 4]; entropy: ln 3 = 1.0986123 and
        // -(2 * 0.25 * -ln 4 + 0.5 * -ln 2) = ln 2 + 0.5 ln 2 = 1.0397208.
        let (l, t) = inputs();
        let lp = token_logprobs(&l, &t)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap()
            .concat();
        close(&lp, &[-LN3, -LN4]);
        let h = token_entropy(&l)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap()
            .concat();
        close(&h, &[LN3, 1.5 * LN2]);
        let (lp2, h2) = token_logprobs_and_entropy(&l, &t).unwrap();
        close(&lp2.to_vec2::<f32>().unwrap().concat(), &lp);
        close(&h2.to_vec2::<f32>().unwrap().concat(), &h);
        assert!(token_logprobs(&l, &Tensor::new(&[[1u32]], &Device::Cpu).unwrap()).is_err());
    }

    #[test]
    fn gather_picks_per_row_targets() {
        // Batch of 2 with the same logits, different targets: row1 targets [2, 1] -> [-ln 3, -ln 2].
        let (l, _) = inputs();
        let l2 = Tensor::cat(&[&l, &l], 0).unwrap();
        let t = Tensor::new(&[[1u32, 0], [2, 1]], &Device::Cpu).unwrap();
        let lp = token_logprobs(&l2, &t)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap()
            .concat();
        close(&lp, &[-LN3, -LN4, -LN3, -LN2]);
    }

    #[test]
    fn cross_entropy_value_and_gradient() {
        // Both valid: (ln 3 + ln 4) / 2 = 1.2424533; only the first: ln 3.
        // d CE / d logits = (softmax - onehot) / 2:
        //   pos 0: ([1/3, 1/3, 1/3] - [0, 1, 0]) / 2 = [1/6, -1/3, 1/6]
        //   pos 1: ([1/4, 1/2, 1/4] - [1, 0, 0]) / 2 = [-0.375, 0.25, 0.125]
        let (l, t) = inputs();
        let d = Device::Cpu;
        let v = Var::from_tensor(&l).unwrap();
        let ce = masked_cross_entropy(
            v.as_tensor(),
            &t,
            &Tensor::new(&[[1.0f32, 1.0]], &d).unwrap(),
        )
        .unwrap();
        assert!((ce.to_scalar::<f32>().unwrap() - (LN3 + LN4) / 2.0).abs() < 1e-5);
        let g = ce.backward().unwrap();
        let g = g
            .get(v.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        close(&g, &[1.0 / 6.0, -1.0 / 3.0, 1.0 / 6.0, -0.375, 0.25, 0.125]);
        let ce1 =
            masked_cross_entropy(&l, &t, &Tensor::new(&[[1.0f32, 0.0]], &d).unwrap()).unwrap();
        assert!((ce1.to_scalar::<f32>().unwrap() - LN3).abs() < 1e-5);
    }
}
