//! Our CUDA kernels (kernels/cuda) against candle's ops on the same GPU. They run where a CUDA
//! device exists (the GPU check, benches/gpu/check.sh); elsewhere each test prints that it did not
//! run and why, and passes: a machine without a GPU cannot run them.

#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use candle_core::{D, DType, Device, Tensor, Var};
use roll::device::DeviceSpec;

/// The GPU, or `None` after saying plainly why these tests do not run here.
fn gpu(test: &str) -> Option<Device> {
    match roll::device::open(DeviceSpec::cuda(0)) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("{test}: NOT RUN (no GPU here: {e})");
            None
        }
    }
}

/// log-probs and entropies from candle's ops: log_softmax, gather, -sum p log p.
fn by_candle(logits: &Tensor, targets: &Tensor) -> (Tensor, Tensor) {
    let logp = candle_nn::ops::log_softmax(logits, D::Minus1).unwrap();
    let lp = logp
        .gather(&targets.unsqueeze(2).unwrap().contiguous().unwrap(), 2)
        .unwrap()
        .squeeze(2)
        .unwrap();
    let h = (logp.exp().unwrap() * &logp)
        .unwrap()
        .sum(D::Minus1)
        .unwrap()
        .neg()
        .unwrap();
    (lp, h)
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

fn close(what: &str, a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "{what}[{i}]: kernel {x} vs candle {y}"
        );
    }
}

/// Values and gradients of the log-prob kernel against candle's ops, at a small vocabulary and at
/// Qwen's 151,936 (where the kernel's blocks loop over the row many times).
#[test]
fn the_logprob_kernel_matches_candles_ops() {
    let Some(dev) = gpu("the_logprob_kernel_matches_candles_ops") else {
        return;
    };
    for (b, s, vocab) in [(2usize, 3usize, 1000usize), (1, 2, 151_936)] {
        let logits = Var::randn(0f32, 3.0, (b, s, vocab), &dev).unwrap();
        let targets: Vec<u32> = (0..b * s).map(|i| ((i * 7919) % vocab) as u32).collect();
        let targets = Tensor::from_vec(targets, (b, s), &dev).unwrap();
        assert!(roll_cuda_kernels::applies(logits.as_tensor()));
        let w = Tensor::arange(0f32, (b * s) as f32, &dev)
            .unwrap()
            .reshape((b, s))
            .unwrap();
        let run = |kernel: bool| {
            let (lp, h) = if kernel {
                roll_cuda_kernels::logprobs::logprobs_and_entropy(
                    logits.as_tensor(),
                    &targets,
                    true,
                )
                .unwrap()
            } else {
                by_candle(logits.as_tensor(), &targets)
            };
            // A loss that weights each position's log-prob and entropy differently.
            let loss = ((&lp * &w).unwrap().sum_all().unwrap()
                - (&h * 0.5).unwrap().sum_all().unwrap())
            .unwrap();
            let grad = loss.backward().unwrap();
            let g = grad.get(logits.as_tensor()).unwrap();
            (flat(&lp), flat(&h), flat(g))
        };
        let (k, c) = (run(true), run(false));
        close(&format!("log-probs at {vocab}"), &k.0, &c.0, 1e-5);
        close(&format!("entropy at {vocab}"), &k.1, &c.1, 1e-5);
        close(&format!("gradient at {vocab}"), &k.2, &c.2, 1e-5);
    }
    // The engine's loss takes the kernel on the GPU.
    let logits = Tensor::randn(0f32, 1.0, (1, 2, 50), &dev).unwrap();
    let targets = Tensor::from_vec(vec![3u32, 7], (1, 2), &dev).unwrap();
    let (lp, _) = roll::algo::sft::token_logprobs_and_entropy(&logits, &targets).unwrap();
    let (want, _) = by_candle(&logits, &targets);
    close("through the loss", &flat(&lp), &flat(&want), 1e-5);
    assert_eq!(lp.dtype(), DType::F32);
}

/// `roll-tui devices --check` on a GPU machine: every GPU listed with its memory, our kernels and
/// small models of each architecture computed on it as on the CPU (roll::parity, 1e-4).
#[test]
fn devices_check_passes_on_every_gpu() {
    if gpu("devices_check_passes_on_every_gpu").is_none() {
        return;
    }
    let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("roll-tui"))
        .args(["devices", "--check"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("cuda:0 ") && text.contains("every check passed"),
        "{text}"
    );
}
