//! Log-probabilities of target tokens and entropies from logits, one CUDA block per row (see
//! `logprobs.cu`): the forward reads each row twice (its max, then its exponentials' sums) and
//! writes two floats; the backward reads it once more and writes its gradient. candle's
//! `log_softmax` + `gather` write the (rows, vocab) log-softmax and its exponentials besides.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{CudaStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, bail};

use super::{LOGPROBS, function};

/// Threads of a row's block: enough to stream a long row; its reductions are over 32 warps.
const BLOCK: u32 = 1024;

struct LogprobEntropy {
    entropy: bool,
}

struct LogprobEntropyGrad {
    entropy: bool,
}

/// Where an operand's elements lie in its storage.
type Span = (usize, usize);

/// The rows and vocabulary of contiguous logits, and the spans of both operands.
fn check(l1: &Layout, l2: &Layout) -> Result<(usize, usize, Span, Span)> {
    let (rows, vocab) = l1.shape().dims2()?;
    if vocab == 0 || vocab > u32::MAX as usize {
        bail!("cuda log-probs: a vocabulary of {vocab}");
    }
    let Some(a) = l1.contiguous_offsets() else {
        bail!("cuda log-probs: logits must be contiguous");
    };
    let Some(b) = l2.contiguous_offsets() else {
        bail!("cuda log-probs: targets must be contiguous");
    };
    if b.1 - b.0 != rows {
        bail!("cuda log-probs: {} targets for {rows} rows", b.1 - b.0);
    }
    Ok((rows, vocab, a, b))
}

fn rows_config(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CustomOp2 for LogprobEntropy {
    fn name(&self) -> &'static str {
        "cuda-logprob-entropy"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> Result<(candle_core::CpuStorage, Shape)> {
        bail!("cuda log-probs: the CPU has its own kernel (roll-cpu-kernels)")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (rows, vocab, (a, b), (ta, tb)) = check(l1, l2)?;
        let dev = s1.device();
        let logits = s1.as_cuda_slice::<f32>()?.slice(a..b);
        let targets = s2.as_cuda_slice::<u32>()?.slice(ta..tb);
        let out = dev.alloc_zeros::<f32>(rows * 2)?;
        if rows > 0 {
            let func = function(dev, &LOGPROBS, "logprob_entropy_f32")?;
            let (vocab, entropy) = (vocab as u32, i32::from(self.entropy));
            let stream = dev.cuda_stream();
            let mut builder = stream.launch_builder(&func);
            builder.arg(&logits);
            builder.arg(&targets);
            builder.arg(&out);
            builder.arg(&vocab);
            builder.arg(&entropy);
            // SAFETY: the kernel reads `rows * vocab` logits and `rows` targets (checked above)
            // and writes `rows * 2` floats of `out`, one block per row.
            #[allow(unsafe_code)]
            unsafe { builder.launch(rows_config(rows)) }.w()?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev.clone()),
            Shape::from((rows, 2)),
        ))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // (d logp, d H, logp, H) per row: the log-sum-exp is x_t - logp_t.
        let grad_and_res = Tensor::cat(&[grad_res, res], 1)?.contiguous()?;
        let grad = logits.contiguous()?.apply_op3_no_bwd(
            &targets.contiguous()?,
            &grad_and_res,
            &LogprobEntropyGrad {
                entropy: self.entropy,
            },
        )?;
        Ok((Some(grad), None))
    }
}

impl CustomOp3 for LogprobEntropyGrad {
    fn name(&self) -> &'static str {
        "cuda-logprob-entropy-grad"
    }

    fn cpu_fwd(
        &self,
        _: &candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
        _: &candle_core::CpuStorage,
        _: &Layout,
    ) -> Result<(candle_core::CpuStorage, Shape)> {
        bail!("cuda log-probs: the CPU has its own kernel (roll-cpu-kernels)")
    }

    fn cuda_fwd(
        &self,
        s1: &CudaStorage,
        l1: &Layout,
        s2: &CudaStorage,
        l2: &Layout,
        s3: &CudaStorage,
        l3: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (rows, vocab, (a, b), (ta, tb)) = check(l1, l2)?;
        let Some((ga, gb)) = l3.contiguous_offsets() else {
            bail!("cuda log-probs: the gradient must be contiguous");
        };
        if gb - ga != rows * 4 {
            bail!(
                "cuda log-probs: {} gradient values for {rows} rows",
                gb - ga
            );
        }
        let dev = s1.device();
        let logits = s1.as_cuda_slice::<f32>()?.slice(a..b);
        let targets = s2.as_cuda_slice::<u32>()?.slice(ta..tb);
        let g = s3.as_cuda_slice::<f32>()?.slice(ga..gb);
        // SAFETY: every element is written by the kernel below (one block per row covers the
        // row's `vocab` columns) before anything reads it.
        #[allow(unsafe_code)]
        let d = unsafe { dev.alloc::<f32>(rows * vocab) }?;
        if rows > 0 {
            let func = function(dev, &LOGPROBS, "logprob_entropy_grad_f32")?;
            let (vocab, entropy) = (vocab as u32, i32::from(self.entropy));
            let stream = dev.cuda_stream();
            let mut builder = stream.launch_builder(&func);
            builder.arg(&logits);
            builder.arg(&targets);
            builder.arg(&g);
            builder.arg(&d);
            builder.arg(&vocab);
            builder.arg(&entropy);
            // SAFETY: reads `rows * vocab` logits, `rows` targets and `rows * 4` gradient values
            // (checked above); writes the `rows * vocab` floats of `d`.
            #[allow(unsafe_code)]
            unsafe { builder.launch(rows_config(rows)) }.w()?;
        }
        Ok((
            CudaStorage::wrap_cuda_slice(d, dev.clone()),
            Shape::from((rows, vocab)),
        ))
    }
}

/// logits: (batch, seq, vocab) f32 on a CUDA device, targets: (batch, seq) u32 ->
/// (log-prob of each target, entropy of each position, all zero unless `entropy`), both
/// (batch, seq), differentiable with respect to the logits.
pub fn logprobs_and_entropy(
    logits: &Tensor,
    targets: &Tensor,
    entropy: bool,
) -> Result<(Tensor, Tensor)> {
    let (b, s, v) = logits.dims3()?;
    let targets = targets
        .to_dtype(candle_core::DType::U32)?
        .flatten_all()?
        .contiguous()?;
    let rows = logits
        .reshape((b * s, v))?
        .contiguous()?
        .apply_op2(&targets, LogprobEntropy { entropy })?;
    let lp = rows.narrow(1, 0, 1)?.reshape((b, s))?;
    let h = rows.narrow(1, 1, 1)?.reshape((b, s))?;
    Ok((lp, h))
}
