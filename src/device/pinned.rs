//! GPU tensors moved to and from host-copy files through page-locked memory (`--features cuda`).
//!
//! A host copy is a safetensors file in shared memory (`scheduler::host_copy`). Staged, a GPU
//! tensor reaches it through two copies: the driver copies device memory into a pinned buffer of
//! its own and from there into candle's pageable `Vec`, which is then written to the file (and the
//! reverse to reload). Here the file itself is mapped and registered with the driver
//! (`cuMemHostRegister`, portable to every context), once a process per file: each tensor is then
//! one asynchronous DMA between its device memory and its bytes in the file, queued on candle's
//! stream, with one wait for the whole move. NCCL's shared-memory transport registers `/dev/shm`
//! mappings the same way.
//!
//! Why candle's stream and not a copy stream of our own: candle allocates from CUDA's
//! stream-ordered pool on that stream, so a tensor dropped after a copy queued on another stream
//! could be reused before the copy ran; on candle's stream every copy is ordered after the work
//! that wrote the tensor and before any that reuses its memory. An offload or reload is a phase
//! boundary: there is no compute for a second stream to overlap with.
//!
//! Registrations are kept (the point of pinning is to pay for it once) and checked against the
//! file's identity (device, inode, length) at every use: a copy written anew under its name is
//! mapped anew. [`forget_under`] lets go of the mappings of a host area that is being removed.
//! Only files in shared memory (tmpfs) are pinned; a file elsewhere, or one the driver refuses to
//! register (said once on stderr), is remembered as unpinnable and the caller's staged path moves
//! it.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use candle_core::cuda_backend::CudaStorageSlice;
use candle_core::cuda_backend::cudarc::driver::{CudaContext, CudaStream, DevicePtr, sys};
use candle_core::{Storage, Tensor};

use super::{Moved, Way};

/// A host copy's file mapped and registered with the driver.
struct Mapped {
    map: memmap2::MmapRaw,
    /// (device, inode, length) of the file mapped.
    identity: (u64, u64, u64),
    /// The context the registration was made in (bound again to undo it).
    context: Arc<CudaContext>,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // The mapping is unmapped after this (memmap2's own drop): unregister it first. A failure
        // here leaves only a registration of memory about to be unmapped; nothing to report to.
        if self.context.bind_to_thread().is_ok() {
            // SAFETY: the pointer is the start of the range registered in `register`, and no copy
            // into or out of it is queued: every move waits for its copies before it returns.
            #[allow(unsafe_code)]
            let _ = unsafe { sys::cuMemHostUnregister(self.map.as_mut_ptr().cast()) };
        }
    }
}

#[derive(Default)]
struct Registry {
    mapped: HashMap<PathBuf, Arc<Mapped>>,
    unpinnable: HashSet<PathBuf>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn with_registry<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut guard = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    f(guard.get_or_insert_with(Registry::default))
}

fn identity(path: &Path) -> Result<(u64, u64, u64), String> {
    let m = std::fs::metadata(path).map_err(|e| e.to_string())?;
    Ok((m.dev(), m.ino(), m.len()))
}

/// The registered mapping of the file at `path`, made the first time (or anew where the file
/// changed); `None` where the driver refused to register it.
fn mapping(path: &Path, context: &Arc<CudaContext>) -> Result<Option<Arc<Mapped>>, String> {
    let id = identity(path)?;
    let known = with_registry(|r| {
        if r.unpinnable.contains(path) {
            return Err(());
        }
        Ok(r.mapped.get(path).filter(|m| m.identity == id).cloned())
    });
    match known {
        Err(()) => return Ok(None),
        Ok(Some(m)) => return Ok(Some(m)),
        Ok(None) => {}
    }
    // Only files in shared memory (tmpfs): a page-locked mapping of a network file system's file
    // (a cluster's `shared_dir`) would keep pages the other hosts never see written.
    let fs = nix::sys::statfs::statfs(path).map_err(|e| e.to_string())?;
    if fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC {
        with_registry(|r| r.unpinnable.insert(path.to_path_buf()));
        return Ok(None);
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| e.to_string())?;
    let map = memmap2::MmapOptions::new()
        .map_raw(&file)
        .map_err(|e| format!("mapping it into memory: {e}"))?;
    if map.len() as u64 != id.2 {
        return Err(format!(
            "it changed while being mapped ({} bytes, then {})",
            id.2,
            map.len()
        ));
    }
    context.bind_to_thread().map_err(|e| e.to_string())?;
    // SAFETY: the range is the whole of a live mapping of `map.len()` bytes, which `Mapped`
    // unregisters before it is unmapped.
    #[allow(unsafe_code)]
    let registered = unsafe {
        sys::cuMemHostRegister_v2(
            map.as_mut_ptr().cast(),
            map.len(),
            sys::CU_MEMHOSTREGISTER_PORTABLE,
        )
    }
    .result();
    if let Err(e) = registered {
        eprintln!(
            "host copy {}: the driver would not page-lock it ({e:?}); it moves staged through \
             pageable memory",
            path.display()
        );
        with_registry(|r| r.unpinnable.insert(path.to_path_buf()));
        return Ok(None);
    }
    let mapped = Arc::new(Mapped {
        map,
        identity: id,
        context: context.clone(),
    });
    with_registry(|r| r.mapped.insert(path.to_path_buf(), mapped.clone()));
    Ok(Some(mapped))
}

/// Let go of the mappings of every file under `dir` (a host area being removed): their memory is
/// unregistered and unmapped, so removing the files frees it.
pub fn forget_under(dir: &Path) {
    with_registry(|r| {
        r.mapped.retain(|p, _| !p.starts_with(dir));
        r.unpinnable.retain(|p| !p.starts_with(dir));
    });
}

/// The device address and byte length of a contiguous GPU tensor's elements; `None` where it is
/// not one, or its elements are not whole bytes each.
fn device_span(slice: &CudaStorageSlice, stream: &CudaStream, t: &Tensor) -> Option<(u64, usize)> {
    use CudaStorageSlice as S;
    let (base, size) = match slice {
        S::U8(s) => (s.device_ptr(stream).0, 1),
        S::U32(s) => (s.device_ptr(stream).0, 4),
        S::I16(s) => (s.device_ptr(stream).0, 2),
        S::I32(s) => (s.device_ptr(stream).0, 4),
        S::I64(s) => (s.device_ptr(stream).0, 8),
        S::BF16(s) => (s.device_ptr(stream).0, 2),
        S::F16(s) => (s.device_ptr(stream).0, 2),
        S::F32(s) => (s.device_ptr(stream).0, 4),
        S::F64(s) => (s.device_ptr(stream).0, 8),
        S::F8E4M3(_) | S::F6E2M3(_) | S::F6E3M2(_) | S::F4(_) | S::F8E8M0(_) => return None,
    };
    if size != t.dtype().size_in_bytes() {
        return None;
    }
    let (start, end) = t.layout().contiguous_offsets()?;
    Some((base + (start * size) as u64, (end - start) * size))
}

/// The ordinal and candle's stream of a GPU that holds every one of `parts`; `None` where there
/// are none, or one is off the GPUs, or two are on different ones.
pub(super) fn one_gpu(parts: &[(u64, &Tensor)]) -> Option<(usize, Arc<CudaStream>)> {
    let (_, first) = parts.first()?;
    let candle_core::Device::Cuda(device) = first.device() else {
        return None;
    };
    if parts
        .iter()
        .any(|(_, t)| !t.device().same_device(first.device()))
    {
        return None;
    }
    Some((super::spec_of(first.device()).index, device.cuda_stream()))
}

/// Each part as `(offset, device address, bytes)`, read under the storage guards the caller holds
/// (`guards[i]` of `parts[i]`) until the copies of them are waited for; `None` where a tensor is
/// not a contiguous GPU tensor of whole-byte elements.
pub(super) fn spans_of<G: std::ops::Deref<Target = Storage>>(
    parts: &[(u64, &Tensor)],
    guards: &[(G, &candle_core::Layout)],
    stream: &CudaStream,
) -> Option<Vec<(u64, u64, usize)>> {
    parts
        .iter()
        .zip(guards)
        .map(|((offset, t), (storage, _))| {
            let Storage::Cuda(cuda) = &**storage else {
                return None;
            };
            let (address, len) = device_span(&cuda.slice, stream, t)?;
            Some((*offset, address, len))
        })
        .collect()
}

/// Move each `(offset, tensor)` between the tensor's device memory and its bytes at `offset` of
/// the file at `path`. `Ok(None)` where this does not apply (a tensor off the GPUs or of
/// sub-byte elements, tensors on two devices, no tensors, a file the driver would not page-lock):
/// the caller moves them staged. The caller has checked each range against the file's header.
pub fn move_tensors(
    path: &Path,
    parts: &[(u64, &Tensor)],
    way: Way,
) -> Result<Option<Moved>, String> {
    let Some((_, stream)) = one_gpu(parts) else {
        return Ok(None);
    };
    let guards: Vec<_> = parts.iter().map(|(_, t)| t.storage_and_layout()).collect();
    let Some(spans) = spans_of(parts, &guards, &stream) else {
        return Ok(None);
    };
    let moved = move_spans(path, &stream, &spans, way)?;
    drop(guards);
    Ok(moved)
}

/// Move each `(offset, device address, bytes)` between device memory and the file at `path`
/// through its page-locked mapping, on `stream`, and wait for them; `Ok(None)` where the driver
/// would not page-lock the file. The caller keeps the device memory alive until this returns.
pub(super) fn move_spans(
    path: &Path,
    stream: &Arc<CudaStream>,
    spans: &[(u64, u64, usize)],
    way: Way,
) -> Result<Option<Moved>, String> {
    let context = stream.context().clone();
    let Some(mapped) = mapping(path, &context)? else {
        return Ok(None);
    };
    let file_len = mapped.map.len() as u64;
    if let Some((offset, _, len)) = spans.iter().find(|(o, _, l)| o + *l as u64 > file_len) {
        return Err(format!(
            "{len} bytes at {offset} run past the end of the file ({file_len} bytes)"
        ));
    }
    let timed = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let start = stream.record_event(timed).map_err(|e| e.to_string())?;
    context.bind_to_thread().map_err(|e| e.to_string())?;
    let host = mapped.map.as_mut_ptr();
    let mut bytes = 0u64;
    for (offset, address, len) in spans {
        // SAFETY: `host + offset .. + len` lies inside the registered mapping (checked above) and
        // `address .. + len` inside device memory the caller keeps alive until this returns; the
        // mapping is held until the copies are waited for below, and the copies are queued on the
        // stream that orders the memory's other work.
        #[allow(unsafe_code)]
        let r = unsafe {
            let at = host.add(*offset as usize);
            match way {
                Way::ToHost => {
                    sys::cuMemcpyDtoHAsync_v2(at.cast(), *address, *len, stream.cu_stream())
                }
                Way::ToDevice => {
                    sys::cuMemcpyHtoDAsync_v2(*address, at.cast(), *len, stream.cu_stream())
                }
            }
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            // Wait for what was queued before saying so: the mapping must outlive it.
            let _ = stream.synchronize();
            return Err(format!("copy of {len} bytes at {offset}: {r:?}"));
        }
        bytes += *len as u64;
    }
    let end = stream.record_event(timed).map_err(|e| e.to_string())?;
    end.synchronize().map_err(|e| e.to_string())?;
    let ms = start.elapsed_ms(&end).map_err(|e| e.to_string())?;
    MOVED_BYTES.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    Ok(Some(Moved {
        bytes,
        device_seconds: f64::from(ms) / 1e3,
    }))
}

/// Bytes moved through page-locked mappings by this process (what `roll-tui devices --check`
/// reads to tell a pinned move from a staged one).
pub static MOVED_BYTES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The seconds of one copy of `bytes` from `device`'s memory into a page-locked buffer of the
/// driver's and of one back, timed with events on its stream: the ceiling a move between the GPU
/// and host memory can reach on this machine, which `roll-tui devices --check` measures host-copy
/// moves against in the same sitting.
pub fn memcpy_seconds(device: &candle_core::Device, bytes: usize) -> Result<(f64, f64), String> {
    let candle_core::Device::Cuda(dev) = device else {
        return Err("not a GPU".into());
    };
    let stream = dev.cuda_stream();
    let e = |e: candle_core::cuda_backend::cudarc::driver::DriverError| e.to_string();
    // Plain page-locked memory (flags 0): cudarc's default, write-combined, is slow for the CPU
    // to read, which a host copy is.
    // SAFETY: the buffer's bytes are only ever written by the device copy below and never read
    // on the host.
    #[allow(unsafe_code)]
    let mut host =
        unsafe { stream.context().alloc_pinned_with_flags::<u8>(bytes, 0) }.map_err(e)?;
    let mut buffer = stream.alloc_zeros::<u8>(bytes).map_err(e)?;
    let timed = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let a = stream.record_event(timed).map_err(e)?;
    stream.memcpy_dtoh(&buffer, &mut host).map_err(e)?;
    let b = stream.record_event(timed).map_err(e)?;
    stream.memcpy_htod(&host, &mut buffer).map_err(e)?;
    let c = stream.record_event(timed).map_err(e)?;
    c.synchronize().map_err(e)?;
    let to_host = a.elapsed_ms(&b).map_err(e)?;
    let to_device = b.elapsed_ms(&c).map_err(e)?;
    Ok((f64::from(to_host) / 1e3, f64::from(to_device) / 1e3))
}
