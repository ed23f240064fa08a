//! Host copies written from and read into tensors' own memory.
//!
//! candle's safetensors helpers copy every tensor through a fresh buffer each way: `save` turns
//! each tensor into a new `Vec` before writing it, `load` reads the whole file into one and then
//! copies each tensor into new storage, which a reload then copies into the variables. Time-sharing
//! moves a role's whole state this way before every phase (the quickstart: ~300 moves), and the
//! fresh buffers are the cost: each is new memory, faulted in and zeroed page by page. Here a
//! contiguous CPU tensor's bytes go to the file straight from its storage, and a copy is read with
//! one `pread` per tensor straight into the storage of the tensor it restores.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, DType, Device, InplaceOp1, Layout, Storage, StorageRef, Tensor, Var,
};
use rayon::prelude::*;
use safetensors::tensor::Metadata;
use safetensors::{Dtype, View};

/// The bytes of a CPU storage's elements, where each element is whole bytes of its own (not the
/// 8-bit and smaller floats, whose storages candle keeps its own way).
fn bytes(s: &CpuStorage) -> Option<&[u8]> {
    use CpuStorage as S;
    Some(match s {
        S::U8(v) => v,
        S::U32(v) => bytemuck::cast_slice(v),
        S::I16(v) => bytemuck::cast_slice(v),
        S::I32(v) => bytemuck::cast_slice(v),
        S::I64(v) => bytemuck::cast_slice(v),
        S::BF16(v) => bytemuck::cast_slice(v),
        S::F16(v) => bytemuck::cast_slice(v),
        S::F32(v) => bytemuck::cast_slice(v),
        S::F64(v) => bytemuck::cast_slice(v),
        S::F8E4M3(_) | S::F6E2M3(_) | S::F6E3M2(_) | S::F4(_) | S::F8E8M0(_) => return None,
    })
}

fn bytes_mut(s: &mut CpuStorage) -> Option<&mut [u8]> {
    use CpuStorage as S;
    Some(match s {
        S::U8(v) => v,
        S::U32(v) => bytemuck::cast_slice_mut(v),
        S::I16(v) => bytemuck::cast_slice_mut(v),
        S::I32(v) => bytemuck::cast_slice_mut(v),
        S::I64(v) => bytemuck::cast_slice_mut(v),
        S::BF16(v) => bytemuck::cast_slice_mut(v),
        S::F16(v) => bytemuck::cast_slice_mut(v),
        S::F32(v) => bytemuck::cast_slice_mut(v),
        S::F64(v) => bytemuck::cast_slice_mut(v),
        S::F8E4M3(_) | S::F6E2M3(_) | S::F6E3M2(_) | S::F4(_) | S::F8E8M0(_) => return None,
    })
}

/// The byte range of a contiguous layout's elements in its storage.
fn byte_range(layout: &Layout, elem_size: usize) -> Option<std::ops::Range<usize>> {
    let (start, end) = layout.contiguous_offsets()?;
    Some(start * elem_size..end * elem_size)
}

/// A tensor as safetensors writes it: its storage's bytes when it is a contiguous CPU tensor (read
/// under the storage's lock, held until the file is written), else candle's copy.
pub(super) struct Written<'a> {
    tensor: &'a Tensor,
    storage: Option<StorageRef<'a>>,
}

impl<'a> Written<'a> {
    pub(super) fn new(tensor: &'a Tensor) -> Written<'a> {
        let (storage, layout) = tensor.storage_and_layout();
        let borrowable =
            matches!(&*storage, Storage::Cpu(s) if bytes(s).is_some()) && layout.is_contiguous();
        Written {
            tensor,
            storage: borrowable.then_some(storage),
        }
    }

    fn borrowed(&self) -> Option<&[u8]> {
        let Storage::Cpu(s) = &**self.storage.as_ref()? else {
            return None;
        };
        let range = byte_range(self.tensor.layout(), self.tensor.dtype().size_in_bytes())?;
        bytes(s)?.get(range)
    }
}

impl View for Written<'_> {
    fn dtype(&self) -> Dtype {
        self.tensor.dtype().into()
    }

    fn shape(&self) -> &[usize] {
        self.tensor.dims()
    }

    fn data(&self) -> Cow<'_, [u8]> {
        match self.borrowed() {
            Some(b) => Cow::Borrowed(b),
            None => View::data(&self.tensor),
        }
    }

    fn data_len(&self) -> usize {
        self.tensor.elem_count() * self.tensor.dtype().size_in_bytes()
    }
}

/// A host copy opened for reading: its header, and where its data starts.
pub(super) struct Opened {
    file: File,
    metadata: Metadata,
    data_start: u64,
}

/// Headers this long are not host copies (safetensors' own bound is 100 MB).
const MAX_HEADER: u64 = 100_000_000;

impl Opened {
    /// Open the copy at `path` to read and read its header; the file must be exactly as long as
    /// the header says.
    pub(super) fn open(path: &Path) -> Result<Opened, String> {
        Opened::with(File::open(path).map_err(|e| e.to_string())?)
    }

    /// The copy at `path` opened to be rewritten in place, if it holds exactly `tensors` (names,
    /// dtypes and shapes: then its header is theirs); `None` where it does not, or does not exist.
    pub(super) fn rewritable(
        path: &Path,
        tensors: &[(String, Tensor)],
    ) -> Result<Option<Opened>, String> {
        let file = match OpenOptions::new().read(true).write(true).open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let copy = Opened::with(file)?;
        Ok(copy.holds(tensors).then_some(copy))
    }

    /// Whether the copy holds exactly `tensors`: the same names, dtypes and shapes.
    pub(super) fn holds(&self, tensors: &[(String, Tensor)]) -> bool {
        self.metadata.tensors().len() == tensors.len()
            && tensors.iter().all(|(name, t)| {
                self.metadata.info(name).is_some_and(|info| {
                    info.dtype == Dtype::from(t.dtype()) && info.shape == t.dims()
                })
            })
    }

    /// Write `t` over the tensor called `name`, which [`Opened::rewritable`] matched; bytes written.
    pub(super) fn write_from(&self, name: &str, t: &Tensor) -> Result<u64, String> {
        let info = self
            .metadata
            .info(name)
            .ok_or_else(|| format!("tensor '{name}' is missing"))?;
        let view = Written::new(t);
        let data = view.data();
        self.file
            .write_all_at(&data, self.data_start + info.data_offsets.0 as u64)
            .map_err(|e| format!("writing tensor '{name}': {e}"))?;
        Ok(data.len() as u64)
    }

    fn with(mut file: File) -> Result<Opened, String> {
        let mut n = [0u8; 8];
        file.read_exact(&mut n)
            .map_err(|e| format!("reading the header's length: {e}"))?;
        let n = u64::from_le_bytes(n);
        if n > MAX_HEADER {
            return Err(format!("header of {n} bytes: not a safetensors file"));
        }
        let mut header = vec![0u8; n as usize];
        file.read_exact(&mut header)
            .map_err(|e| format!("reading the header: {e}"))?;
        let metadata: Metadata = serde_json::from_slice(&header)
            .map_err(|e| format!("the header is not a safetensors header: {e}"))?;
        let data_start = 8 + n;
        let len = file.metadata().map_err(|e| e.to_string())?.len();
        let expected = data_start + metadata.data_len() as u64;
        if len != expected {
            return Err(format!("{len} bytes, but its header describes {expected}"));
        }
        Ok(Opened {
            file,
            metadata,
            data_start,
        })
    }

    /// Where the tensors' bytes lie in the file: (first byte, length), all of them one after
    /// another (safetensors leaves no gaps).
    pub(super) fn data(&self) -> (u64, usize) {
        (self.data_start, self.metadata.data_len())
    }

    /// Where the tensor called `name` lies in the file: its first byte and its length, checked
    /// against `t`'s dtype and shape.
    pub(super) fn place(&self, name: &str, t: &Tensor) -> Result<(u64, usize), String> {
        let info = self
            .metadata
            .info(name)
            .ok_or_else(|| format!("tensor '{name}' is missing"))?;
        let dtype: Dtype = t.dtype().into();
        if info.dtype != dtype || info.shape != t.dims() {
            return Err(format!(
                "tensor '{name}' is {:?} {:?} in the copy, {dtype:?} {:?} where it goes",
                info.dtype,
                info.shape,
                t.dims()
            ));
        }
        let (start, end) = info.data_offsets;
        Ok((self.data_start + start as u64, end - start))
    }

    /// Each tensor's first byte in the file, beside the tensor ([`Opened::place`] of each): the
    /// offsets a move by DMA or CUDA IPC copies at.
    pub(super) fn offsets<'t>(
        &self,
        tensors: impl IntoIterator<Item = (&'t str, &'t Tensor)>,
    ) -> Result<Vec<(u64, &'t Tensor)>, String> {
        tensors
            .into_iter()
            .map(|(name, t)| Ok((self.place(name, t)?.0, t)))
            .collect()
    }

    /// Read the tensor called `name` into `dst`'s own memory: same dtype and shape, contiguous, on
    /// the CPU. Returns the bytes read.
    pub(super) fn read_into(&self, name: &str, dst: &Tensor) -> Result<u64, String> {
        let (at, len) = self.place(name, dst)?;
        let op = ReadAt {
            file: &self.file,
            at,
            len,
        };
        if dst.device().is_cpu() {
            dst.inplace_op1(&op)
                .map_err(|e| format!("tensor '{name}': {e}"))?;
        } else {
            read_staged(&op, dst).map_err(|e| format!("tensor '{name}': {e}"))?;
        }
        Ok(len as u64)
    }
}

/// A tensor off the CPU (a GPU's) restored from a host copy: read into host memory, then copied
/// into the tensor's own storage on its device, which whatever shares it (a variable, an
/// optimizer's moment) then sees.
fn read_staged(op: &ReadAt<'_>, dst: &Tensor) -> candle_core::Result<()> {
    if dst.rank() == 0 || !dst.is_contiguous() {
        candle_core::bail!(
            "only a contiguous tensor of rank 1 or more can be restored on its device"
        );
    }
    let host = Tensor::zeros(dst.shape(), dst.dtype(), &crate::device::host())?;
    host.inplace_op1(op)?;
    dst.slice_set(&host.to_device(dst.device())?, 0, 0)
}

impl Opened {
    /// Zeroed tensors of the copy's names, dtypes and shapes on `device` (made as variables' with
    /// `variables`); `None` where a dtype is not whole bytes an element (the small floats:
    /// candle's reader handles them).
    pub(super) fn blanks(
        &self,
        device: &Device,
        variables: bool,
    ) -> Result<Option<Vec<(String, Tensor)>>, String> {
        let mut fresh = Vec::new();
        for (name, info) in self.metadata.tensors() {
            let Some(dtype) = DType::try_from(info.dtype).ok().filter(|d| whole_bytes(*d)) else {
                return Ok(None);
            };
            // Zeros from memory the OS hands over zeroed are not written twice (mimalloc knows).
            let shape = info.shape.as_slice();
            let t = if variables {
                Var::zeros(shape, dtype, device).map(|v| v.as_tensor().clone())
            } else {
                Tensor::zeros(shape, dtype, device)
            };
            let t = t.map_err(|e| format!("tensor '{name}': {e}"))?;
            fresh.push((name, t));
        }
        Ok(Some(fresh))
    }

    /// Every tensor of the copy, each read into new CPU storage of its own (made as a variable's
    /// with `variables`); `None` where a dtype is not whole bytes an element.
    pub(super) fn read_all(
        &self,
        variables: bool,
    ) -> Result<Option<HashMap<String, Tensor>>, String> {
        let Some(fresh) = self.blanks(&crate::device::host(), variables)? else {
            return Ok(None);
        };
        fresh
            .par_iter()
            .try_for_each(|(name, t)| self.read_into(name, t).map(drop))?;
        Ok(Some(fresh.into_iter().collect()))
    }
}

/// Whether [`bytes_mut`] reaches the elements of a CPU storage of `dtype`.
fn whole_bytes(dtype: DType) -> bool {
    use DType as D;
    matches!(
        dtype,
        D::U8 | D::U32 | D::I16 | D::I32 | D::I64 | D::BF16 | D::F16 | D::F32 | D::F64
    )
}

/// Reads `len` bytes at `at` of `file` over a tensor's elements.
struct ReadAt<'a> {
    file: &'a File,
    at: u64,
    len: usize,
}

impl InplaceOp1 for ReadAt<'_> {
    fn name(&self) -> &'static str {
        "read a host copy in place"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let size = storage.dtype().size_in_bytes();
        let range = byte_range(layout, size)
            .ok_or_else(|| candle_core::Error::Msg("the tensor is not contiguous".into()))?;
        let dst = bytes_mut(storage)
            .and_then(|b| b.get_mut(range))
            .filter(|b| b.len() == self.len)
            .ok_or_else(|| {
                candle_core::Error::Msg(format!(
                    "its storage does not hold the copy's {} bytes as plain bytes",
                    self.len
                ))
            })?;
        self.file
            .read_exact_at(dst, self.at)
            .map_err(|e| candle_core::Error::Msg(format!("reading it: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use candle_core::{DType, Device, Tensor, Var};

    use super::super::{HostArea, read_into_tensors, read_tensors, read_variables, write_tensors};

    fn t(values: &[f32], shape: &[usize]) -> Tensor {
        Tensor::from_slice(values, shape, &Device::Cpu).unwrap()
    }

    /// The staged restore (what a GPU tensor takes) writes the copy's values into the tensor's
    /// own storage: a variable sharing it sees them.
    #[test]
    fn a_staged_restore_fills_the_tensors_own_storage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("copy.safetensors");
        let w = t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
        write_tensors(&path, &[("w".to_string(), w)]).unwrap();
        let var = Var::zeros((2, 3), DType::F32, &Device::Cpu).unwrap();
        let copy = super::Opened::open(&path).unwrap();
        let info = copy.metadata.info("w").unwrap();
        let op = super::ReadAt {
            file: &copy.file,
            at: copy.data_start + info.data_offsets.0 as u64,
            len: info.data_offsets.1 - info.data_offsets.0,
        };
        super::read_staged(&op, var.as_tensor()).unwrap();
        assert_eq!(var.to_vec2::<f32>().unwrap(), [[1., 2., 3.], [4., 5., 6.]]);
        let scalar = Tensor::new(0f32, &Device::Cpu).unwrap();
        assert!(super::read_staged(&op, &scalar).is_err());
    }

    #[test]
    fn a_copy_is_read_into_the_tensors_own_memory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("copy.safetensors");
        let a = t(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
        // Written from a transposed view (not contiguous: candle's copy is what is written):
        // [[1, 4], [2, 5], [3, 6]].
        let a_t = a.t().unwrap();
        let h = t(&[0.5, -1.25, 3.0], &[3]).to_dtype(DType::BF16).unwrap();
        let ids = Tensor::from_slice(&[7u32, 8, 9], 3, &Device::Cpu).unwrap();
        let tensors = [("a_t", a_t), ("h", h), ("ids", ids)].map(|(n, t)| (n.to_string(), t));
        assert_eq!(
            write_tensors(&path, &tensors).unwrap(),
            6 * 4 + 3 * 2 + 3 * 4
        );

        // Targets: the middle rows of a bigger tensor (contiguous, at an offset), and tensors
        // whose clones share their storage.
        let big = Tensor::zeros((5, 2), DType::F32, &Device::Cpu).unwrap();
        let middle = big.narrow(0, 1, 3).unwrap();
        let h2 = Tensor::zeros(3, DType::BF16, &Device::Cpu).unwrap();
        let ids2 = Tensor::zeros(3, DType::U32, &Device::Cpu).unwrap();
        let (h_alias, ids_alias) = (h2.clone(), ids2.clone());
        let targets = [("a_t", &middle), ("h", &h2), ("ids", &ids2)];
        assert_eq!(read_into_tensors(&path, targets).unwrap(), 42);
        assert_eq!(
            big.to_vec2::<f32>().unwrap(),
            [[0., 0.], [1., 4.], [2., 5.], [3., 6.], [0., 0.]]
        );
        let h_back = h_alias
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        assert_eq!(h_back, [0.5, -1.25, 3.0]);
        assert_eq!(ids_alias.to_vec1::<u32>().unwrap(), [7, 8, 9]);
    }

    /// Read as variables, a copy's tensors become a network's variables as they are: a `Var` made
    /// from one shares its storage (candle copies a plain tensor to make a variable).
    #[test]
    fn tensors_read_as_variables_are_taken_by_variables_without_a_copy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("copy.safetensors");
        write_tensors(&path, &[("w".to_string(), t(&[1., 2.], &[2]))]).unwrap();
        for (variables, shared) in [(true, true), (false, false)] {
            let read = if variables {
                read_variables(&path)
            } else {
                read_tensors(&path, &Device::Cpu)
            };
            let w = read.unwrap().remove("w").unwrap();
            assert_eq!(w.to_vec1::<f32>().unwrap(), [1., 2.]);
            let var = Var::from_tensor(&w).unwrap();
            var.set(&t(&[5., 6.], &[2])).unwrap();
            let seen = w.to_vec1::<f32>().unwrap();
            assert_eq!(seen == [5., 6.], shared, "variables: {variables}, {seen:?}");
        }
    }

    #[test]
    fn a_copy_that_does_not_match_its_tensors_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("copy.safetensors");
        write_tensors(&path, &[("w".to_string(), t(&[1., 2.], &[2]))]).unwrap();
        let err = |target: &Tensor, name: &str| {
            read_into_tensors(&path, [(name, target)])
                .unwrap_err()
                .to_string()
        };
        let e = err(&t(&[0., 0.], &[2]), "v");
        assert!(
            e.contains("copy.safetensors") && e.contains("tensor 'v' is missing"),
            "{e}"
        );
        let e = err(&t(&[0., 0.], &[1, 2]), "w");
        assert!(
            e.contains("tensor 'w' is F32 [2] in the copy, F32 [1, 2]"),
            "{e}"
        );
        let bf16 = t(&[0., 0.], &[2]).to_dtype(DType::BF16).unwrap();
        assert!(err(&bf16, "w").contains("F32 [2] in the copy, BF16 [2]"));

        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        let e = err(&t(&[0., 0.], &[2]), "w");
        assert!(
            e.contains(&format!(
                "{} bytes, but its header describes {}",
                bytes.len() - 1,
                bytes.len()
            )),
            "{e}"
        );
        std::fs::write(&path, b"\x05\0\0\0\0\0\0\0hello").unwrap();
        let e = err(&t(&[0., 0.], &[2]), "w");
        assert!(e.contains("not a safetensors header"), "{e}");
        std::fs::write(&path, b"\xff\xff\xff\xff\xff\xff\xff\xff").unwrap();
        assert!(err(&t(&[0., 0.], &[2]), "w").contains("not a safetensors file"));
    }

    #[test]
    fn an_overwrite_rewrites_the_same_file_and_writes_anew_when_the_tensors_change() {
        let area = HostArea::new().unwrap();
        let named = |values: &[f32], shape: &[usize]| vec![("w".to_string(), t(values, shape))];
        let inode = || std::fs::metadata(area.path("role")).unwrap().ino();
        let read = |shape: &[usize]| {
            let target = Tensor::zeros(shape, DType::F32, &Device::Cpu).unwrap();
            area.read_into_tensors("role", [("w", &target)]).unwrap();
            target.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        };
        // No copy yet: written anew.
        assert_eq!(
            area.overwrite("role", &named(&[1., 2., 3., 4.], &[4]))
                .unwrap(),
            16
        );
        let first = inode();
        assert_eq!(
            area.overwrite("role", &named(&[5., 6., 7., 8.], &[4]))
                .unwrap(),
            16
        );
        assert_eq!(inode(), first, "the same tensors rewrite the same file");
        assert_eq!(read(&[4]), [5., 6., 7., 8.]);
        // Another shape: the old header does not describe it, so the copy is written anew.
        area.overwrite("role", &named(&[9., 10., 11., 12.], &[2, 2]))
            .unwrap();
        assert_eq!(read(&[2, 2]), [9., 10., 11., 12.]);
        assert_ne!(inode(), first);
    }
}
