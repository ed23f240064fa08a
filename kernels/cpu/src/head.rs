//! The output head and the policy loss's log-probs in one differentiable op: from the last hidden
//! states and the head's weight, per token the target's log-probability and the entropy of
//! `softmax(hidden @ weightᵀ * scale)`, with a backward that never holds the whole logits'
//! gradient.
//!
//! Composed from candle's ops (a matmul, then [`crate::logprobs`]), the backward materialises the
//! (rows, vocab) gradient of the logits, candle adds it into a zero-filled copy, and the matmul's
//! backward transposes the weight's gradient twice more: at the Qwen2.5-0.5B shape (1024 rows x
//! 151,936 tokens) that is ~2.7 GB of transient memory, the peak of a training step. Here the
//! backward walks the vocabulary in chunks of columns: a chunk's logit gradient (a few tens of
//! MB) is computed from the forward's logits, multiplied into the hidden states' gradient (added
//! in place) and written by the product straight into its rows of the weight's gradient (no zero
//! fill of either, no copy), then dropped. The arithmetic is the same.
//!
//! The forward's logits are kept for the backward (they are computed once, by the same gemm call
//! as candle's matmul without its zero fill, so the log-probs equal the unfused path's bit for
//! bit); only the gradients' summation order over chunks differs (tested to 1e-5 relative).
//!
//! Given a [`WeightGradSink`], the backward leaves the weight's gradient there instead of handing
//! it to candle, which would add it into a zero-filled tensor of the weight's size (two more
//! copies at the moment the step's memory peaks); whoever owns the sink (roll-tui's `Tape`) must
//! then put it into the gradient store itself.

use std::sync::{Arc, Mutex};

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor, bail};

use crate::logprobs::{LogprobEntropyGrad, logprob_entropy_rows, rows_and_targets};
use crate::{fresh, product};

/// Where the head's backward leaves the gradients of its weight (a variable) for its owner to
/// collect after candle's backward: (the weight, its gradient) per backward. Once collected with
/// [`WeightGradSink::close`], the sink is shut: a later backward through the same graph hands the
/// gradient to candle as usual rather than leave it where nobody reads.
#[derive(Clone)]
pub struct WeightGradSink(Arc<Mutex<Option<Vec<WeightGrad>>>>);

/// A weight and its gradient.
pub type WeightGrad = (Tensor, Tensor);

impl Default for WeightGradSink {
    fn default() -> Self {
        WeightGradSink(Arc::new(Mutex::new(Some(Vec::new()))))
    }
}

impl WeightGradSink {
    /// Everything left so far; the sink takes no more.
    pub fn close(&self) -> Vec<WeightGrad> {
        self.lock().take().unwrap_or_default()
    }

    /// Leave `grad` here, or give it back when the sink is closed.
    fn put(&self, weight: Tensor, grad: Tensor) -> Option<Tensor> {
        match self.lock().as_mut() {
            Some(left) => {
                left.push((weight, grad));
                None
            }
            None => Some(grad),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Vec<WeightGrad>>> {
        // A poisoned lock only means a backward panicked midway; its entries are whole tensors.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// How many logit gradients one chunk of the backward holds at most (32 MB of f32).
const CHUNK_VALUES: usize = 8 << 20;

/// Per row (log-probability of the target, entropy) of the head's scaled logits, which it reads as
/// its third operand; the first two (hidden, weight) are what the backward differentiates.
struct HeadLogprobs {
    /// (rows) u32 or i64, contiguous.
    targets: Tensor,
    scale: f64,
    entropy: bool,
    /// At most this many logit gradients per chunk of the backward.
    chunk_values: usize,
    /// Where the weight's gradient goes instead of candle's store, when given.
    sink: Option<WeightGradSink>,
}

impl CustomOp3 for HeadLogprobs {
    fn name(&self) -> &'static str {
        "head-logprobs"
    }

    fn cpu_fwd(
        &self,
        _hidden: &CpuStorage,
        l1: &Layout,
        _weight: &CpuStorage,
        l2: &Layout,
        logits: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (rows, dim) = l1.shape().dims2()?;
        let (vocab, w_dim) = l2.shape().dims2()?;
        if (w_dim, l3.shape().dims2()?) != (dim, (rows, vocab)) {
            bail!(
                "fused head: hidden {:?}, weight {:?} and logits {:?} do not fit",
                l1.shape(),
                l2.shape(),
                l3.shape()
            );
        }
        let (targets, lt) = self.targets.storage_and_layout();
        let Storage::Cpu(targets) = &*targets else {
            bail!("fused head: the targets must be on the CPU");
        };
        let (vocab, logits, targets) = rows_and_targets(logits, l3, targets, lt)?;
        let out = logprob_entropy_rows(logits, vocab, &targets, self.entropy);
        Ok((CpuStorage::F32(out), Shape::from((rows, 2))))
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        logits: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let weight_var = weight;
        // A frozen weight (detached: neither a variable nor computed in candle's graph, as a
        // LoRA run's head is) takes no gradient: its vocab x dim product is skipped.
        let weight_grad = weight_var.is_variable() || weight_var.track_op();
        // The products below are arithmetic on values, not part of any graph: detached, the
        // gradients hold no reference to the forward's tensors.
        let (hidden, weight) = (hidden.detach(), weight.detach());
        let (rows, dim) = hidden.dims2()?;
        // A bf16 weight is widened chunk by chunk below, never whole.
        let widen = |rows: Tensor| rows.to_dtype(DType::F32);
        let vocab = weight.dim(0)?;
        // As in `logprobs`: the forward's outputs ride along, giving each row's log-sum-exp.
        let grad_and_res = Tensor::cat(&[grad_res, res], 1)?.contiguous()?;
        let chunk = (self.chunk_values / rows.max(1)).clamp(1, vocab.max(1));
        // The weight's gradient is written chunk by chunk into its rows, never zero-filled or
        // copied; the hidden states' is the first chunk's product, each later one added in place.
        let mut grad_weight = fresh::unwritten(if weight_grad { vocab * dim } else { 0 });
        let mut grad_hidden: Option<Tensor> = None;
        for start in (0..vocab).step_by(chunk) {
            let len = chunk.min(vocab - start);
            let d_logits = logits.apply_op3_no_bwd(
                &self.targets,
                &grad_and_res,
                &LogprobEntropyGrad {
                    entropy: self.entropy,
                    cols: start..start + len,
                    scale: self.scale as f32,
                },
            )?;
            let weight_rows = widen(weight.narrow(0, start, len)?)?;
            match &grad_hidden {
                None => grad_hidden = Some(product::matmul(&d_logits, &weight_rows)?),
                Some(sum) => product::matmul_add(sum, &d_logits, &weight_rows)?,
            }
            if weight_grad {
                product::matmul_into(
                    &mut grad_weight[start * dim..(start + len) * dim],
                    &d_logits.t()?,
                    &hidden,
                )?;
            }
        }
        let grad_hidden = match grad_hidden {
            Some(g) => g,
            None => Tensor::zeros((rows, dim), DType::F32, hidden.device())?,
        };
        if !weight_grad {
            return Ok((Some(grad_hidden), None, None));
        }
        // SAFETY: the chunks' rows cover the vocabulary, each written whole by its product.
        #[allow(unsafe_code)]
        let grad_weight = unsafe { fresh::assume_written(grad_weight) };
        let grad_weight = Tensor::from_vec(grad_weight, (vocab, dim), weight.device())?;
        match &self.sink {
            // Only a variable's gradient can wait outside the graph: a weight computed from
            // something else must pass its gradient on through candle.
            Some(sink) if weight_var.is_variable() => {
                let back = sink.put(weight_var.clone(), grad_weight);
                Ok((Some(grad_hidden), back, None))
            }
            // In the weight's dtype, as candle's store keeps a variable's gradient.
            _ => Ok((
                Some(grad_hidden),
                Some(grad_weight.to_dtype(weight.dtype())?),
                None,
            )),
        }
    }
}

/// Whether [`head_logprobs`] runs here: f32 hidden states and an f32 or bf16 weight on the CPU.
pub fn applies(hidden: &Tensor, weight: &Tensor) -> bool {
    crate::applies(hidden)
        && weight.device().is_cpu()
        && matches!(weight.dtype(), DType::F32 | DType::BF16)
}

/// hidden: (batch, seq, dim) f32, weight: (vocab, dim) f32, targets: (batch, seq) u32/i64 ->
/// (log-prob of each target, entropy of each position) under `softmax(hidden @ weightᵀ * scale)`:
/// two (batch, seq) tensors, the entropy all zero unless `entropy`. Differentiable in `hidden`
/// and `weight`; with a `sink`, a variable weight's gradient is left there (see
/// [`WeightGradSink`]), not in the backward's store.
///
/// A bf16 weight (a bf16 model computing in f32) is taken as stored: the forward widens it for
/// its product and drops the copy, the backward widens it a chunk at a time, and its gradient is
/// made in f32, left in the sink as it is (whose owner rounds it) or handed to candle in bf16.
/// The values and gradients are those of the widened weight, bit for bit.
pub fn head_logprobs(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    scale: f64,
    entropy: bool,
    sink: Option<&WeightGradSink>,
) -> Result<(Tensor, Tensor)> {
    head_logprobs_in_chunks(hidden, weight, targets, scale, entropy, CHUNK_VALUES, sink)
}

/// [`head_logprobs`] with chunks of at most `chunk_values` logit gradients (the tests make them
/// small, so that several chunks and a short last one are exercised on small shapes).
fn head_logprobs_in_chunks(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    scale: f64,
    entropy: bool,
    chunk_values: usize,
    sink: Option<&WeightGradSink>,
) -> Result<(Tensor, Tensor)> {
    let (b, s, dim) = hidden.dims3()?;
    if targets.dims() != [b, s] {
        bail!(
            "fused head: targets {:?} for hidden states {:?}",
            targets.shape(),
            hidden.shape()
        );
    }
    let hidden = hidden.reshape((b * s, dim))?.contiguous()?;
    let weight = weight.contiguous()?;
    // The same gemm call as candle's matmul in the unfused head, less its output's zero fill: the
    // log-probs are the same bits.
    let mut logits = product::matmul(
        &hidden.detach(),
        &weight.detach().to_dtype(DType::F32)?.t()?,
    )?;
    if scale != 1.0 {
        // `affine(s, 0)` is what `logits / temperature` runs (with s = 1 / temperature).
        logits = logits.affine(scale, 0.0)?;
    }
    let op = HeadLogprobs {
        targets: targets.flatten_all()?.contiguous()?,
        scale,
        entropy,
        chunk_values,
        sink: sink.cloned(),
    };
    let rows = hidden.apply_op3(&weight, &logits, op)?;
    let lp = rows.narrow(1, 0, 1)?.reshape((b, s))?;
    let h = rows.narrow(1, 1, 1)?.reshape((b, s))?;
    Ok((lp, h))
}

#[cfg(test)]
#[path = "head_tests.rs"]
mod tests;
