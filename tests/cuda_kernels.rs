//! Our CUDA kernels (kernels/cuda) against candle's ops on the same GPU, and small models on the
//! GPU against the CPU, through the binary (`roll-tui devices --check`, src/cli/device_check.rs).
//! They run where a CUDA device exists (the GPU check, benches/gpu/check.sh); elsewhere each test
//! prints that it did not run and why, and passes: a machine without a GPU cannot run them.

#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use candle_core::{DType, Device, Tensor};
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

/// The engine's loss takes the kernel on a GPU: its log-probs are the kernel's bits.
#[test]
fn the_loss_takes_the_kernel_on_a_gpu() {
    let Some(dev) = gpu("the_loss_takes_the_kernel_on_a_gpu") else {
        return;
    };
    let logits = Tensor::randn(0f32, 1.0, (1, 2, 50), &dev).unwrap();
    let targets = Tensor::from_vec(vec![3u32, 7], (1, 2), &dev).unwrap();
    assert!(roll_cuda_kernels::applies(&logits));
    let (lp, h) = roll::algo::sft::token_logprobs_and_entropy(&logits, &targets).unwrap();
    let (klp, kh) =
        roll_cuda_kernels::logprobs::logprobs_and_entropy(&logits, &targets, true).unwrap();
    let bits = |t: &Tensor| -> Vec<u32> {
        t.flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    assert_eq!((bits(&lp), bits(&h)), (bits(&klp), bits(&kh)));
    assert_eq!(lp.dtype(), DType::F32);
}
