//! Weights handed between processes on one GPU through CUDA IPC (`--features cuda`).
//!
//! candle's tensors live in CUDA's stream-ordered pool, whose allocations `cuIpcGetMemHandle`
//! cannot export. So the sending process keeps one staging buffer of its own from plain
//! `cuMemAlloc`, laid out byte for byte as the receiver's host-copy file (each tensor at its
//! offset in the file; the header's bytes unused), exported when it is made: a sync copies each
//! tensor into it device to device and hands the receiver the handle; the receiver opens the
//! handle (kept open while it stays the same) and copies each tensor out of it device to device,
//! at the offsets its own copy of the file's header gives. No byte goes through host memory. The
//! receiver closes the handle when it lets go of its weights, and the sender then frees the
//! buffer (`IpcStage::release`): a time-shared GPU needs the memory for training.
//!
//! The buffer also holds the last weights sent, so the host copy can be brought up to date from
//! it by one DMA into the file's page-locked mapping ([`Stage::write_back`]) when something is
//! about to read the file (an offload, a replacement worker).

use std::sync::{Arc, Mutex};

use candle_core::Tensor;
use candle_core::cuda_backend::cudarc::driver::{CudaContext, CudaStream, sys};

use super::pinned::{move_spans, one_gpu, spans_of};
use super::{IpcHandle, Way};

/// A staging buffer of device memory exported for IPC.
pub struct Stage {
    address: sys::CUdeviceptr,
    len: usize,
    ordinal: usize,
    handle: Vec<u8>,
    stream: Arc<CudaStream>,
}

impl Drop for Stage {
    fn drop(&mut self) {
        let context = self.stream.context();
        if context.bind_to_thread().is_ok() {
            // Wait for copies still queued out of the buffer before freeing it; nothing to report
            // a failure to while dropping.
            let _ = self.stream.synchronize();
            // SAFETY: `address` came from cuMemAlloc in this context and is freed once, here.
            #[allow(unsafe_code)]
            let _ = unsafe { sys::cuMemFree_v2(self.address) };
        }
    }
}

fn driver(what: &str, r: sys::CUresult) -> Result<(), String> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what}: {r:?}"))
    }
}

/// Queue a device-to-device copy of each `(offset, tensor)` between the tensor's memory and
/// `base + offset` (into the tensor with `into_tensors`), and wait for them. `Ok(None)` where a
/// tensor is not a contiguous GPU tensor of whole-byte elements.
fn copy_spans(
    base: sys::CUdeviceptr,
    limit: usize,
    stream: &Arc<CudaStream>,
    tensors: &[(u64, &Tensor)],
    into_tensors: bool,
) -> Result<Option<u64>, String> {
    let guards: Vec<_> = tensors
        .iter()
        .map(|(_, t)| t.storage_and_layout())
        .collect();
    let Some(spans) = spans_of(tensors, &guards, stream) else {
        return Ok(None);
    };
    if let Some((offset, _, len)) = spans.iter().find(|(o, _, l)| *o as usize + l > limit) {
        return Err(format!(
            "{len} bytes at {offset} run past the staging buffer's {limit}"
        ));
    }
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| e.to_string())?;
    let mut bytes = 0;
    for (offset, address, len) in &spans {
        let staged = base + offset;
        let (dst, src) = if into_tensors {
            (*address, staged)
        } else {
            (staged, *address)
        };
        // SAFETY: both ranges lie inside live device memory (the tensor's span from its layout,
        // the staging buffer's range checked against its length above); the storages' guards
        // are held until the copies are waited for below.
        #[allow(unsafe_code)]
        let r = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, *len, stream.cu_stream()) };
        if r != sys::CUresult::CUDA_SUCCESS {
            let _ = stream.synchronize();
            return Err(format!("device copy of {len} bytes: {r:?}"));
        }
        bytes += *len as u64;
    }
    stream.synchronize().map_err(|e| e.to_string())?;
    drop(guards);
    Ok(Some(bytes))
}

impl Stage {
    /// Copy `tensors` (each at its offset of a host-copy file of `file_len` bytes) into the
    /// staging buffer, made (and exported) the first time or when the length changed; the handle
    /// to send. `Ok(None)` where IPC does not apply (a tensor off the GPUs, ...).
    pub fn send(
        stage: &mut Option<Stage>,
        file_len: u64,
        tensors: &[(u64, &Tensor)],
    ) -> Result<Option<IpcHandle>, String> {
        let Some((ordinal, stream)) = one_gpu(tensors) else {
            return Ok(None);
        };
        let len = file_len as usize;
        let reuse = stage
            .as_ref()
            .is_some_and(|s| s.len == len && s.ordinal == ordinal);
        if !reuse {
            *stage = None;
            *stage = Some(Stage::new(len, ordinal, stream.clone())?);
        }
        let Some(s) = stage.as_ref() else {
            return Err("no staging buffer".into());
        };
        if copy_spans(s.address, s.len, &s.stream, tensors, false)?.is_none() {
            return Ok(None);
        }
        Ok(Some(s.handle()))
    }

    /// What a receiver opens the buffer by.
    pub fn handle(&self) -> IpcHandle {
        IpcHandle {
            handle: self.handle.clone(),
            device: self.ordinal,
            len: self.len as u64,
        }
    }

    fn new(len: usize, ordinal: usize, stream: Arc<CudaStream>) -> Result<Stage, String> {
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| e.to_string())?;
        let mut address: sys::CUdeviceptr = 0;
        // SAFETY: the driver writes the new allocation's address into `address`.
        #[allow(unsafe_code)]
        let r = unsafe { sys::cuMemAlloc_v2(&mut address, len.max(1)) };
        driver("cuMemAlloc of the IPC staging buffer", r)?;
        let mut stage = Stage {
            address,
            len,
            ordinal,
            handle: vec![],
            stream,
        };
        let mut handle = std::mem::MaybeUninit::<sys::CUipcMemHandle>::uninit();
        // SAFETY: `address` is a live cuMemAlloc allocation of this context; the driver fills
        // the handle, which is read only after it said so.
        #[allow(unsafe_code)]
        let handle = unsafe {
            driver(
                "cuIpcGetMemHandle",
                sys::cuIpcGetMemHandle(handle.as_mut_ptr(), address),
            )?;
            handle.assume_init()
        };
        stage.handle = handle.reserved.iter().map(|b| *b as u8).collect();
        Ok(stage)
    }

    /// Bring the host-copy file at `path` up to date from the buffer: each `(offset, bytes)`
    /// range (the file's tensors) by DMA into its page-locked mapping, or, where the file cannot
    /// be page-locked, staged through host memory a chunk at a time.
    pub fn write_back(
        &self,
        path: &std::path::Path,
        ranges: &[(u64, usize)],
    ) -> Result<(), String> {
        let spans: Vec<(u64, u64, usize)> = ranges
            .iter()
            .map(|&(offset, len)| (offset, self.address + offset, len))
            .collect();
        if let Some((offset, _, len)) = spans.iter().find(|(o, _, l)| *o as usize + l > self.len) {
            return Err(format!(
                "{len} bytes at {offset} run past the staging buffer's {}",
                self.len
            ));
        }
        if move_spans(path, &self.stream, &spans, Way::ToHost)?.is_some() {
            return Ok(());
        }
        self.write_back_staged(path, &spans)
    }

    /// [`Stage::write_back`] through a host buffer of at most 64 MiB.
    fn write_back_staged(
        &self,
        path: &std::path::Path,
        spans: &[(u64, u64, usize)],
    ) -> Result<(), String> {
        use std::os::unix::fs::FileExt;
        const CHUNK: usize = 64 << 20;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| e.to_string())?;
        let context = self.stream.context();
        context.bind_to_thread().map_err(|e| e.to_string())?;
        self.stream.synchronize().map_err(|e| e.to_string())?;
        let longest = spans.iter().map(|(_, _, l)| *l).max().unwrap_or(0);
        let mut buffer = vec![0u8; longest.min(CHUNK)];
        for (offset, address, len) in spans {
            let mut done = 0;
            while done < *len {
                let n = (len - done).min(CHUNK);
                // SAFETY: `address + done .. + n` lies inside the staging buffer (the caller
                // checked each span against its length) and `buffer` holds at least `n` bytes;
                // the copy is synchronous.
                #[allow(unsafe_code)]
                let r = unsafe {
                    sys::cuMemcpyDtoH_v2(buffer.as_mut_ptr().cast(), address + done as u64, n)
                };
                driver("staged copy of the IPC buffer", r)?;
                file.write_all_at(&buffer[..n], offset + done as u64)
                    .map_err(|e| e.to_string())?;
                done += n;
            }
        }
        Ok(())
    }
}

/// The handle this process opened last, and where its memory is mapped here: a sender keeps its
/// buffer from one sync to the receiver's next offload, so one handle serves several copies.
struct Opened {
    handle: Vec<u8>,
    address: sys::CUdeviceptr,
    context: Arc<CudaContext>,
}

impl Drop for Opened {
    fn drop(&mut self) {
        if self.context.bind_to_thread().is_ok() {
            // SAFETY: `address` came from cuIpcOpenMemHandle in this context and is closed once.
            #[allow(unsafe_code)]
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.address) };
        }
    }
}

static OPENED: Mutex<Option<Opened>> = Mutex::new(None);

/// Close the handle this process opened, if any (a worker letting go of its weights: the sender
/// frees its buffer after that).
pub fn close() {
    *OPENED.lock().unwrap_or_else(|p| p.into_inner()) = None;
}

/// Copy each `(offset, tensor)` out of the sender's staging buffer that `handle` names into the
/// tensor's memory, device to device; the bytes copied. The tensors must be on the handle's GPU.
pub fn receive(handle: &IpcHandle, tensors: &[(u64, &Tensor)]) -> Result<Option<u64>, String> {
    let Some((ordinal, stream)) = one_gpu(tensors) else {
        return Ok(None);
    };
    if ordinal != handle.device {
        return Err(format!(
            "the weights are on cuda:{} and this worker's on cuda:{ordinal}",
            handle.device
        ));
    }
    let raw: [u8; 64] = handle
        .handle
        .as_slice()
        .try_into()
        .map_err(|_| format!("an IPC handle of {} bytes, not 64", handle.handle.len()))?;
    let mut opened = OPENED.lock().unwrap_or_else(|p| p.into_inner());
    if opened.as_ref().is_none_or(|o| o.handle != handle.handle) {
        *opened = None;
        let context = stream.context().clone();
        context.bind_to_thread().map_err(|e| e.to_string())?;
        let mut ipc = sys::CUipcMemHandle { reserved: [0; 64] };
        for (dst, src) in ipc.reserved.iter_mut().zip(raw) {
            *dst = src as _;
        }
        let mut address: sys::CUdeviceptr = 0;
        // SAFETY: the driver writes the mapped address of the sender's buffer into `address`.
        #[allow(unsafe_code)]
        let r = unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut address,
                ipc,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        };
        driver("cuIpcOpenMemHandle", r)?;
        *opened = Some(Opened {
            handle: handle.handle.clone(),
            address,
            context,
        });
    }
    let Some(o) = opened.as_ref() else {
        return Err("the IPC handle is not open".into());
    };
    copy_spans(o.address, handle.len as usize, &stream, tensors, true)
}
