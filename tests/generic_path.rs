//! The device-generic path — candle's ops, which is what a CUDA device runs — against the fused CPU
//! kernels, on the CPU: the same logits for a prefill and cached decode steps (forward), the same
//! response log-probs, entropies and parameter gradients through the training forward (backward),
//! and the same samples and sampling log-probs from the generation engine (generation), to 1e-5
//! in f32, for Qwen2 (q/k/v biases), Qwen3 (q/k norms) and Llama (untied head). What is compared
//! is `roll::parity`, which `roll-tui devices --check` runs between a GPU and the CPU.
//!
//! The fused kernels are switched off for the whole process (`roll::device::use_kernels`), so this
//! file holds one test: the fused results are computed first, then the generic ones. Nothing else
//! runs in this test binary at the same time.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use roll::device::Kernels;
use roll::model::Arch;
use roll::parity::{any_bits_differ, compare, outputs, small_model};

#[test]
fn the_generic_path_computes_what_the_fused_kernels_compute() {
    let archs = [Arch::Qwen2, Arch::Qwen3, Arch::Llama];
    let models: Vec<_> = archs.iter().map(|&a| small_model(a).unwrap()).collect();
    assert_eq!(roll::device::kernels(), Kernels::Auto);
    let fused: Vec<_> = models.iter().map(|m| outputs(m).unwrap()).collect();
    roll::device::use_kernels(Kernels::Generic);
    assert!(
        !roll_cpu_kernels::enabled(),
        "the switch reaches the kernels"
    );
    let generic: Vec<_> = models.iter().map(|m| outputs(m).unwrap()).collect();
    roll::device::use_kernels(Kernels::Auto);
    // Two implementations, not one run twice: their sums are taken in other orders, so some
    // values differ in their last bits.
    assert!(
        generic
            .iter()
            .zip(&fused)
            .any(|(g, f)| any_bits_differ(g, f)),
        "the generic run gave the fused run's bits exactly: the switch did not change the path"
    );
    for ((arch, g), f) in archs.iter().zip(&generic).zip(&fused) {
        assert_eq!(g.samples.len(), 13);
        for finding in compare(g, f, 1e-5) {
            assert!(
                finding.ok,
                "{arch:?} {}: generic is {} off the fused kernels",
                finding.what, finding.worst
            );
        }
    }
}
