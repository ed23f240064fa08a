//! Weight sync by CUDA IPC through a host copy's layout: the sender stages tensors at their
//! offsets in the receiver's host-copy file (`crate::device::IpcStage`), the receiver copies them
//! out at the offsets its copy's header gives, and the file is brought up to date from the
//! sender's buffer when something is about to read it.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use super::{HostCopyError, in_place, touch};

/// Weight sync by CUDA IPC, the sender's side: `tensors`, which the host copy at `path` holds
/// (names, dtypes, shapes), copied into `stage` at their offsets in that file; the handle for the
/// receiver ([`read_into_tensors_by_ipc`]), or `None` where IPC does not apply (a tensor on the
/// CPU, a build without CUDA, a copy that holds other tensors). The file itself is not written:
/// [`write_back_from_ipc`] brings it up to date when something is about to read it.
pub fn stage_for_ipc(
    stage: &mut crate::device::IpcStage,
    path: &Path,
    tensors: &[(String, Tensor)],
) -> Result<Option<crate::device::IpcHandle>, HostCopyError> {
    let err = |msg| HostCopyError::new(path, msg);
    if tensors.is_empty() || tensors.iter().any(|(_, t)| t.device().is_cpu()) {
        return Ok(None);
    }
    let Some(copy) = in_place::Opened::rewritable(path, tensors).map_err(err)? else {
        return Ok(None);
    };
    let named = tensors.iter().map(|(name, t)| (name.as_str(), t));
    let parts = copy.offsets(named).map_err(err)?;
    let (start, len) = copy.data();
    stage.send(start + len as u64, &parts).map_err(err)
}

/// Weight sync by CUDA IPC, the receiver's side: each target (named as in the host copy at
/// `path`, whose header gives the offsets the sender staged them at) copied out of the buffer
/// `handle` names, device to device; the bytes copied.
pub fn read_into_tensors_by_ipc<'t>(
    path: &Path,
    handle: &crate::device::IpcHandle,
    targets: impl IntoIterator<Item = (&'t str, &'t Tensor)>,
) -> Result<u64, HostCopyError> {
    let err = |msg| HostCopyError::new(path, msg);
    let copy = in_place::Opened::open(path).map_err(err)?;
    let parts = copy.offsets(targets).map_err(err)?;
    crate::device::ipc_receive(handle, &parts)
        .map_err(err)?
        .ok_or_else(|| err("CUDA IPC cannot fill these tensors (not all on the GPU)".into()))
}

/// Weight sync by CUDA IPC into new tensors on `device` (a receiver's reload): one for each tensor
/// of the host copy at `path` (its names, dtypes and shapes), filled device to device from the
/// buffer `handle` names at the copy's offsets.
pub fn read_host_copy_by_ipc(
    path: &Path,
    device: &Device,
    handle: &crate::device::IpcHandle,
) -> Result<HashMap<String, Tensor>, HostCopyError> {
    let err = |msg| HostCopyError::new(path, msg);
    let copy = in_place::Opened::open(path).map_err(err)?;
    let blanks = copy
        .blanks(device, false)
        .map_err(err)?
        .ok_or_else(|| err("a tensor of elements smaller than a byte: no CUDA IPC".into()))?;
    let named = blanks.iter().map(|(name, t)| (name.as_str(), t));
    let parts = copy.offsets(named).map_err(err)?;
    crate::device::ipc_receive(handle, &parts)
        .map_err(err)?
        .ok_or_else(|| err("CUDA IPC cannot fill these tensors (not all on the GPU)".into()))?;
    Ok(blanks.into_iter().collect())
}

/// Bring the host copy at `path` up to date from the weights last sent through `stage`, by DMA
/// into its page-locked mapping (staged where it cannot be page-locked); `false` where nothing was
/// sent.
pub fn write_back_from_ipc(
    stage: &crate::device::IpcStage,
    path: &Path,
) -> Result<bool, HostCopyError> {
    let err = |msg| HostCopyError::new(path, msg);
    let copy = in_place::Opened::open(path).map_err(err)?;
    let written = stage.write_back(path, &[copy.data()]).map_err(err)?;
    if written {
        touch(path).map_err(err)?;
    }
    Ok(written)
}
