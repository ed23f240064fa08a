//! roll-tui's CUDA kernels, for the places where candle's generic CUDA path wastes the most: the
//! per-token log-probs and entropies of the policy loss straight from the logits, forward and
//! backward, without the (rows, vocab) log-softmax that `log_softmax` + `gather` write out
//! ([`logprobs`]); the optimizer's AdamW step in one pass over each parameter ([`adamw`]); and
//! decode steps' attention over the KV cache in one kernel ([`decode_attention`]).
//!
//! Each kernel is compiled to PTX for sm_80 and sm_90 at build time (`build.rs`, nvcc from the
//! toolkit, each PTX assembled by ptxas there), loaded into candle's CUDA device on first use,
//! and launched on candle's stream. Each has a candle fallback in roll-tui (where [`applies`]
//! says no: another device, dtype or GPU generation, or the kernels turned off), and a test
//! against that fallback which runs where a GPU exists and says plainly that it did not run
//! where none does (`tests/cuda_kernels.rs`).

pub mod adamw;
pub mod decode_attention;
pub mod logprobs;

use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::cuda_backend::CudaDevice;
use candle_core::cuda_backend::cudarc::driver::CudaFunction;
use candle_core::{DType, Result, Tensor};

/// Whether the kernels are on in this process (the default); off, roll-tui takes candle's ops.
static ENABLED: AtomicBool = AtomicBool::new(true);

/// Turn the kernels on or off for this whole process (`roll-tui devices --check` turns them off
/// to compute the same steps through candle's ops).
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// The PTX of each module, by architecture.
struct Module {
    name: &'static str,
    sm80: &'static str,
    sm90: &'static str,
}

const LOGPROBS: Module = Module {
    name: "roll_logprobs",
    sm80: include_str!(concat!(env!("OUT_DIR"), "/logprobs.sm_80.ptx")),
    sm90: include_str!(concat!(env!("OUT_DIR"), "/logprobs.sm_90.ptx")),
};

const DECODE_ATTENTION: Module = Module {
    name: "roll_decode_attention",
    sm80: include_str!(concat!(env!("OUT_DIR"), "/decode_attention.sm_80.ptx")),
    sm90: include_str!(concat!(env!("OUT_DIR"), "/decode_attention.sm_90.ptx")),
};

const ADAMW: Module = Module {
    name: "roll_adamw",
    sm80: include_str!(concat!(env!("OUT_DIR"), "/adamw.sm_80.ptx")),
    sm90: include_str!(concat!(env!("OUT_DIR"), "/adamw.sm_90.ptx")),
};

/// The compute capability of a device as major * 10 + minor, if the driver says.
fn capability(dev: &CudaDevice) -> Option<i32> {
    let (major, minor) = dev.cuda_stream().context().compute_capability().ok()?;
    Some(major * 10 + minor)
}

/// Whether the kernels can take this tensor: f32, contiguous, on a CUDA device of compute
/// capability 8.0 or newer, with the kernels on.
pub fn applies(t: &Tensor) -> bool {
    if !enabled() || t.dtype() != DType::F32 || !t.is_contiguous() {
        return false;
    }
    match t.device() {
        candle_core::Device::Cuda(dev) => capability(dev).is_some_and(|c| c >= 80),
        _ => false,
    }
}

/// Whether the kernels can take a tensor of any dtype on this device: a CUDA device of compute
/// capability 8.0 or newer, with the kernels on.
pub fn applies_any(t: &Tensor) -> bool {
    if !enabled() {
        return false;
    }
    match t.device() {
        candle_core::Device::Cuda(dev) => capability(dev).is_some_and(|c| c >= 80),
        _ => false,
    }
}

/// `function` of `module`, loaded into `dev` the first time (the PTX of its architecture).
fn function(dev: &CudaDevice, module: &Module, function: &str) -> Result<CudaFunction> {
    let cap = capability(dev).unwrap_or(0);
    let (ptx, arch) = if cap >= 90 {
        (module.sm90, "sm90")
    } else {
        (module.sm80, "sm80")
    };
    Ok(dev
        .get_or_load_custom_func(function, &format!("{}_{arch}", module.name), ptx)?
        .into_cuda_function())
}
