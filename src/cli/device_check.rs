//! `roll-tui devices --check` on one GPU: our CUDA kernels against candle's ops there, and small
//! models of each architecture computed on the GPU (the device-generic path plus our kernels)
//! against the same weights on the CPU (the fused kernels), through `crate::parity`.

use anyhow::Result;
use candle_core::{D, Tensor, Var};

use crate::device::{self, DeviceSpec};
use crate::model::Arch;
use crate::parity::{Finding, compare, outputs, small_model};

/// GPU against CPU: f32 on both, sums taken in other orders by other kernels.
const TOLERANCE: f32 = 1e-4;

fn report(device: DeviceSpec, what: &str, f: &Finding) -> usize {
    let verdict = if f.ok { "pass" } else { "FAIL" };
    println!(
        "{device} {verdict} {what}: {} (worst {:.2e})",
        f.what, f.worst
    );
    usize::from(!f.ok)
}

/// The log-prob kernel against log_softmax + gather and -sum p log p, values and gradients, at a
/// small vocabulary and at Qwen's 151,936.
fn logprob_kernel(dev: &candle_core::Device) -> Result<Vec<Finding>> {
    let mut found = vec![];
    for (rows, vocab) in [(6usize, 1000usize), (2, 151_936)] {
        let logits = Var::randn(0f32, 3.0, (1, rows, vocab), dev)?;
        let targets: Vec<u32> = (0..rows).map(|i| ((i * 7919) % vocab) as u32).collect();
        let targets = Tensor::from_vec(targets, (1, rows), dev)?;
        let w = Tensor::arange(0f32, rows as f32, dev)?.reshape((1, rows))?;
        let run = |kernel: bool| -> Result<(Vec<f32>, Vec<f32>)> {
            let (lp, h) = if kernel {
                roll_cuda_kernels::logprobs::logprobs_and_entropy(
                    logits.as_tensor(),
                    &targets,
                    true,
                )?
            } else {
                let logp = candle_nn::ops::log_softmax(logits.as_tensor(), D::Minus1)?;
                let lp = logp
                    .gather(&targets.unsqueeze(2)?.contiguous()?, 2)?
                    .squeeze(2)?;
                let h = (logp.exp()? * &logp)?.sum(D::Minus1)?.neg()?;
                (lp, h)
            };
            let loss = ((&lp * &w)?.sum_all()? - (&h * 0.5)?.sum_all()?)?;
            let grads = loss.backward()?;
            let g = grads
                .get(logits.as_tensor())
                .ok_or_else(|| anyhow::anyhow!("the kernel gave no gradient"))?;
            let values = Tensor::cat(&[lp.flatten_all()?, h.flatten_all()?], 0)?;
            Ok((values.to_vec1()?, g.flatten_all()?.to_vec1()?))
        };
        let (k, c) = (run(true)?, run(false)?);
        let worst = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
                .fold(0f32, f32::max)
        };
        for (what, w) in [
            ("values", worst(&k.0, &c.0)),
            ("gradient", worst(&k.1, &c.1)),
        ] {
            found.push(Finding {
                what: format!("log-prob kernel {what} at vocab {vocab}"),
                ok: w <= 1e-5,
                worst: w,
            });
        }
    }
    Ok(found)
}

/// Every check on `device`; returns how many failed.
pub fn check(device: DeviceSpec) -> Result<usize> {
    let dev = device::open(device)?;
    let mut failed = 0;
    for f in logprob_kernel(&dev)? {
        failed += report(device, "kernel", &f);
    }
    for arch in [Arch::Qwen2, Arch::Qwen3, Arch::Llama] {
        let cpu = small_model(arch)?;
        let reference = outputs(&cpu)?;
        let gpu = small_model(arch)?.to_device(&dev)?;
        let on_gpu = outputs(&gpu)?;
        for f in compare(&on_gpu, &reference, TOLERANCE) {
            failed += report(device, arch.model_type(), &f);
        }
    }
    Ok(failed)
}
