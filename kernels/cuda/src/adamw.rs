//! One AdamW step over a parameter in place on the GPU (see `adamw.cu`): one pass over the
//! parameter, its gradient and its two moments, where candle's elementwise ops take seven and
//! allocate a tensor for each intermediate.

use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{DType, Result, Storage, Tensor, bail};

use super::{ADAMW, function};

/// The step's scalars: the gradient's clip factor, the betas, the bias corrections
/// `1 - beta^t`, epsilon, the learning rate, and the decoupled weight decay (0: none).
#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub clip: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub correction1: f32,
    pub correction2: f32,
    pub eps: f32,
    pub lr: f32,
    pub weight_decay: f32,
}

/// Whether [`step`] takes these: the parameter, gradient and moments all f32, contiguous, of one
/// shape, on one CUDA device that [`crate::applies`] to.
pub fn applies(param: &Tensor, grad: &Tensor, m: &Tensor, v: &Tensor) -> bool {
    let all = [param, grad, m, v];
    all.iter().all(|t| {
        crate::applies(t)
            && t.dtype() == DType::F32
            && t.dims() == param.dims()
            && t.device().same_device(param.device())
    })
}

/// Update `param`, `m` and `v` in place from `grad` (see [`applies`]).
pub fn step(param: &Tensor, grad: &Tensor, m: &Tensor, v: &Tensor, s: &Step) -> Result<()> {
    if !applies(param, grad, m, v) {
        bail!("cuda adamw: the parameter, gradient and moments must be contiguous f32 on one GPU");
    }
    let n = param.elem_count();
    if n == 0 {
        return Ok(());
    }
    let guards = [param, grad, m, v].map(|t| t.storage_and_layout());
    let mut views = vec![];
    let mut dev = None;
    for (storage, layout) in &guards {
        let Storage::Cuda(cuda) = &**storage else {
            bail!("cuda adamw: a tensor is not on a GPU");
        };
        let Some((a, b)) = layout.contiguous_offsets() else {
            bail!("cuda adamw: a tensor is not contiguous");
        };
        views.push(cuda.as_cuda_slice::<f32>()?.slice(a..b));
        dev.get_or_insert_with(|| cuda.device.clone());
    }
    let Some(dev) = dev else {
        bail!("cuda adamw: no tensors");
    };
    let func = function(&dev, &ADAMW, "adamw_f32")?;
    let stream = dev.cuda_stream();
    let mut builder = stream.launch_builder(&func);
    for view in &views {
        builder.arg(view);
    }
    let scalars = [
        s.clip,
        s.beta1,
        s.beta2,
        s.correction1,
        s.correction2,
        s.eps,
        s.lr,
        s.weight_decay,
    ];
    builder.arg(&n);
    for x in &scalars {
        builder.arg(x);
    }
    let blocks = n.div_ceil(256).min(65_535) as u32;
    let cfg = LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the four views are distinct tensors' elements of `n` f32 each (checked above: one
    // shape, contiguous); the kernel writes the parameter and the moments in place and reads the
    // gradient, and the storages' guards are held until the launch is queued on candle's stream,
    // which orders it before any later use of these tensors.
    #[allow(unsafe_code)]
    unsafe { builder.launch(cfg) }.w()?;
    Ok(())
}
