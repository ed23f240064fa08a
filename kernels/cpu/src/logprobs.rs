//! The log-softmax, target gather and entropy of the policy loss in one pass per row, on CPU: per
//! token the target's log-probability and the distribution's entropy, without materialising the
//! (rows, vocab) log-softmax. At a large vocabulary those intermediate copies (1024 rows x 151,936
//! logits is 620 MB each, and candle's `log_softmax` and its backward keep several) set the peak
//! memory of training. The backward is written by hand from
//!   d logp_t / d x_v = [v = t] - p_v,     d H / d x_v = -p_v (log p_v + H),
//! with `H = -sum_v p_v log p_v`; both are checked against candle's ops in the tests.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, bail};
use rayon::prelude::*;

use super::{f32_data, vexp};

/// Exponentials taken at once in a row's log-sum-exp: a stack buffer, a few cache lines.
const EXP_BLOCK: usize = 1024;

/// Per row: (log-probability of the target, entropy), from logits (rows, vocab) f32.
struct LogprobEntropy {
    entropy: bool,
}

/// The gradient with respect to the logits, from the gradients of both outputs, for the columns
/// `cols` of every row (all of them for [`LogprobEntropy`]; one chunk at a time for the fused head
/// of [`crate::head`]), times `scale` (the logits' own factor, 1/temperature, for the head).
pub(crate) struct LogprobEntropyGrad {
    pub(crate) entropy: bool,
    pub(crate) cols: std::ops::Range<usize>,
    pub(crate) scale: f32,
}

/// The contiguous f32 data of a storage, or why not.
fn f32_slice<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    f32_data(s, l, "fused log-probs", what)
}

fn targets_of(s: &CpuStorage, l: &Layout) -> Result<Vec<usize>> {
    let (a, b) = l.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg("fused log-probs: targets must be contiguous".into())
    })?;
    Ok(match s {
        CpuStorage::U32(v) => v[a..b].iter().map(|&t| t as usize).collect(),
        CpuStorage::I64(v) => v[a..b].iter().map(|&t| t.max(0) as usize).collect(),
        other => bail!(
            "fused log-probs: targets must be u32 or i64, got {:?}",
            other.dtype()
        ),
    })
}

/// The rows of logits (rows, vocab) and one target per row, checked: what both passes read.
pub(crate) fn rows_and_targets<'a>(
    s1: &'a CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
) -> Result<(usize, &'a [f32], Vec<usize>)> {
    let (rows, vocab) = l1.shape().dims2()?;
    if vocab == 0 {
        bail!("fused log-probs: the vocabulary is empty");
    }
    let logits = f32_slice(s1, l1, "logits")?;
    let targets = targets_of(s2, l2)?;
    if targets.len() != rows {
        bail!("fused log-probs: {} targets for {rows} rows", targets.len());
    }
    if let Some(t) = targets.iter().find(|&&t| t >= vocab) {
        bail!("fused log-probs: target {t} is outside the vocabulary of {vocab}");
    }
    Ok((vocab, logits, targets))
}

/// log-sum-exp of a row and, when asked, `sum_v p_v x_v` (for the entropy): exponentials in f32,
/// sums in f64.
fn row_stats(x: &[f32], entropy: bool) -> (f64, f64) {
    let m = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let (mut s, mut sx) = (0.0f64, 0.0f64);
    // The exponentials a block at a time (vectorised), summed in the row's order.
    let mut buf = [0f32; EXP_BLOCK];
    for xs in x.chunks(EXP_BLOCK) {
        let es = &mut buf[..xs.len()];
        for (e, &v) in es.iter_mut().zip(xs) {
            *e = v - m;
        }
        vexp::exp_in_place(es);
        for (&e, &v) in es.iter().zip(xs) {
            s += f64::from(e);
            if entropy && e > 0.0 {
                sx += f64::from(e) * f64::from(v);
            }
        }
    }
    let lse = f64::from(m) + s.ln();
    (lse, if entropy { sx / s } else { 0.0 })
}

/// Per row of `logits` (rows, vocab): the log-probability of its target and, when asked, the
/// entropy (else 0), interleaved (rows, 2).
pub(crate) fn logprob_entropy_rows(
    logits: &[f32],
    vocab: usize,
    targets: &[usize],
    entropy: bool,
) -> Vec<f32> {
    let mut out = vec![0f32; targets.len() * 2];
    out.par_chunks_mut(2)
        .zip(logits.par_chunks(vocab))
        .zip(targets.par_iter())
        .for_each(|((o, x), &t)| {
            let (lse, mean_x) = row_stats(x, entropy);
            o[0] = (x[t] as f64 - lse) as f32;
            o[1] = if entropy { (lse - mean_x) as f32 } else { 0.0 };
        });
    out
}

impl CustomOp2 for LogprobEntropy {
    fn name(&self) -> &'static str {
        "logprob-entropy"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (vocab, logits, targets) = rows_and_targets(s1, l1, s2, l2)?;
        let out = logprob_entropy_rows(logits, vocab, &targets, self.entropy);
        Ok((CpuStorage::F32(out), Shape::from((targets.len(), 2))))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // The forward's outputs ride along: the log-sum-exp is x_t - logp_t, so the backward
        // makes one pass over each row instead of two.
        let grad_and_res = Tensor::cat(&[grad_res, res], 1)?.contiguous()?;
        let grad = logits.contiguous()?.apply_op3_no_bwd(
            &targets.contiguous()?,
            &grad_and_res,
            &LogprobEntropyGrad {
                entropy: self.entropy,
                cols: 0..logits.dim(1)?,
                scale: 1.0,
            },
        )?;
        Ok((Some(grad), None))
    }
}

impl CustomOp3 for LogprobEntropyGrad {
    fn name(&self) -> &'static str {
        "logprob-entropy-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (vocab, logits, targets) = rows_and_targets(s1, l1, s2, l2)?;
        let rows = targets.len();
        let cols = self.cols.clone();
        if cols.start > cols.end || cols.end > vocab {
            bail!("fused log-probs: columns {cols:?} outside a vocabulary of {vocab}");
        }
        let width = cols.len();
        // Per row: d logp, d H, logp, H.
        let g = f32_slice(s3, l3, "the gradient")?;
        if g.len() != rows * 4 {
            bail!(
                "fused log-probs: {} gradient values for {rows} rows",
                g.len()
            );
        }
        let mut out = vec![0f32; rows * width];
        if width == 0 {
            return Ok((CpuStorage::F32(out), Shape::from((rows, width))));
        }
        out.par_chunks_mut(width)
            .zip(logits.par_chunks(vocab))
            .zip(targets.par_iter().zip(g.par_chunks(4)))
            .for_each(|((d, x), (&t, g))| {
                let g_lp = g[0];
                let (g_h, h) = if self.entropy {
                    (g[1], g[3])
                } else {
                    (0.0, 0.0)
                };
                let lse = x[t] - g[2];
                // p = exp(logp) into d first (vectorised), then each gradient from it.
                for (dv, &xv) in d.iter_mut().zip(&x[cols.clone()]) {
                    *dv = xv - lse;
                }
                vexp::exp_in_place(d);
                for (dv, &xv) in d.iter_mut().zip(&x[cols.clone()]) {
                    let (logp, p) = (xv - lse, *dv);
                    let entropy_term = if p > 0.0 { -p * (logp + h) } else { 0.0 };
                    *dv = -g_lp * p + g_h * entropy_term;
                }
                if cols.contains(&t) {
                    d[t - cols.start] += g_lp;
                }
                if self.scale != 1.0 {
                    d.iter_mut().for_each(|dv| *dv *= self.scale);
                }
            });
        Ok((CpuStorage::F32(out), Shape::from((rows, width))))
    }
}

/// Whether [`logprobs_and_entropy`] runs here: f32 logits on the CPU (elsewhere the loss keeps
/// candle's ops).
pub fn applies(logits: &Tensor) -> bool {
    crate::applies(logits)
}

/// logits: (batch, seq, vocab) f32 on CPU, targets: (batch, seq) u32/i64 ->
/// (log-prob of each target, entropy of each position): two (batch, seq) tensors, the entropy all
/// zero unless `entropy`.
pub fn logprobs_and_entropy(
    logits: &Tensor,
    targets: &Tensor,
    entropy: bool,
) -> Result<(Tensor, Tensor)> {
    let (b, s, v) = logits.dims3()?;
    let rows = logits.reshape((b * s, v))?.contiguous()?.apply_op2(
        &targets.flatten_all()?.contiguous()?,
        LogprobEntropy { entropy },
    )?;
    let lp = rows.narrow(1, 0, 1)?.reshape((b, s))?;
    let h = rows.narrow(1, 1, 1)?.reshape((b, s))?;
    Ok((lp, h))
}

#[cfg(test)]
#[path = "logprobs_tests.rs"]
pub(crate) mod tests;
