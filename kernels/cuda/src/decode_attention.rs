//! Attention of a decode step (one query position a sequence) over the KV cache, one CUDA block
//! per query row (see `decode_attention.cu`), for the device-generic path's inference
//! (`src/model/attention.rs`): one kernel and one small scratch of scores where candle's ops take
//! four kernels and three intermediate tensors.

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::WrapErr;
use candle_core::cuda_backend::cudarc::driver::{
    CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::{CudaStorage, CustomOp3, DType, Layout, Result, Shape, Storage, Tensor, bail};

use super::{DECODE_ATTENTION, function};

/// Threads of a row's block: the keys' dot products one a thread, then the head's elements.
const BLOCK: u32 = 128;
/// Head dimensions above this take candle's ops.
const MAX_HEAD_DIM: usize = 512;

/// Whether [`attend`] takes these. q: (b, kv_heads, groups, hd) contiguous (one query position a
/// sequence); k, v: (b, kv_heads, keys, hd), each row of hd contiguous (the cache's narrowed
/// views are); mask: (b, 1, groups, keys); f32 or bf16, all on one GPU.
pub fn applies(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor) -> bool {
    let (Ok((b, nkv, g, hd)), Ok((kb, knkv, keys, khd))) = (q.dims4(), k.dims4()) else {
        return false;
    };
    crate::applies_any(q)
        && matches!(q.dtype(), DType::F32 | DType::BF16)
        && k.dtype() == q.dtype()
        && v.dtype() == q.dtype()
        && q.is_contiguous()
        && (kb, knkv, khd) == (b, nkv, hd)
        && v.dims() == k.dims()
        && k.stride()[3] == 1
        && k.stride() == v.stride()
        && mask.dims() == [b, 1, g, keys]
        && hd <= MAX_HEAD_DIM
        && keys > 0
        && k.device().same_device(q.device())
        && v.device().same_device(q.device())
        && mask.device().same_device(q.device())
}

struct Decode {
    mask: Tensor,
    scale: f32,
}

fn view<'a, T: DeviceRepr + candle_core::cuda_backend::CudaDType>(
    s: &'a CudaStorage,
    l: &Layout,
) -> Result<CudaView<'a, T>> {
    Ok(s.as_cuda_slice::<T>()?.slice(l.start_offset()..))
}

impl Decode {
    #[allow(clippy::too_many_arguments)]
    fn launch<T: DeviceRepr + candle_core::cuda_backend::CudaDType>(
        &self,
        name: &str,
        q: &CudaStorage,
        lq: &Layout,
        k: &CudaStorage,
        lk: &Layout,
        v: &CudaStorage,
        lv: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        let (b, nkv, g, hd) = lq.shape().dims4()?;
        let keys = lk.shape().dims()[2];
        let rows = b * nkv * g;
        let dev = q.device();
        let (mask_storage, mask_layout) = self.mask.storage_and_layout();
        let Storage::Cuda(mask) = &*mask_storage else {
            bail!("cuda decode attention: the mask is not on the GPU");
        };
        let Some((ma, mb)) = mask_layout.contiguous_offsets() else {
            bail!("cuda decode attention: the mask must be contiguous");
        };
        let mask = mask.as_cuda_slice::<f32>()?.slice(ma..mb);
        let (qv, kv, vv) = (view::<T>(q, lq)?, view::<T>(k, lk)?, view::<T>(v, lv)?);
        // SAFETY: every score is written by the kernel before it reads it, and every output
        // element once (a block's threads cover its row's head).
        #[allow(unsafe_code)]
        let scores = unsafe { dev.alloc::<f32>(rows * keys) }?;
        #[allow(unsafe_code)]
        let out = unsafe { dev.alloc::<T>(rows * hd) }?;
        let func = function(dev, &DECODE_ATTENTION, name)?;
        let stream = dev.cuda_stream();
        let mut builder = stream.launch_builder(&func);
        let stride = lk.stride();
        let dims = [nkv as u32, g as u32, keys as u32, hd as u32];
        let strides = [stride[0] as u64, stride[1] as u64, stride[2] as u64];
        builder.arg(&qv);
        builder.arg(&kv);
        builder.arg(&vv);
        builder.arg(&mask);
        builder.arg(&scores);
        builder.arg(&out);
        for d in &dims {
            builder.arg(d);
        }
        for s in &strides {
            builder.arg(s);
        }
        builder.arg(&self.scale);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: q holds rows * hd elements and k, v every (b, kv head, key) row of hd at the
        // strides passed (checked by `applies`); the mask rows * keys floats; the kernel writes
        // `scores` and `out`, which it alone holds.
        #[allow(unsafe_code)]
        unsafe { builder.launch(cfg) }.w()?;
        drop(mask_storage);
        Ok((
            CudaStorage::wrap_cuda_slice(out, dev.clone()),
            Shape::from((b, nkv, g, hd)),
        ))
    }
}

impl CustomOp3 for Decode {
    fn name(&self) -> &'static str {
        "cuda-decode-attention"
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
        bail!("cuda decode attention: the CPU has its own kernel (roll-cpu-kernels)")
    }

    fn cuda_fwd(
        &self,
        q: &CudaStorage,
        lq: &Layout,
        k: &CudaStorage,
        lk: &Layout,
        v: &CudaStorage,
        lv: &Layout,
    ) -> Result<(CudaStorage, Shape)> {
        match q.dtype() {
            DType::F32 => self.launch::<f32>("decode_attention_f32", q, lq, k, lk, v, lv),
            DType::BF16 => self.launch::<half::bf16>("decode_attention_bf16", q, lq, k, lk, v, lv),
            other => bail!("cuda decode attention: {other:?} is not f32 or bf16"),
        }
    }
}

/// softmax(q k^T * scale + mask) v for one query position a sequence (see [`applies`]) ->
/// (b, kv_heads, groups, hd) in q's dtype; no gradient (inference).
pub fn attend(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, scale: f64) -> Result<Tensor> {
    if !applies(q, k, v, mask) {
        bail!("cuda decode attention: these shapes, dtypes or devices are not its");
    }
    let op = Decode {
        mask: mask.to_dtype(DType::F32)?.contiguous()?,
        scale: scale as f32,
    };
    q.detach().apply_op3_no_bwd(&k.detach(), &v.detach(), &op)
}
