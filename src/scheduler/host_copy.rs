//! Host-memory copies of a role's tensors: safetensors files in a shared-memory directory
//! (`/dev/shm` where it exists), removed when the run's [`HostArea`] is dropped.
//!
//! The same files carry offloaded state and weights sent to other workers: bulk tensors never go
//! through the control channel. A new file is written under a temporary name and renamed, so a
//! reader never sees half of one. A copy that holds the same tensors as before is rewritten in
//! place ([`HostArea::overwrite`], [`overwrite_tensors`]; ~3x faster than filling new pages) where
//! nobody can read it mid-write: every copy between the trainer and a worker is read only when a
//! call says so, after it was written, and a half-written one is never read after its writer died
//! (the parent's death ends the run; a trainer worker's stops it). A worker whose copy holds its
//! weights already offloads without writing ([`check_holds`]). Tensors go to and come from the
//! files without copies in between: a CPU tensor's storage is written and read in place
//! (`host_copy/in_place.rs`); a GPU tensor moves by DMA straight between its device memory and
//! the file's mapping, page-locked with the driver once a process (`crate::device::move_pinned`),
//! where that applies, else staged through host memory. A copy written anew (not in place) is
//! staged; the offloads after it rewrite it in place, pinned.

mod in_place;
mod ipc_sync;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor, Var};
use rayon::prelude::*;

use crate::device::Way;

pub use ipc_sync::{
    read_host_copy_by_ipc, read_into_tensors_by_ipc, stage_for_ipc, write_back_from_ipc,
};

#[derive(Debug, thiserror::Error)]
#[error("host copy '{path}': {source}")]
pub struct HostCopyError {
    pub path: PathBuf,
    #[source]
    pub source: candle_core::Error,
}

impl HostCopyError {
    /// The copy at `path` went wrong as `msg` says.
    fn new(path: &Path, msg: String) -> HostCopyError {
        HostCopyError {
            path: path.to_path_buf(),
            source: candle_core::Error::Msg(msg),
        }
    }
}

/// A run's directory of host copies.
pub struct HostArea {
    dir: tempfile::TempDir,
}

static AREA_BASE: std::sync::RwLock<Option<PathBuf>> = std::sync::RwLock::new(None);

/// Where the host areas made from now on live (`cluster.shared_dir`: a directory every worker
/// host sees); `None`: `/dev/shm`, or the temporary directory without it.
pub fn set_area_base(base: Option<PathBuf>) {
    if let Ok(mut b) = AREA_BASE.write() {
        *b = base;
    }
}

impl HostArea {
    pub fn new() -> std::io::Result<HostArea> {
        let shm = Path::new("/dev/shm");
        let base = match AREA_BASE.read().ok().and_then(|b| b.clone()) {
            Some(shared) => shared,
            None if shm.is_dir() => shm.to_path_buf(),
            None => std::env::temp_dir(),
        };
        let dir = tempfile::Builder::new()
            .prefix("roll-tui-host-")
            .tempdir_in(base)?;
        Ok(HostArea { dir })
    }

    /// The area's directory (for files other than host copies, e.g. a worker's model config).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.safetensors"))
    }

    /// Write `tensors` to the copy called `name`; returns the bytes of tensor data written.
    pub fn write(&self, name: &str, tensors: &[(String, Tensor)]) -> Result<u64, HostCopyError> {
        write_tensors(&self.path(name), tensors)
    }

    /// Write `tensors` to the copy called `name`: over the old copy's bytes in place when it holds
    /// the same tensors (names, dtypes, shapes), else as [`HostArea::write`]
    /// ([`overwrite_tensors`]).
    pub fn overwrite(
        &self,
        name: &str,
        tensors: &[(String, Tensor)],
    ) -> Result<u64, HostCopyError> {
        overwrite_tensors(&self.path(name), tensors)
    }

    /// Read the copy called `name` back onto `device`.
    pub fn read(
        &self,
        name: &str,
        device: &Device,
    ) -> Result<HashMap<String, Tensor>, HostCopyError> {
        read_host_copy(&self.path(name), device)
    }

    /// Read the copy called `name` into existing variables (every variable must be in it, with its
    /// shape); returns the bytes restored.
    pub fn read_into(&self, name: &str, vars: &[(String, Var)]) -> Result<u64, HostCopyError> {
        read_into_vars(&self.path(name), vars)
    }

    /// Read the copy called `name` into the memory of existing tensors ([`read_into_tensors`]).
    pub fn read_into_tensors<'t>(
        &self,
        name: &str,
        targets: impl IntoIterator<Item = (&'t str, &'t Tensor)>,
    ) -> Result<u64, HostCopyError> {
        read_into_tensors(&self.path(name), targets)
    }

    pub fn remove(&self, name: &str) {
        let path = self.path(name);
        crate::device::forget_pinned(&path);
        // Already gone is fine: the copy is only a cache of state that lives elsewhere.
        let _ = std::fs::remove_file(path);
    }
}

impl Drop for HostArea {
    /// Before the directory goes: this process's page-locked mappings of its copies are let go
    /// of, or their memory would stay taken after the files are removed.
    fn drop(&mut self) {
        crate::device::forget_pinned(self.dir.path());
    }
}

/// Mark the file at `path` as modified now: writes by DMA into a mapping leave its modification
/// time as it was, and a cluster's worker mirror tells a changed copy by that time.
fn touch(path: &Path) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(std::time::SystemTime::now()))
        .map_err(|e| format!("marking it modified: {e}"))
}

/// Move `tensors` between their GPU memory and their bytes in `copy` (the file at `path`) by DMA
/// through the file's page-locked mapping (`crate::device::move_pinned`); the bytes moved, or
/// `None` where that does not apply (a tensor on the CPU, a build without CUDA, ...) and the
/// caller moves them itself.
fn moved_pinned<'t>(
    path: &Path,
    copy: &in_place::Opened,
    tensors: impl IntoIterator<Item = (&'t str, &'t Tensor)>,
    way: Way,
) -> Result<Option<u64>, String> {
    let tensors: Vec<(&str, &Tensor)> = tensors.into_iter().collect();
    if tensors.is_empty() || tensors.iter().any(|(_, t)| t.device().is_cpu()) {
        return Ok(None);
    }
    let parts = copy.offsets(tensors)?;
    Ok(crate::device::move_pinned(path, &parts, way)?.map(|m| m.bytes))
}

pub use crate::model::params::tensor_bytes;

/// Write `tensors` to the host copy at `path` (under a temporary name, then renamed, so a reader
/// never sees half of one); returns the bytes of tensor data written. Worker processes use this
/// with paths their parent hands them.
pub fn write_tensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<u64, HostCopyError> {
    // A page-locked mapping of the file this one replaces would keep its memory taken.
    crate::device::forget_pinned(path);
    let bytes = tensors.iter().map(|(_, t)| tensor_bytes(t)).sum();
    let views = tensors
        .iter()
        .map(|(name, t)| (name.as_str(), in_place::Written::new(t)));
    // safetensors writes a sibling temporary file and renames it over `path`.
    safetensors::serialize_to_file(views, None, path).map_err(|e| HostCopyError {
        path: path.to_path_buf(),
        source: e.into(),
    })?;
    Ok(bytes)
}

/// Write `tensors` to the host copy at `path` over its bytes in place when it holds the same
/// tensors (names, dtypes, shapes), else as [`write_tensors`]; returns the bytes written. Only for
/// a copy nobody reads while it is written, and that nobody reads half-written after its writer
/// died (the module's doc says which copies are).
pub fn overwrite_tensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<u64, HostCopyError> {
    let err = |msg| HostCopyError::new(path, msg);
    let Some(copy) = in_place::Opened::rewritable(path, tensors).map_err(err)? else {
        return write_tensors(path, tensors);
    };
    let named = tensors.iter().map(|(name, t)| (name.as_str(), t));
    if let Some(bytes) = moved_pinned(path, &copy, named, Way::ToHost).map_err(err)? {
        touch(path).map_err(err)?;
        return Ok(bytes);
    }
    // One tensor after another: writes to one file take its inode's lock, so threads would only
    // queue (measured: the same time), where reads run side by side.
    let mut bytes = 0;
    for (name, t) in tensors {
        bytes += copy.write_from(name, t).map_err(err)?;
    }
    Ok(bytes)
}

/// Check that the host copy at `path` holds `tensors` (names, dtypes and shapes; the data is the
/// writer's promise) and return their bytes. A worker whose weights only ever came from that copy
/// (actor_infer, the reference: the parent writes the copy before telling the worker to read it)
/// offloads by letting go of them after this check: writing them again would copy the same bytes.
pub fn check_holds(path: &Path, tensors: &[(String, Tensor)]) -> Result<u64, HostCopyError> {
    let copy = in_place::Opened::open(path).map_err(|msg| HostCopyError::new(path, msg))?;
    if !copy.holds(tensors) {
        return Err(HostCopyError::new(
            path,
            "does not hold these weights (other names, dtypes or shapes)".into(),
        ));
    }
    Ok(tensors.iter().map(|(_, t)| tensor_bytes(t)).sum())
}

/// Read the host copy at `path` onto `device`. On the CPU each tensor is read straight into its new
/// storage, side by side on every core (candle's `load` reads the whole file into one buffer first
/// and copies each tensor out of it).
pub fn read_tensors(
    path: &Path,
    device: &Device,
) -> Result<HashMap<String, Tensor>, HostCopyError> {
    read_new(path, device, false, false)
}

/// [`read_tensors`] of a host copy that is read again and again (a role's offloaded state, read
/// back at every reload): onto a GPU it moves through the file's page-locked mapping, which this
/// process keeps for the next reload. One-off files (step files, checkpoints) are read with
/// [`read_tensors`], whose staged reads keep no mapping.
pub fn read_host_copy(
    path: &Path,
    device: &Device,
) -> Result<HashMap<String, Tensor>, HostCopyError> {
    read_new(path, device, false, true)
}

/// [`read_tensors`] onto the CPU, each tensor made a variable as it is read: a network to train is
/// built from them without another copy (candle makes a variable of a plain tensor by copying it).
pub fn read_variables(path: &Path) -> Result<HashMap<String, Tensor>, HostCopyError> {
    read_new(path, &crate::device::host(), true, false)
}

fn read_new(
    path: &Path,
    device: &Device,
    variables: bool,
    pinned: bool,
) -> Result<HashMap<String, Tensor>, HostCopyError> {
    let err = |msg| HostCopyError::new(path, msg);
    if device.is_cpu() {
        let copy = in_place::Opened::open(path).map_err(err)?;
        if let Some(tensors) = copy.read_all(variables).map_err(err)? {
            return Ok(tensors);
        }
    } else if pinned {
        let copy = in_place::Opened::open(path).map_err(err)?;
        if let Some(blanks) = copy.blanks(device, variables).map_err(err)? {
            let named = blanks.iter().map(|(name, t)| (name.as_str(), t));
            if moved_pinned(path, &copy, named, Way::ToDevice)
                .map_err(err)?
                .is_some()
            {
                return Ok(blanks.into_iter().collect());
            }
        }
    }
    candle_core::safetensors::load(path, device).map_err(|source| HostCopyError {
        path: path.to_path_buf(),
        source,
    })
}

/// Read the host copy at `path` into existing variables (every variable must be in it, with its
/// shape and dtype); returns the bytes restored.
pub fn read_into_vars(path: &Path, vars: &[(String, Var)]) -> Result<u64, HostCopyError> {
    read_into_tensors(
        path,
        vars.iter().map(|(name, v)| (name.as_str(), v.as_tensor())),
    )
}

/// Read the host copy at `path` into the memory of existing tensors, each named as in the copy
/// (contiguous CPU tensors of the copy's dtype and shape); returns the bytes restored. The tensors
/// keep their storage, so whatever shares it (a variable, an optimizer's moment) sees the copy.
pub fn read_into_tensors<'t>(
    path: &Path,
    targets: impl IntoIterator<Item = (&'t str, &'t Tensor)>,
) -> Result<u64, HostCopyError> {
    let err = |msg| HostCopyError::new(path, msg);
    let copy = in_place::Opened::open(path).map_err(err)?;
    let targets: Vec<(&str, &Tensor)> = targets.into_iter().collect();
    if let Some(bytes) =
        moved_pinned(path, &copy, targets.iter().copied(), Way::ToDevice).map_err(err)?
    {
        return Ok(bytes);
    }
    // Each tensor from its own range of the file, on every core (a move is bound by copying).
    let bytes: Result<Vec<u64>, String> = targets
        .par_iter()
        .map(|&(name, t)| copy.read_into(name, t))
        .collect();
    Ok(bytes.map_err(err)?.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_round_trip_into_vars_and_the_area_is_removed_on_drop() {
        let area = HostArea::new().expect("host area");
        let dir = area.dir.path().to_path_buf();
        let dev = Device::Cpu;
        let a = Var::from_tensor(&Tensor::new(&[1f32, 2., 3.], &dev).expect("t")).expect("v");
        let b = Var::from_tensor(&Tensor::new(&[[4f32], [5.]], &dev).expect("t")).expect("v");
        let vars = vec![("a".to_string(), a.clone()), ("b".to_string(), b.clone())];
        let tensors: Vec<(String, Tensor)> = vars
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
            .collect();
        assert_eq!(area.write("policy", &tensors).expect("write"), 20);
        a.set(&Tensor::zeros(3, candle_core::DType::F32, &dev).expect("z"))
            .expect("set");
        assert_eq!(area.read_into("policy", &vars).expect("read"), 20);
        assert_eq!(a.to_vec1::<f32>().expect("a"), [1., 2., 3.]);
        let missing = vec![("c".to_string(), a)];
        let e = area.read_into("policy", &missing).expect_err("no c");
        assert!(e.to_string().contains("tensor 'c' is missing"), "{e}");
        drop(area);
        assert!(!dir.exists());
    }
}
