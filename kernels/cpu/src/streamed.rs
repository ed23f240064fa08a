//! Matrix products with a few rows, `y = x wᵀ` for x (m, k) and a weight w (n, k) as the model
//! stores it, with the weight read in place: for inference at shallow depths (a small model's
//! decode step: 32 rows per lane by k = 128), where [`super::skinny`]'s dot products are too short
//! to pay for their horizontal sums.
//!
//! A general GEMM (candle's `gemm`) copies w into packed blocks first, one strided element at a
//! time, and with a few rows on the left that copy was about as long as the products themselves
//! (26% of a tiny model's generation against 35% of arithmetic, benches/RESULTS.md). Here x is the
//! operand that gets packed, and it is small: each block of `2 * lanes` rows of x is laid out
//! column by column, so that one step along k loads those rows as two SIMD vectors. Each element
//! of w is then broadcast from where it lies, six rows of w at a time, into 2 x 6 accumulators:
//! w is streamed from memory once per block of x, and never copied.
//!
//! Every output is summed in one order, `acc = x[i][t] * w[j][t] + acc` for t = 0, 1, ... (fused
//! multiply-adds), whichever block, tile or task it falls in: through this kernel a row's product
//! does not depend on the rows beside it.
//!
//! A bf16 weight is read as it is stored, each element widened to f32 (exactly: bf16 is f32's
//! upper half) as it is broadcast, so a bf16 model's decode step reads half the bytes and writes
//! no widened copy; its products are the f32 products of the widened weight, bit for bit.

use std::cell::RefCell;

use candle_core::{DType, Result, Tensor};
use half::bf16;
use pulp::{Arch, Simd, WithSimd};
use rayon::prelude::*;

use super::fresh::{assume_written, unwritten};
use super::transpose::transpose;

const NAME: &str = "streamed matmul";
/// Rows of w in a register tile against a block of two vectors of x: 2 x 6 accumulators, two
/// loads of x and a broadcast fit AVX2's 16 registers.
const NR: usize = 6;
/// Rows of w in a register tile against a block of one vector of x: 12 accumulators, enough
/// independent chains to cover the multiply-add's latency on both of a core's FMA units.
const NR_ONE: usize = 12;

/// Multiply-adds per parallel task: large enough that a task outweighs its scheduling.
const TASK_FMAS: usize = 1 << 18;

/// Up to how many rows of x the transformer takes this kernel (`cargo bench --bench engine --
/// skinny`, benches/RESULTS.md): up to 32 rows it beats the general GEMM at the products that
/// weigh (1.1-2.8x), except a 128 x 128 weight on a whole pool, where it only has two tasks; at 64
/// rows the two are even; beyond, the GEMM's packed blocks are reused by enough rows.
pub const MAX_ROWS: usize = 64;

/// An element of a weight the product reads in place: f32, or bf16 widened as it is read.
pub trait WeightElement: Copy + Send + Sync {
    fn widen(self) -> f32;
}

impl WeightElement for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl WeightElement for bf16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        // bf16 is the upper half of an f32: exact, and no call into `half`'s dispatch.
        f32::from_bits(u32::from(self.to_bits()) << 16)
    }
}

/// x (m, k) times w (n, k) transposed, both row-major: y (m, n) row-major.
///
/// # Panics
/// If x does not hold m * k values or w n * k (through candle, the op checks the shapes first).
pub fn matmul_t<W: WeightElement>(x: &[f32], w: &[W], m: usize, k: usize, n: usize) -> Vec<f32> {
    assert_eq!(
        x.len(),
        m * k,
        "{NAME}: x holds {} values, not {m} x {k}",
        x.len()
    );
    assert_eq!(
        w.len(),
        n * k,
        "{NAME}: w holds {} values, not {n} x {k}",
        w.len()
    );
    Arch::new().dispatch(Product { x, w, m, k, n })
}

struct Product<'a, W> {
    x: &'a [f32],
    w: &'a [W],
    m: usize,
    k: usize,
    n: usize,
}

impl<W: WeightElement> WithSimd for Product<'_, W> {
    type Output = Vec<f32>;

    // Dispatched only for the vector width, which fixes the block's rows; the tasks below
    // dispatch again (the same `Arch`, so the same width) inside their rayon closures.
    #[inline(always)]
    fn with_simd<S: Simd>(self, _: S) -> Vec<f32> {
        let Product { x, w, m, k, n } = self;
        if m == 0 || n == 0 || k == 0 {
            // An empty sum: zeros (and no zero-sized chunks below).
            return vec![0.0; m * n];
        }
        // Blocks of two vectors of rows, or of one where x has no more rows than a vector holds
        // (a Qwen2.5-0.5B decode step's 16 rows with AVX-512): a second vector of zero rows would
        // double the multiply-adds for nothing.
        let (mb, nr) = if m <= S::F32_LANES {
            (S::F32_LANES, NR_ONE)
        } else {
            (2 * S::F32_LANES, NR)
        };
        let blocks = m.div_ceil(mb);
        let mp = blocks * mb;
        with_scratch(blocks * k * mb, n * mp, |xp, yt| {
            transposed_products(x, w, (m, k, n), (mb, nr), xp, yt)
        })
    }
}

thread_local! {
    /// The packed rows and the transposed products of the last call on this thread, kept for the
    /// next: a decode step makes a few hundred of these products, and zero-filling two fresh
    /// buffers for each was ~1.5% of a tiny model's generation. Nothing stale reaches an output:
    /// both are written whole before they are read.
    static SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Scratch beyond this many f32 (4 MB) is not kept: a product that large (the Qwen2.5-0.5B
/// head's, 9.7 MB of it at 16 rows) outweighs its buffers' zero fill by far, and a thread should
/// not hold it after. The tiny model's take up to 256 kB, the 0.5B layers' up to 0.6 MB.
const SCRATCH_MAX: usize = 1 << 20;

/// `f` over scratch buffers of `xp_len` and `yt_len` f32: this thread's kept ones, or fresh ones
/// for a product too large to keep or run while this thread's are lent out (rayon may run a
/// stolen job on a thread waiting inside a product).
fn with_scratch<R>(xp_len: usize, yt_len: usize, f: impl FnOnce(&mut [f32], &mut [f32]) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut kept) if xp_len + yt_len <= SCRATCH_MAX => {
            let (xp, yt) = &mut *kept;
            for (v, len) in [(&mut *xp, xp_len), (&mut *yt, yt_len)] {
                if v.len() < len {
                    v.resize(len, 0.0);
                }
            }
            f(&mut xp[..xp_len], &mut yt[..yt_len])
        }
        _ => f(&mut vec![0f32; xp_len], &mut vec![0f32; yt_len]),
    })
}

/// y (m, n) = x wᵀ through `xp` (blocks of mb rows of x, packed) and `yt` (y transposed, its
/// rows padded to a whole block), both overwritten whole; tasks take whole tiles of `nr` rows of
/// w.
fn transposed_products<W: WeightElement>(
    x: &[f32],
    w: &[W],
    (m, k, n): (usize, usize, usize),
    (mb, nr): (usize, usize),
    xp: &mut [f32],
    yt: &mut [f32],
) -> Vec<f32> {
    let mp = xp.len() / k;
    // x packed block by block: block b, step t holds rows b * mb .. b * mb + mb at t, as two
    // vectors (the block's rows transposed); rows past m are zeros (their outputs are dropped).
    for (b, block) in xp.chunks_exact_mut(k * mb).enumerate() {
        let rows = &x[b * mb * k..((b + 1) * mb).min(m) * k];
        let real = rows.len() / k;
        transpose(rows, k, (real, k), block, mb);
        if real < mb {
            for step in block.chunks_exact_mut(mb) {
                step[real..].fill(0.0);
            }
        }
    }
    // Each task owns a run of w's rows and writes their outputs transposed (rows of w by the
    // padded rows of x, contiguous), so tasks share nothing.
    let cols = (TASK_FMAS / (mp * k)).max(1).div_ceil(nr) * nr;
    let arch = Arch::new();
    let xp = &*xp;
    yt.par_chunks_mut(cols * mp)
        .zip(w.par_chunks(cols * k))
        .for_each(|(yt, w)| {
            arch.dispatch(Columns {
                xp,
                w,
                yt,
                k,
                mp,
                mb,
            });
        });
    // yt (n, mp) back to rows: its first m columns, transposed.
    let mut y = unwritten(m * n);
    transpose(yt, mp, (n, m), &mut y, n);
    // SAFETY: the transpose wrote y[c * n + r] for every r < n and c < m: all m * n elements.
    #[allow(unsafe_code)]
    let y = unsafe { assume_written(y) };
    y
}

/// One task: every block of x against a run of rows of w, into yt (rows of w, mp).
struct Columns<'a, W> {
    xp: &'a [f32],
    w: &'a [W],
    yt: &'a mut [f32],
    k: usize,
    mp: usize,
    /// Rows of x per block: 2 * the vector width of the dispatch that packed x, or 1 * it.
    mb: usize,
}

impl<W: WeightElement> WithSimd for Columns<'_, W> {
    type Output = ();

    // No closures below: a closure is compiled apart from this function's target features.
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Columns {
            xp,
            w,
            yt,
            k,
            mp,
            mb,
        } = self;
        let one = mb == S::F32_LANES;
        assert!(
            one || mb == 2 * S::F32_LANES,
            "{NAME}: one Arch dispatches one vector width"
        );
        let nr = if one { NR_ONE } else { NR };
        let cols = w.len() / k;
        for (b, block) in xp.chunks_exact(k * mb).enumerate() {
            let (xv, _) = S::as_simd_f32s(block);
            let mut j = 0;
            while j < cols {
                let take = (cols - j).min(nr);
                let ws = &w[j * k..(j + take) * k];
                let out = &mut yt[j * mp..(j + take) * mp];
                match (one, take == nr) {
                    (false, true) => tile_6(simd, xv, ws, k, out, mp, b * mb),
                    (true, true) => tile_12_one(simd, xv, ws, k, out, mp, b * mb),
                    (false, false) => {
                        for c in 0..take {
                            let (w, out) = (&ws[c * k..][..k], &mut out[c * mp..][..mp]);
                            column(simd, xv, w, out, b * mb);
                        }
                    }
                    (true, false) => {
                        for c in 0..take {
                            let (w, out) = (&ws[c * k..][..k], &mut out[c * mp..][..mp]);
                            column_one(simd, xv, w, out, b * mb);
                        }
                    }
                }
                j += take;
            }
        }
    }
}

/// One row of w against one block of x, into `out[at..at + 2 * lanes]`: the edge of the product,
/// summed in the order of [`tile_6`].
#[inline(always)]
fn column<S: Simd, W: WeightElement>(simd: S, xv: &[S::f32s], w: &[W], out: &mut [f32], at: usize) {
    let z = simd.splat_f32s(0.0);
    let (mut a, mut b) = (z, z);
    for (t, &wt) in w.iter().enumerate() {
        let v = simd.splat_f32s(wt.widen());
        a = simd.mul_add_f32s(xv[2 * t], v, a);
        b = simd.mul_add_f32s(xv[2 * t + 1], v, b);
    }
    store(simd, out, at, a, b);
}

/// [`column`] against a block of one vector of x.
#[inline(always)]
fn column_one<S: Simd, W: WeightElement>(
    simd: S,
    xv: &[S::f32s],
    w: &[W],
    out: &mut [f32],
    at: usize,
) {
    let mut a = simd.splat_f32s(0.0);
    for (t, &wt) in w.iter().enumerate() {
        a = simd.mul_add_f32s(xv[t], simd.splat_f32s(wt.widen()), a);
    }
    let (v, _) = S::as_mut_simd_f32s(&mut out[at..at + S::F32_LANES]);
    v[0] = a;
}

/// Twelve rows of w against one block of one vector of x, in twelve named accumulators, each
/// summed in [`tile_6`]'s order; writes `out[c * mp + at..][..lanes]` for c in 0..12.
#[inline(always)]
fn tile_12_one<S: Simd, W: WeightElement>(
    simd: S,
    xv: &[S::f32s],
    w: &[W],
    k: usize,
    out: &mut [f32],
    mp: usize,
    at: usize,
) {
    let (w0, w1, w2) = (&w[..k], &w[k..2 * k], &w[2 * k..3 * k]);
    let (w3, w4, w5) = (&w[3 * k..4 * k], &w[4 * k..5 * k], &w[5 * k..6 * k]);
    let (w6, w7, w8) = (&w[6 * k..7 * k], &w[7 * k..8 * k], &w[8 * k..9 * k]);
    let (w9, w10, w11) = (&w[9 * k..10 * k], &w[10 * k..11 * k], &w[11 * k..12 * k]);
    let xv = &xv[..k];
    let z = simd.splat_f32s(0.0);
    let (mut a0, mut a1, mut a2, mut a3, mut a4, mut a5) = (z, z, z, z, z, z);
    let (mut a6, mut a7, mut a8, mut a9, mut a10, mut a11) = (z, z, z, z, z, z);
    for (t, &x) in xv.iter().enumerate() {
        a0 = simd.mul_add_f32s(x, simd.splat_f32s(w0[t].widen()), a0);
        a1 = simd.mul_add_f32s(x, simd.splat_f32s(w1[t].widen()), a1);
        a2 = simd.mul_add_f32s(x, simd.splat_f32s(w2[t].widen()), a2);
        a3 = simd.mul_add_f32s(x, simd.splat_f32s(w3[t].widen()), a3);
        a4 = simd.mul_add_f32s(x, simd.splat_f32s(w4[t].widen()), a4);
        a5 = simd.mul_add_f32s(x, simd.splat_f32s(w5[t].widen()), a5);
        a6 = simd.mul_add_f32s(x, simd.splat_f32s(w6[t].widen()), a6);
        a7 = simd.mul_add_f32s(x, simd.splat_f32s(w7[t].widen()), a7);
        a8 = simd.mul_add_f32s(x, simd.splat_f32s(w8[t].widen()), a8);
        a9 = simd.mul_add_f32s(x, simd.splat_f32s(w9[t].widen()), a9);
        a10 = simd.mul_add_f32s(x, simd.splat_f32s(w10[t].widen()), a10);
        a11 = simd.mul_add_f32s(x, simd.splat_f32s(w11[t].widen()), a11);
    }
    let accs = [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11];
    for (c, a) in accs.into_iter().enumerate() {
        let (v, _) = S::as_mut_simd_f32s(&mut out[c * mp + at..][..S::F32_LANES]);
        v[0] = a;
    }
}

/// Six rows of w against one block of x, their twelve accumulators named so that they stay in
/// registers; writes `out[c * mp + at..][..2 * lanes]` for c in 0..6.
#[inline(always)]
fn tile_6<S: Simd, W: WeightElement>(
    simd: S,
    xv: &[S::f32s],
    w: &[W],
    k: usize,
    out: &mut [f32],
    mp: usize,
    at: usize,
) {
    let (w0, w1, w2) = (&w[..k], &w[k..2 * k], &w[2 * k..3 * k]);
    let (w3, w4, w5) = (&w[3 * k..4 * k], &w[4 * k..5 * k], &w[5 * k..6 * k]);
    let xv = &xv[..2 * k];
    let z = simd.splat_f32s(0.0);
    let (mut a0, mut a1, mut a2, mut a3, mut a4, mut a5) = (z, z, z, z, z, z);
    let (mut b0, mut b1, mut b2, mut b3, mut b4, mut b5) = (z, z, z, z, z, z);
    for t in 0..k {
        let (xa, xb) = (xv[2 * t], xv[2 * t + 1]);
        let v = simd.splat_f32s(w0[t].widen());
        a0 = simd.mul_add_f32s(xa, v, a0);
        b0 = simd.mul_add_f32s(xb, v, b0);
        let v = simd.splat_f32s(w1[t].widen());
        a1 = simd.mul_add_f32s(xa, v, a1);
        b1 = simd.mul_add_f32s(xb, v, b1);
        let v = simd.splat_f32s(w2[t].widen());
        a2 = simd.mul_add_f32s(xa, v, a2);
        b2 = simd.mul_add_f32s(xb, v, b2);
        let v = simd.splat_f32s(w3[t].widen());
        a3 = simd.mul_add_f32s(xa, v, a3);
        b3 = simd.mul_add_f32s(xb, v, b3);
        let v = simd.splat_f32s(w4[t].widen());
        a4 = simd.mul_add_f32s(xa, v, a4);
        b4 = simd.mul_add_f32s(xb, v, b4);
        let v = simd.splat_f32s(w5[t].widen());
        a5 = simd.mul_add_f32s(xa, v, a5);
        b5 = simd.mul_add_f32s(xb, v, b5);
    }
    for (c, (a, b)) in [(a0, b0), (a1, b1), (a2, b2), (a3, b3), (a4, b4), (a5, b5)]
        .into_iter()
        .enumerate()
    {
        store(simd, &mut out[c * mp..][..mp], at, a, b);
    }
}

/// The two vectors of one output column of a block, at `out[at..]`.
#[inline(always)]
fn store<S: Simd>(simd: S, out: &mut [f32], at: usize, a: S::f32s, b: S::f32s) {
    let _ = simd;
    let (v, _) = S::as_mut_simd_f32s(&mut out[at..at + 2 * S::F32_LANES]);
    v[0] = a;
    v[1] = b;
}

/// Whether [`streamed_matmul`] takes these operands: x f32 and w f32 or bf16 on the CPU, x with
/// at most [`MAX_ROWS`] rows (all but its last dimension together).
pub fn applies(x: &Tensor, w: &Tensor) -> bool {
    let k = x.dims().last().copied().unwrap_or(0);
    let weight = w.device().is_cpu() && matches!(w.dtype(), DType::F32 | DType::BF16);
    super::applies(x) && weight && k > 0 && x.elem_count() / k <= MAX_ROWS
}

/// x (rows, k) times w (n, k) transposed -> (rows, n), for inference: no gradient flows back.
/// x is f32; w f32 or bf16 (read in place, see the module's doc).
pub fn streamed_matmul(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    super::rows_times_weight(x, w, NAME, matmul_t::<f32>, Some(matmul_t::<bf16>))
}

#[cfg(test)]
#[path = "streamed_tests.rs"]
mod tests;
