//! `roll-tui devices --check` on one GPU: our CUDA kernels (log-probs, AdamW) against candle's
//! ops there, host-copy offloads and reloads by DMA bit for bit and their GB/s
//! (`device_transfer.rs`), and small models of each architecture computed on the GPU (the
//! device-generic path plus our kernels) against the same weights on the CPU (the fused
//! kernels), through `crate::parity`.

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

/// Three AdamW steps (weight decay, clipping) of the optimizer with our kernel against the same
/// steps through candle's ops (the kernels turned off), on an f32 and a bf16 parameter.
fn adamw_kernel(dev: &candle_core::Device) -> Result<Vec<Finding>> {
    use crate::train::{AdamW, GradAccumulator, OptimizerConfig};
    let mut found = vec![];
    for dtype in [candle_core::DType::F32, candle_core::DType::BF16] {
        let init = Tensor::randn(0f32, 1.0, (64, 48), dev)?;
        let run = |kernel: bool| -> Result<Vec<f32>> {
            roll_cuda_kernels::set_enabled(kernel);
            let w = Var::from_tensor(&init.to_dtype(dtype)?)?;
            let vars = vec![("w".to_string(), w.clone())];
            let cfg = OptimizerConfig {
                lr: 1e-2,
                weight_decay: 0.1,
                max_grad_norm: Some(0.5),
                ..OptimizerConfig::default()
            };
            let mut opt = AdamW::new(vars.clone(), cfg, 10)?;
            for k in 0..3 {
                let target = (init.affine(0.5, k as f64)?).to_dtype(candle_core::DType::F32)?;
                let loss = (w.to_dtype(candle_core::DType::F32)? - target)?
                    .sqr()?
                    .sum_all()?;
                let mut acc = GradAccumulator::default();
                acc.add(&vars, loss.backward()?)?;
                opt.step(acc)?;
            }
            Ok(w.to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1()?)
        };
        let (k, c) = (run(true), run(false));
        roll_cuda_kernels::set_enabled(true);
        let (k, c) = (k?, c?);
        let worst = k
            .iter()
            .zip(&c)
            .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
            .fold(0f32, f32::max);
        // bf16 parameters are their masters rounded: the two may round one element apart.
        let tol = if dtype == candle_core::DType::F32 {
            1e-5
        } else {
            1e-2
        };
        found.push(Finding {
            what: format!("adamw kernel, three steps of a {dtype:?} parameter"),
            ok: worst <= tol,
            worst,
        });
    }
    Ok(found)
}

/// Every check on `device`; returns how many failed.
pub fn check(device: DeviceSpec) -> Result<usize> {
    let dev = device::open(device)?;
    let mut failed = 0;
    for f in logprob_kernel(&dev)?.iter().chain(&adamw_kernel(&dev)?) {
        failed += report(device, "kernel", f);
    }
    for f in super::device_transfer::round_trip(&dev)? {
        failed += report(device, "host copy", &f);
    }
    println!("{device} {}", super::device_transfer::bandwidth(&dev)?);
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
