//! Moving tensors between a GPU and host memory or another process, the seam's side of it: a
//! role's host copy moved by DMA through page-locked memory ([`move_pinned`], `pinned.rs`) and
//! weight sync by CUDA IPC ([`IpcStage`], [`ipc_receive`], `ipc.rs`). In a build without CUDA
//! the moves say they do not apply (`Ok(None)`) and the callers move tensors as on the CPU;
//! only [`ipc_receive`], which no CPU run is sent, says the build has no CUDA.

#[cfg(feature = "cuda")]
use super::{ipc, pinned};
use serde::{Deserialize, Serialize};

#[cfg(not(feature = "cuda"))]
use super::NOT_BUILT;
#[cfg(feature = "cuda")]
use candle_core::Device;

/// Which way a move between a GPU and a host copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// Device memory into the host copy's file.
    ToHost,
    /// The host copy's file into device memory.
    ToDevice,
}

/// A move between GPU memory and a host copy's file through page-locked memory.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moved {
    pub bytes: u64,
    /// The copies' time on the device, between events recorded on its stream around them.
    pub device_seconds: f64,
}

/// Move each `(offset, tensor)` between the tensor's GPU memory and its bytes at `offset` of the
/// host-copy file at `path`, through the file's mapping page-locked with the driver
/// (`device/pinned.rs`). `Ok(None)` where that does not apply — tensors on the CPU, a build
/// without CUDA, elements smaller than a byte, a file the driver would not page-lock — and the
/// caller moves the tensors itself. The caller checks each range against the file's header.
pub fn move_pinned(
    path: &std::path::Path,
    parts: &[(u64, &candle_core::Tensor)],
    way: Way,
) -> Result<Option<Moved>, String> {
    #[cfg(feature = "cuda")]
    {
        pinned::move_tensors(path, parts, way)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (path, parts, way);
        Ok(None)
    }
}

/// Bytes this process moved through page-locked host-copy mappings ([`move_pinned`]); 0
/// without CUDA.
pub fn pinned_bytes_moved() -> u64 {
    #[cfg(feature = "cuda")]
    {
        pinned::MOVED_BYTES.load(std::sync::atomic::Ordering::Relaxed)
    }
    #[cfg(not(feature = "cuda"))]
    0
}

/// The seconds of one copy of `bytes` between `device` and a page-locked buffer, each way
/// (device to host, host to device): the ceiling host-copy moves are measured against.
#[cfg(feature = "cuda")]
pub fn pinned_memcpy_seconds(device: &Device, bytes: usize) -> Result<(f64, f64), String> {
    pinned::memcpy_seconds(device, bytes)
}

/// A GPU buffer another process on the same GPU can open (CUDA IPC): what weight sync sends
/// actor_infer's worker in place of a host copy when both compute on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpcHandle {
    /// The driver's 64-byte handle.
    pub handle: Vec<u8>,
    /// The GPU's ordinal.
    pub device: usize,
    /// The buffer's length in bytes.
    pub len: u64,
}

/// The sending side of CUDA IPC weight sync: one buffer of device memory the sender's process
/// exports once and copies each sync's tensors into, laid out as the receiver's host-copy file
/// (`device/ipc.rs`). Empty until the first send, and always in a build without CUDA.
#[derive(Default)]
pub struct IpcStage {
    #[cfg(feature = "cuda")]
    inner: Option<ipc::Stage>,
}

impl IpcStage {
    /// Copy each `(offset, tensor)` of a host-copy file of `file_len` bytes into the buffer (made
    /// and exported the first time); the handle to send, or `Ok(None)` where IPC does not apply
    /// (tensors off the GPUs, a build without CUDA).
    pub fn send(
        &mut self,
        file_len: u64,
        parts: &[(u64, &candle_core::Tensor)],
    ) -> Result<Option<IpcHandle>, String> {
        #[cfg(feature = "cuda")]
        {
            ipc::Stage::send(&mut self.inner, file_len, parts)
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (file_len, parts);
            Ok(None)
        }
    }

    /// The handle of the buffer while it holds the last weights sent (until released).
    pub fn handle(&self) -> Option<IpcHandle> {
        #[cfg(feature = "cuda")]
        {
            self.inner.as_ref().map(ipc::Stage::handle)
        }
        #[cfg(not(feature = "cuda"))]
        None
    }

    /// Free the buffer (after the receiver closed it): what it held is in the host copy now,
    /// and a time-shared GPU needs the memory. The next send makes a new one.
    pub fn release(&mut self) {
        #[cfg(feature = "cuda")]
        {
            self.inner = None;
        }
    }

    /// Bring the host-copy file at `path` up to date from the last weights sent: each
    /// `(offset, bytes)` range by DMA into the file's page-locked mapping (staged where it cannot
    /// be page-locked). `Ok(false)` where nothing was sent (or it was released).
    pub fn write_back(
        &self,
        path: &std::path::Path,
        ranges: &[(u64, usize)],
    ) -> Result<bool, String> {
        #[cfg(feature = "cuda")]
        {
            match &self.inner {
                Some(stage) => stage.write_back(path, ranges).map(|()| true),
                None => Ok(false),
            }
        }
        #[cfg(not(feature = "cuda"))]
        {
            let _ = (path, ranges);
            Ok(false)
        }
    }
}

/// The receiving side of CUDA IPC weight sync: each `(offset, tensor)` copied out of the buffer
/// `handle` names into the tensor's GPU memory; the bytes copied, or `Ok(None)` where the tensors
/// are not GPU tensors IPC can fill.
pub fn ipc_receive(
    handle: &IpcHandle,
    parts: &[(u64, &candle_core::Tensor)],
) -> Result<Option<u64>, String> {
    #[cfg(feature = "cuda")]
    {
        ipc::receive(handle, parts)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (handle, parts);
        Err(NOT_BUILT.into())
    }
}

/// Close the CUDA IPC buffer this process opened last, if any ([`ipc_receive`] keeps it open
/// between syncs): a receiver letting go of its weights, after which the sender frees it.
pub fn ipc_close() {
    #[cfg(feature = "cuda")]
    ipc::close();
}

/// Let go of the page-locked mappings of the host copies under `dir` (a host area being
/// removed), so that removing the files frees their memory. Nothing to do without CUDA.
pub fn forget_pinned(dir: &std::path::Path) {
    #[cfg(feature = "cuda")]
    pinned::forget_under(dir);
    #[cfg(not(feature = "cuda"))]
    let _ = dir;
}
