//! Matrix products for code that differentiates by hand (`roll::model::layer_grad`), through the
//! gemm crate that candle's own matmul calls, without two costs of candle's op:
//! - [`matmul`] writes its result into a buffer it does not zero first (candle fills every
//!   product's output with zeros that the product then overwrites: a memset the size of the
//!   output, ~5% of a tiny forward+backward);
//! - [`matmul_add`] adds a product into an existing sum in place (gemm reads the destination), where
//!   candle would make the product and then a third tensor for the sum.
//!
//! Either operand may be a transposed view (any 2-D strides), as candle's matmul allows. The same
//! gemm call as candle's (same strides, parallelism and order of the sums), so [`matmul`] gives
//! candle's bits. No backward: the callers differentiate by hand.

use std::mem::MaybeUninit;

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CustomOp2, InplaceOp3, Layout, Result, Shape, Storage, Tensor, bail,
};

const NAME: &str = "matrix product";

/// A 2-D operand as gemm reads it: its f32 data from its first element, its dims and its (row,
/// column) strides, checked to stay inside the storage.
struct Operand<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    row_stride: isize,
    col_stride: isize,
}

fn operand<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<Operand<'a>> {
    let CpuStorage::F32(v) = s else {
        bail!("{NAME}: {what} must be f32, got {:?}", s.dtype());
    };
    let &[rows, cols] = l.dims() else {
        bail!("{NAME}: {what} must be a matrix, got {:?}", l.dims());
    };
    let &[rs, cs] = l.stride() else {
        bail!("{NAME}: {what} must be a matrix");
    };
    let start = l.start_offset();
    // The last element a (rows, cols) view with these strides reads.
    let last = start + rows.saturating_sub(1) * rs + cols.saturating_sub(1) * cs;
    if rows * cols > 0 && last >= v.len() {
        bail!("{NAME}: {what}'s view reaches past its storage");
    }
    Ok(Operand {
        data: &v[start.min(v.len())..],
        rows,
        cols,
        row_stride: rs as isize,
        col_stride: cs as isize,
    })
}

/// dst (m, n) row-major at `dst` = a b, or dst + a b when `read_dst`.
///
/// # Safety
/// `dst` must be valid for writes of m * n f32 (and reads, with `read_dst`).
#[allow(unsafe_code)] // gemm's API takes raw pointers and strides
unsafe fn product_into(dst: *mut f32, read_dst: bool, a: &Operand, b: &Operand) {
    let threads = rayon::current_num_threads();
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the operands' views were checked against their storages (`operand`), and the
    // caller vouches for dst.
    unsafe {
        gemm::gemm(
            a.rows,
            b.cols,
            a.cols,
            dst,
            1,
            b.cols as isize,
            read_dst,
            a.data.as_ptr(),
            a.col_stride,
            a.row_stride,
            b.data.as_ptr(),
            b.col_stride,
            b.row_stride,
            if read_dst { 1.0 } else { 0.0 },
            1.0,
            false,
            false,
            false,
            parallelism,
        )
    }
}

fn check_depths(a: &Operand, b: &Operand) -> Result<()> {
    if a.cols != b.rows {
        bail!(
            "{NAME}: ({}, {}) times ({}, {})",
            a.rows,
            a.cols,
            b.rows,
            b.cols
        );
    }
    Ok(())
}

/// a b written into `dst`, exactly (a.rows, b.cols) row-major elements, none read first.
#[allow(unsafe_code)] // gemm writes through dst's pointer
fn write_product(dst: &mut [MaybeUninit<f32>], a: &Operand, b: &Operand) {
    assert_eq!(dst.len(), a.rows * b.cols, "{NAME}: the output's size");
    if a.cols == 0 {
        // gemm leaves the destination alone when there is nothing to sum.
        crate::fresh::zeroed(dst);
    } else {
        // SAFETY: dst holds exactly the (rows, cols) row-major destination (asserted), which
        // gemm writes whole without reading it (`read_dst` false).
        unsafe { product_into(dst.as_mut_ptr().cast::<f32>(), false, a, b) };
    }
}

struct Product;

#[allow(unsafe_code)] // the output buffer is written whole by gemm before it is read
impl CustomOp2 for Product {
    fn name(&self) -> &'static str {
        NAME
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let a = operand(s1, l1, "the left factor")?;
        let b = operand(s2, l2, "the right factor")?;
        check_depths(&a, &b)?;
        let mut out = crate::fresh::unwritten(a.rows * b.cols);
        write_product(&mut out, &a, &b);
        // SAFETY: `write_product` wrote every element.
        let out = unsafe { crate::fresh::assume_written(out) };
        Ok((CpuStorage::F32(out), Shape::from((a.rows, b.cols))))
    }
}

struct AddProduct;

#[allow(unsafe_code)] // gemm adds into the sum through its pointer
impl InplaceOp3 for AddProduct {
    fn name(&self) -> &'static str {
        NAME
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        let a = operand(s2, l2, "the left factor")?;
        let b = operand(s3, l3, "the right factor")?;
        check_depths(&a, &b)?;
        if l1.dims() != [a.rows, b.cols] {
            bail!(
                "{NAME}: a sum of {:?} for a ({}, {}) product",
                l1.dims(),
                a.rows,
                b.cols
            );
        }
        let Some((start, end)) = l1.contiguous_offsets() else {
            bail!("{NAME}: the sum must be contiguous");
        };
        let CpuStorage::F32(sum) = s1 else {
            bail!("{NAME}: the sum must be f32");
        };
        let sum = &mut sum[start..end];
        if a.cols > 0 {
            // SAFETY: `sum` holds exactly the (rows, cols) row-major destination.
            unsafe { product_into(sum.as_mut_ptr(), true, &a, &b) };
        }
        Ok(())
    }
}

/// a (m, k) times b (k, n), f32 on the CPU, any strides, written into `dst` (m * n row-major
/// elements, not read first): a block of rows of a larger result that is made in parts, with no
/// zero fill and no copy. [`matmul`]'s bits.
pub(crate) fn matmul_into(dst: &mut [MaybeUninit<f32>], a: &Tensor, b: &Tensor) -> Result<()> {
    let (sa, la) = a.storage_and_layout();
    let (sb, lb) = b.storage_and_layout();
    let (Storage::Cpu(sa), Storage::Cpu(sb)) = (&*sa, &*sb) else {
        bail!("{NAME}: the factors must be on the CPU");
    };
    let a = operand(sa, la, "the left factor")?;
    let b = operand(sb, lb, "the right factor")?;
    check_depths(&a, &b)?;
    if dst.len() != a.rows * b.cols {
        bail!(
            "{NAME}: {} elements for a ({}, {}) product",
            dst.len(),
            a.rows,
            b.cols
        );
    }
    write_product(dst, &a, &b);
    Ok(())
}

/// a (m, k) times b (k, n), f32 on the CPU, any strides -> (m, n), candle's `a.matmul(b)` bit for
/// bit but for the zero-filled output. No backward.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    a.apply_op2_no_bwd(b, &Product)
}

/// `sum += a b` in place: sum (m, n) contiguous, a (m, k), b (k, n), f32 on the CPU. The caller
/// must own `sum`'s storage: every tensor sharing it sees the change.
pub fn matmul_add(sum: &Tensor, a: &Tensor, b: &Tensor) -> Result<()> {
    sum.inplace_op3(a, b, &AddProduct)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// Against candle's matmul, bit for bit, with each factor plain and transposed; and the sum
    /// in place against the product added, to a rounding (gemm adds into the sum as it goes).
    #[test]
    fn equals_candles_matmul_and_adds_in_place() {
        let dev = Device::Cpu;
        let a = Tensor::randn(0f32, 1.0, (37, 70), &dev).unwrap();
        let b = Tensor::randn(0f32, 1.0, (70, 19), &dev).unwrap();
        let at = a.t().unwrap().contiguous().unwrap().t().unwrap();
        let bt = b.t().unwrap().contiguous().unwrap().t().unwrap();
        let want = a.matmul(&b).unwrap().to_vec2::<f32>().unwrap();
        for (x, y) in [(&a, &b), (&at, &b), (&a, &bt), (&at, &bt)] {
            let got = matmul(x, y).unwrap();
            assert_eq!(got.dims(), &[37, 19]);
            assert_eq!(
                got.to_vec2::<f32>().unwrap(),
                x.matmul(y).unwrap().to_vec2::<f32>().unwrap()
            );
        }
        let start = Tensor::randn(0f32, 1.0, (37, 19), &dev).unwrap();
        let sum = start.copy().unwrap();
        matmul_add(&sum, &a, &bt).unwrap();
        let expect = (start + a.matmul(&b).unwrap()).unwrap();
        let (got, expect) = (
            sum.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            expect.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        );
        for (g, e) in got.iter().zip(&expect) {
            assert!((g - e).abs() <= 1e-5 * (1.0 + e.abs()), "{g} vs {e}");
        }
        assert_ne!(got, want.concat(), "the sum started from the old values");
    }

    /// Two products written into the rows of one buffer, each as `matmul` makes it bit for bit
    /// (the left factor transposed in the second, as the head's weight gradient reads its logits'
    /// gradient); a buffer of the wrong size is an error, an empty depth writes zeros.
    #[test]
    fn matmul_into_writes_its_rows_of_a_larger_result() {
        let dev = Device::Cpu;
        let a = Tensor::randn(0f32, 1.0, (7, 70), &dev).unwrap();
        let c = Tensor::randn(0f32, 1.0, (70, 5), &dev)
            .unwrap()
            .t()
            .unwrap();
        let b = Tensor::randn(0f32, 1.0, (70, 19), &dev).unwrap();
        let mut buf = crate::fresh::unwritten(12 * 19);
        matmul_into(&mut buf[..7 * 19], &a, &b).unwrap();
        matmul_into(&mut buf[7 * 19..], &c, &b).unwrap();
        // SAFETY: the two products wrote rows 0..7 and 7..12, all of it.
        #[allow(unsafe_code)]
        let got = unsafe { crate::fresh::assume_written(buf) };
        let want = [matmul(&a, &b).unwrap(), matmul(&c, &b).unwrap()]
            .iter()
            .flat_map(|t| t.flatten_all().unwrap().to_vec1::<f32>().unwrap())
            .collect::<Vec<f32>>();
        assert_eq!(got, want);

        let mut short = crate::fresh::unwritten(6 * 19);
        let err = matmul_into(&mut short, &a, &b).unwrap_err().to_string();
        assert!(err.contains("114 elements for a (7, 19) product"), "{err}");
        let empty = Tensor::zeros((3, 0), candle_core::DType::F32, &dev).unwrap();
        let none = Tensor::zeros((0, 2), candle_core::DType::F32, &dev).unwrap();
        let mut zeros = crate::fresh::unwritten(6);
        matmul_into(&mut zeros, &empty, &none).unwrap();
        // SAFETY: an empty depth writes zeros everywhere.
        #[allow(unsafe_code)]
        let zeros = unsafe { crate::fresh::assume_written(zeros) };
        assert_eq!(zeros, [0.0; 6]);
    }

    /// An empty depth gives zeros (and leaves a sum alone); mismatched shapes are errors naming
    /// the product.
    #[test]
    fn edge_shapes_and_bad_shapes() {
        let dev = Device::Cpu;
        let a = Tensor::zeros((3, 0), candle_core::DType::F32, &dev).unwrap();
        let b = Tensor::zeros((0, 2), candle_core::DType::F32, &dev).unwrap();
        assert_eq!(
            matmul(&a, &b).unwrap().to_vec2::<f32>().unwrap(),
            vec![vec![0.0; 2]; 3]
        );
        let sum = Tensor::ones((3, 2), candle_core::DType::F32, &dev).unwrap();
        matmul_add(&sum, &a, &b).unwrap();
        assert_eq!(sum.to_vec2::<f32>().unwrap(), vec![vec![1.0; 2]; 3]);
        let x = Tensor::ones((3, 4), candle_core::DType::F32, &dev).unwrap();
        let y = Tensor::ones((5, 2), candle_core::DType::F32, &dev).unwrap();
        let err = matmul(&x, &y).unwrap_err().to_string();
        assert!(err.contains("matrix product: (3, 4) times (5, 2)"), "{err}");
        let wrong = Tensor::ones((2, 2), candle_core::DType::F32, &dev).unwrap();
        let err = matmul_add(&wrong, &x, &x.t().unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("a sum of [2, 2] for a (3, 3) product"),
            "{err}"
        );
    }
}
