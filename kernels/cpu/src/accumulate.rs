//! Gradients accumulated in place, where candle would allocate a new tensor for every sum (and,
//! in its backward, a zero-filled one before it):
//! - [`add_rows_in_place`]: `dst[ids[i]] += src[i]` for every row i, the gradient of an embedding
//!   lookup added into the embedding's gradient where it already is (a tied head's), with no
//!   zero-filled copy and no new tensor of the table's size (544 MB at a 151,936-token vocabulary
//!   of width 896). Rows are added in order, one after the other, as candle's `index_add` adds
//!   them, so the sums are the same bits.
//! - [`add_in_place`]: `dst += src`, the next micro-batch's gradient added into the running sum
//!   (the same bits as `dst + src`).
//! - [`column_sums`]: a bias's gradient, its output's gradient summed over rows, one contiguous
//!   row after the other (candle's sum over the first axis walks the matrix down its columns).

use candle_core::{CpuStorage, InplaceOp2, InplaceOp3, Layout, Result, Tensor, bail};
use rayon::prelude::*;

use super::{f32_data, storage_f32};

/// The contiguous f32 data of a sum an in-place op writes, or an error naming the op and the sum.
fn sum_data<'a>(
    dst: &'a mut CpuStorage,
    l: &Layout,
    op: &str,
    what: &str,
) -> Result<&'a mut [f32]> {
    let Some((a, b)) = l.contiguous_offsets() else {
        bail!("{op}: {what} must be contiguous");
    };
    let CpuStorage::F32(dst) = dst else {
        bail!("{op}: {what} must be f32");
    };
    Ok(&mut dst[a..b])
}

struct AddRows;

impl InplaceOp3 for AddRows {
    fn name(&self) -> &'static str {
        "add-rows"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        l1: &Layout,
        ids: &CpuStorage,
        l2: &Layout,
        src: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        let (table_rows, width) = l1.shape().dims2()?;
        let (rows, src_width) = l3.shape().dims2()?;
        if src_width != width || l2.shape().dims1()? != rows {
            bail!(
                "add rows: table {:?}, ids {:?} and rows {:?} do not fit",
                l1.shape(),
                l2.shape(),
                l3.shape()
            );
        }
        let CpuStorage::U32(ids_data) = ids else {
            bail!("add rows: ids must be u32");
        };
        let Some((a, b)) = l2.contiguous_offsets() else {
            bail!("add rows: ids must be contiguous");
        };
        let ids = &ids_data[a..b];
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= table_rows) {
            bail!("add rows: id {bad} is outside a table of {table_rows} rows");
        }
        let src = f32_data(src, l3, "add rows", "rows")?;
        let dst = sum_data(dst, l1, "add rows", "the table")?;
        for (&id, row) in ids.iter().zip(src.chunks_exact(width.max(1))) {
            let at = id as usize * width;
            for (d, s) in dst[at..at + width].iter_mut().zip(row) {
                *d += s;
            }
        }
        Ok(())
    }
}

struct AddInto;

impl InplaceOp2 for AddInto {
    fn name(&self) -> &'static str {
        "add-into"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        l1: &Layout,
        src: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        if l1.shape() != l2.shape() {
            bail!(
                "add into: shapes {:?} and {:?} differ",
                l1.shape(),
                l2.shape()
            );
        }
        let src = f32_data(src, l2, "add into", "the addend")?;
        let dst = sum_data(dst, l1, "add into", "the sum")?;
        // In parallel blocks; each element's sum is the same.
        dst.par_chunks_mut(ADD_BLOCK)
            .zip(src.par_chunks(ADD_BLOCK))
            .for_each(|(d, s)| d.iter_mut().zip(s).for_each(|(d, s)| *d += s));
        Ok(())
    }
}

/// Values a parallel block of [`add_in_place`] adds. Small enough that one weight's gradient of
/// a small model is several blocks: a tiny Qwen2's largest (128 x 512) was one block of 65,536,
/// so the sum of two lanes' gradients ran on one core while the other waited (0.5 ms of a 21 ms
/// forward+backward; 0.3 ms in blocks of 8,192, benches/RESULTS.md's git history).
const ADD_BLOCK: usize = 1 << 13;

struct AddRow;

impl InplaceOp2 for AddRow {
    fn name(&self) -> &'static str {
        "add row into"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        l1: &Layout,
        src: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        let width = l2.shape().elem_count();
        if l1.dims().last() != Some(&width) || l2.dims().len() != 1 {
            bail!(
                "add row into: a row {:?} for rows of {:?}",
                l2.dims(),
                l1.dims()
            );
        }
        let row = f32_data(src, l2, "add row into", "the row")?;
        let dst = sum_data(dst, l1, "add row into", "the sum")?;
        if width > 0 {
            for sum in dst.chunks_exact_mut(width) {
                for (d, s) in sum.iter_mut().zip(row) {
                    *d += s;
                }
            }
        }
        Ok(())
    }
}

/// `sum[i] += row` for every row i of `sum` (..., n), in place: a bias added to a product's
/// fresh output without candle's broadcast add into a third tensor. The same bits (one addition
/// per element). Both f32 on the CPU, `sum` contiguous ([`applies`]), `row` of n. The caller must
/// own `sum`'s storage: every tensor sharing it sees the change.
pub fn add_row_in_place(sum: &Tensor, row: &Tensor) -> Result<()> {
    sum.inplace_op2(&row.contiguous()?, &AddRow)
}

/// Whether [`add_rows_in_place`] can take these: [`applies`] to the table and its rows, and u32 ids.
pub fn rows_apply(table: &Tensor, ids: &Tensor, rows: &Tensor) -> bool {
    applies(table, rows) && ids.dtype() == candle_core::DType::U32
}

/// Whether [`add_in_place`] can take these: a contiguous f32 sum and an f32 addend on the CPU.
pub fn applies(sum: &Tensor, addend: &Tensor) -> bool {
    crate::applies(sum) && crate::applies(addend) && sum.is_contiguous()
}

/// `table[ids[i]] += rows[i]` in place. table: (n, width) f32, ids: (rows) u32, rows: (rows, width)
/// f32. The caller must own `table`'s storage: every tensor sharing it sees the change.
pub fn add_rows_in_place(table: &Tensor, ids: &Tensor, rows: &Tensor) -> Result<()> {
    table.inplace_op3(&ids.contiguous()?, &rows.contiguous()?, &AddRows)
}

/// `sum += addend` in place. Both f32 on the CPU, the same shape, `sum` contiguous ([`applies`]).
/// The caller must own `sum`'s storage: every tensor sharing it sees the change.
pub fn add_in_place(sum: &Tensor, addend: &Tensor) -> Result<()> {
    sum.inplace_op2(&addend.contiguous()?, &AddInto)
}

/// `sum + addend`: added into `sum` in place where [`applies`] (the caller must own `sum`'s
/// storage), else a new tensor; `addend` itself when there is no sum yet.
pub fn summed(sum: Option<Tensor>, addend: Tensor) -> Result<Tensor> {
    match sum {
        Some(sum) if applies(&sum, &addend) => {
            add_in_place(&sum, &addend)?;
            Ok(sum)
        }
        Some(sum) => sum + addend,
        None => Ok(addend),
    }
}

/// x: (rows, n) f32 on the CPU -> (n), each column summed over the rows, top to bottom.
pub fn column_sums(x: &Tensor) -> Result<Tensor> {
    let (_, n) = x.dims2()?;
    let x = x.contiguous()?;
    let mut sums = vec![0f32; n];
    {
        let (storage, layout) = x.storage_and_layout();
        let data = storage_f32(&storage, layout, "column sums", "the matrix")?;
        for row in data.chunks_exact(n.max(1)) {
            for (sum, v) in sums.iter_mut().zip(row) {
                *sum += v;
            }
        }
    }
    Tensor::from_vec(sums, n, x.device())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// A bias row added in place equals candle's broadcast add, bit for bit, on a 3-d sum; a row
    /// of the wrong width is an error and leaves the sum as it was.
    #[test]
    fn a_row_added_in_place_equals_candles_broadcast_add() {
        let dev = Device::Cpu;
        let sum = Tensor::randn(0f32, 1.0, (2, 3, 5), &dev).unwrap();
        let row = Tensor::randn(0f32, 1.0, 5, &dev).unwrap();
        let expected = sum.broadcast_add(&row).unwrap();
        let before = sum.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let bad = Tensor::randn(0f32, 1.0, 4, &dev).unwrap();
        assert!(add_row_in_place(&sum, &bad).is_err());
        assert_eq!(sum.flatten_all().unwrap().to_vec1::<f32>().unwrap(), before);
        add_row_in_place(&sum, &row).unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            v.iter().map(|x| x.to_bits()).collect()
        };
        assert_eq!(bits(&sum), bits(&expected));
    }

    /// Against candle's `index_add`, bit for bit, with a repeated id (summed in order) and an id
    /// never seen (its row unchanged).
    #[test]
    fn equals_candles_index_add_bit_for_bit() {
        let dev = Device::Cpu;
        let table = Tensor::randn(0f32, 1.0, (5, 3), &dev).unwrap();
        let rows = Tensor::randn(0f32, 1.0, (4, 3), &dev).unwrap();
        let ids = Tensor::new(&[3u32, 0, 3, 1], &dev).unwrap();
        let want = table.index_add(&ids, &rows, 0).unwrap();
        let got = table.copy().unwrap();
        add_rows_in_place(&got, &ids, &rows).unwrap();
        assert_eq!(
            got.to_vec2::<f32>().unwrap(),
            want.to_vec2::<f32>().unwrap()
        );
        assert_eq!(
            got.get(4).unwrap().to_vec1::<f32>().unwrap(),
            table.get(4).unwrap().to_vec1::<f32>().unwrap()
        );
    }

    #[test]
    fn add_in_place_equals_the_sum_bit_for_bit() {
        let dev = Device::Cpu;
        // More than one parallel block (ADD_BLOCK values) and a short last one.
        let a = Tensor::randn(0f32, 1.0, (3, 70_001), &dev).unwrap();
        let b = Tensor::randn(0f32, 1.0, (3, 70_001), &dev).unwrap();
        let want = (&a + &b).unwrap();
        let sum = a.copy().unwrap();
        add_in_place(&sum, &b).unwrap();
        assert_eq!(
            sum.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            want.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        let other = Tensor::zeros((3, 7), candle_core::DType::F32, &dev).unwrap();
        let err = add_in_place(&sum, &other).unwrap_err().to_string();
        assert!(err.contains("add into: shapes"), "{err}");
    }

    /// The first addend is the sum; f32 sums grow in place; others (f64 here) get a new sum.
    #[test]
    fn summed_starts_adds_in_place_or_falls_back() {
        let dev = Device::Cpu;
        let a = Tensor::new(&[1f32, 2.0], &dev).unwrap();
        let first = summed(None, a.clone()).unwrap();
        assert_eq!(first.id(), a.id());
        let grown = summed(Some(first), Tensor::new(&[0.5f32, -1.0], &dev).unwrap()).unwrap();
        assert_eq!(grown.id(), a.id(), "added into the same tensor");
        assert_eq!(a.to_vec1::<f32>().unwrap(), vec![1.5, 1.0]);
        let d = Tensor::new(&[1f64, 2.0], &dev).unwrap();
        let new = summed(Some(d.clone()), Tensor::new(&[3f64, 4.0], &dev).unwrap()).unwrap();
        assert_ne!(new.id(), d.id());
        assert_eq!(new.to_vec1::<f64>().unwrap(), vec![4.0, 6.0]);
        assert_eq!(d.to_vec1::<f64>().unwrap(), vec![1.0, 2.0]);
    }

    /// Column sums of a 3 x 2 matrix by hand, and of a wide one against candle's sum (the same
    /// additions in another order: to a rounding).
    #[test]
    fn column_sums_add_each_column_over_the_rows() {
        let dev = Device::Cpu;
        let x = Tensor::new(&[[1f32, -2.0], [0.5, 4.0], [3.0, 0.25]], &dev).unwrap();
        assert_eq!(
            column_sums(&x).unwrap().to_vec1::<f32>().unwrap(),
            vec![4.5, 2.25]
        );
        let x = Tensor::randn(0f32, 1.0, (37, 130), &dev).unwrap();
        let want = x.sum(0).unwrap().to_vec1::<f32>().unwrap();
        let got = column_sums(&x).unwrap().to_vec1::<f32>().unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
        }
        // A transposed view is read as the matrix it shows.
        let t = x.t().unwrap();
        let want = t.sum(0).unwrap().to_vec1::<f32>().unwrap();
        let got = column_sums(&t).unwrap().to_vec1::<f32>().unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn bad_ids_and_shapes_are_errors() {
        let dev = Device::Cpu;
        let table = Tensor::zeros((2, 3), candle_core::DType::F32, &dev).unwrap();
        let rows = Tensor::zeros((1, 3), candle_core::DType::F32, &dev).unwrap();
        let far = Tensor::new(&[2u32], &dev).unwrap();
        let err = add_rows_in_place(&table, &far, &rows)
            .unwrap_err()
            .to_string();
        assert!(err.contains("id 2 is outside a table of 2 rows"), "{err}");
        let wide = Tensor::zeros((1, 4), candle_core::DType::F32, &dev).unwrap();
        let ok = Tensor::new(&[1u32], &dev).unwrap();
        assert!(add_rows_in_place(&table, &ok, &wide).is_err());
    }
}
