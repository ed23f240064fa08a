//! Matrix products with few rows, `y = x wᵀ` for x (m, k) and a weight w (n, k) as the model stores
//! it, for inference: a decode step multiplies one row per sequence by every weight of the model.
//!
//! A general GEMM (candle's `gemm`) first packs the right operand into blocks; with a few rows
//! on the left that packing copies the whole weight matrix for as little arithmetic as the copy
//! itself, and at the Qwen2.5-0.5B shape it took more of a decode step than the products
//! (benches/RESULTS.md). Here every output is a dot product of a row of x with a row of w, both
//! contiguous in memory, so no packing is needed: a tile of [`MR`] rows of x and [`NR`] rows of w
//! is accumulated in SIMD registers along k (AVX2 and FMA when `pulp` detects them at run time,
//! scalar code otherwise), rows of w are streamed from memory once, and x stays in cache.
//!
//! Each output is summed in the same order whichever rows share its tile or its batch: through
//! this kernel a row's product does not depend on the rows beside it (the transformer takes it
//! for at most [`MAX_ROWS`] rows; bigger batches go through [`super::streamed`] or the general
//! GEMM).

use candle_core::{Result, Tensor};
use pulp::{Arch, Simd, WithSimd};
use rayon::prelude::*;

const NAME: &str = "skinny matmul";
/// Rows of x in a register tile.
const MR: usize = 4;
/// Rows of w in a register tile: MR x NR accumulators plus the loads fit AVX2's 16 registers.
const NR: usize = 3;
/// Multiply-adds per parallel task: large enough that a task outweighs its scheduling.
const TASK_FMAS: usize = 1 << 18;

/// Up to how many rows of x this kernel beats the other products (measured in
/// benches/RESULTS.md, `cargo bench --bench engine -- skinny`). It beats the general GEMM up to
/// 16 rows, but from 9 rows on [`super::streamed`] (whose blocks of 16 rows are then mostly
/// filled) beats it too.
pub const MAX_ROWS: usize = 8;
/// Shorter rows than this leave too few steps along k to pay for each tile's horizontal sums:
/// at k = 128 the general GEMM is several times faster.
pub const MIN_DEPTH: usize = 256;

/// x (m, k) times w (n, k) transposed, both row-major: y (m, n) row-major.
pub fn matmul_t(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    if m == 0 || n == 0 || k == 0 {
        // An empty sum: zeros (and no zero-sized chunks below).
        return vec![0.0; m * n];
    }
    // Each task owns a run of w's rows and writes their columns of y transposed (contiguous),
    // so tasks share nothing; one transpose at the end costs m * n against m * n * k.
    let cols = (TASK_FMAS / (m * k).max(1)).max(1).div_ceil(NR) * NR;
    let mut yt = vec![0f32; n * m];
    let arch = Arch::new();
    yt.par_chunks_mut(cols * m)
        .zip(w.par_chunks(cols * k))
        .for_each(|(yt, w)| arch.dispatch(Columns { x, w, yt, m, k }));
    let mut y = vec![0f32; m * n];
    for (j, col) in yt.chunks_exact(m).enumerate() {
        for (i, &v) in col.iter().enumerate() {
            y[i * n + j] = v;
        }
    }
    y
}

/// One task: every row of x against a run of rows of w, into yt (rows of w, m).
struct Columns<'a> {
    x: &'a [f32],
    w: &'a [f32],
    yt: &'a mut [f32],
    m: usize,
    k: usize,
}

impl WithSimd for Columns<'_> {
    type Output = ();

    // No closures below: a closure (as in `array::from_fn`) is compiled apart from this
    // function's AVX2 target features, and its SIMD calls are then not inlined (the horizontal
    // sums cost more than the products when they were).
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Columns { x, w, yt, m, k } = self;
        for (ws, yt) in w.chunks(NR * k).zip(yt.chunks_mut(NR * m)) {
            let cols = ws.len() / k;
            let mut i = 0;
            while i < m {
                let rows = (m - i).min(MR);
                let xs = &x[i * k..(i + rows) * k];
                if rows == MR && cols == NR {
                    tile_4x3(simd, xs, ws, k, yt, m, i);
                } else {
                    tile_any(simd, xs, rows, ws, cols, k, yt, m, i);
                }
                i += rows;
            }
        }
    }
}

/// `a · b` from its SIMD part (already multiplied and summed into `acc`) and its scalar tail.
/// Every dot product of the kernel ends here, so all sum in one order.
#[inline(always)]
fn finish<S: Simd>(simd: S, acc: S::f32s, a_tail: &[f32], b_tail: &[f32]) -> f32 {
    let mut tail = 0f32;
    for (a, b) in a_tail.iter().zip(b_tail) {
        tail += a * b;
    }
    simd.reduce_sum_f32s(acc) + tail
}

/// Any tile of up to MR rows of x (`x`, rows x k) and NR rows of w (`w`, cols x k), one dot
/// product at a time: the edges of the product. Writes yt[c * m + i + r].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn tile_any<S: Simd>(
    simd: S,
    x: &[f32],
    rows: usize,
    w: &[f32],
    cols: usize,
    k: usize,
    yt: &mut [f32],
    m: usize,
    i: usize,
) {
    for r in 0..rows {
        let (xv, xt) = S::as_simd_f32s(&x[r * k..(r + 1) * k]);
        for c in 0..cols {
            let (wv, wt) = S::as_simd_f32s(&w[c * k..(c + 1) * k]);
            let mut acc = simd.splat_f32s(0.0);
            for (&a, &b) in xv.iter().zip(wv) {
                acc = simd.mul_add_f32s(a, b, acc);
            }
            yt[c * m + i + r] = finish(simd, acc, xt, wt);
        }
    }
}

/// The full tile, 4 rows of x by 3 rows of w, its twelve accumulators named so that they stay in
/// registers (as an array, LLVM wrote them back to the stack on every step). Each accumulator
/// sums in the order of [`tile_any`], so a row's result does not depend on its tile.
#[inline(always)]
fn tile_4x3<S: Simd>(simd: S, x: &[f32], w: &[f32], k: usize, yt: &mut [f32], m: usize, i: usize) {
    let (x0, x0t) = S::as_simd_f32s(&x[..k]);
    let (x1, x1t) = S::as_simd_f32s(&x[k..2 * k]);
    let (x2, x2t) = S::as_simd_f32s(&x[2 * k..3 * k]);
    let (x3, x3t) = S::as_simd_f32s(&x[3 * k..4 * k]);
    let (w0, w0t) = S::as_simd_f32s(&w[..k]);
    let (w1, w1t) = S::as_simd_f32s(&w[k..2 * k]);
    let (w2, w2t) = S::as_simd_f32s(&w[2 * k..3 * k]);
    let len = x0.len();
    let (x1, x2, x3) = (&x1[..len], &x2[..len], &x3[..len]);
    let (w0, w1, w2) = (&w0[..len], &w1[..len], &w2[..len]);
    let z = simd.splat_f32s(0.0);
    let (mut a00, mut a01, mut a02, mut a10, mut a11, mut a12) = (z, z, z, z, z, z);
    let (mut a20, mut a21, mut a22, mut a30, mut a31, mut a32) = (z, z, z, z, z, z);
    for t in 0..len {
        let (b0, b1, b2) = (w0[t], w1[t], w2[t]);
        let x = x0[t];
        a00 = simd.mul_add_f32s(x, b0, a00);
        a01 = simd.mul_add_f32s(x, b1, a01);
        a02 = simd.mul_add_f32s(x, b2, a02);
        let x = x1[t];
        a10 = simd.mul_add_f32s(x, b0, a10);
        a11 = simd.mul_add_f32s(x, b1, a11);
        a12 = simd.mul_add_f32s(x, b2, a12);
        let x = x2[t];
        a20 = simd.mul_add_f32s(x, b0, a20);
        a21 = simd.mul_add_f32s(x, b1, a21);
        a22 = simd.mul_add_f32s(x, b2, a22);
        let x = x3[t];
        a30 = simd.mul_add_f32s(x, b0, a30);
        a31 = simd.mul_add_f32s(x, b1, a31);
        a32 = simd.mul_add_f32s(x, b2, a32);
    }
    let accs = [
        [a00, a01, a02],
        [a10, a11, a12],
        [a20, a21, a22],
        [a30, a31, a32],
    ];
    let (xts, wts) = ([x0t, x1t, x2t, x3t], [w0t, w1t, w2t]);
    for (r, (row, xt)) in accs.iter().zip(xts).enumerate() {
        for (c, (&acc, wt)) in row.iter().zip(wts).enumerate() {
            yt[c * m + i + r] = finish(simd, acc, xt, wt);
        }
    }
}

/// Whether [`skinny_matmul`] takes these operands: f32 on the CPU, x with at most [`MAX_ROWS`]
/// rows (all but its last dimension together) of at least [`MIN_DEPTH`] columns.
pub fn applies(x: &Tensor, w: &Tensor) -> bool {
    let k = x.dims().last().copied().unwrap_or(0);
    super::applies(x) && super::applies(w) && k >= MIN_DEPTH && x.elem_count() / k <= MAX_ROWS
}

/// x (rows, k) times w (n, k) transposed -> (rows, n), for inference: no gradient flows back.
pub fn skinny_matmul(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    super::rows_times_weight(x, w, NAME, matmul_t, None)
}

#[cfg(test)]
#[path = "skinny_tests.rs"]
pub(crate) mod tests;
