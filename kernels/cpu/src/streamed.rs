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
//! w is streamed from memory once per block of x, and never copied. Where x has no more rows than
//! one vector holds, blocks are one vector and tiles twelve rows of w (a second vector would only
//! multiply zeros).
//!
//! Every output is summed in one order, `acc = x[i][t] * w[j][t] + acc` for t = 0, 1, ... (fused
//! multiply-adds), whichever block, tile or task it falls in: through this kernel a row's product
//! does not depend on the rows beside it.
//!
//! A bf16 weight is read as it is stored: a tile's rows are widened to f32 (exactly: bf16 is f32's
//! upper half) 64 steps at a time into a small buffer, with the lines of the chunk
//! after next asked into the cache, so a bf16 model's decode step reads half the bytes and writes
//! no widened copy of the weight; its products are the f32 products of the widened weight, bit for
//! bit.

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

/// The rows of w in a tile against blocks of one vector of x (`one_vector`) or of two.
fn tile_rows(one_vector: bool) -> usize {
    if one_vector { NR_ONE } else { NR }
}

/// Multiply-adds per parallel task: large enough that a task outweighs its scheduling.
const TASK_FMAS: usize = 1 << 18;

/// Up to how many rows of x the transformer takes this kernel (`cargo bench --bench engine --
/// skinny`, benches/RESULTS.md): up to 32 rows it beats the general GEMM at the products that
/// weigh (1.1-2.8x), except a 128 x 128 weight on a whole pool, where it only has two tasks; at 64
/// rows the two are even; beyond, the GEMM's packed blocks are reused by enough rows.
pub const MAX_ROWS: usize = 64;

/// Steps along k a bf16 tile is widened by at a time, into a buffer of its task (12 rows of 64:
/// 3 KB, in L1): short enough that the out-of-order core reads the next steps' weights while it
/// multiplies these. A whole tile widened first (12 rows of 896 at the 0.5B shape) waited on
/// memory with the FMA units idle, and the bf16 decode step ran slower than the f32 one.
const WIDEN_STEPS: usize = 64;

/// An element of a weight the product reads in place: f32 as it lies, or bf16 widened a chunk of
/// steps at a time.
pub trait WeightElement: Copy + Send + Sync {
    /// Steps along k per chunk.
    const STEPS: usize;
    /// The f32 a task's buffer for a widened chunk of a tile holds.
    const BUFFER: usize;
    /// Steps `t0..t0 + len` of the rows of `w` (each `k` long) as f32 rows, and the stride between
    /// them: w's own rows (f32, stride k), or widened into `buf` (stride len).
    fn chunk<'a>(
        w: &'a [Self],
        k: usize,
        t0: usize,
        len: usize,
        buf: &'a mut [f32],
    ) -> (&'a [f32], usize);
}

impl WeightElement for f32 {
    const STEPS: usize = usize::MAX;
    const BUFFER: usize = 0;

    #[inline(always)]
    fn chunk<'a>(
        w: &'a [f32],
        k: usize,
        t0: usize,
        _: usize,
        _: &'a mut [f32],
    ) -> (&'a [f32], usize) {
        (&w[t0..], k)
    }
}

impl WeightElement for bf16 {
    const STEPS: usize = WIDEN_STEPS;
    const BUFFER: usize = NR_ONE * WIDEN_STEPS;

    // Inlined into the dispatched task, so that the loop is compiled for its vector width.
    #[inline(always)]
    fn chunk<'a>(
        w: &'a [bf16],
        k: usize,
        t0: usize,
        len: usize,
        buf: &'a mut [f32],
    ) -> (&'a [f32], usize) {
        let rows = w.len() / k;
        for (to, from) in buf.chunks_exact_mut(len).zip(w.chunks_exact(k)) {
            prefetch(from, t0 + PREFETCH_AHEAD * len, len);
            for (to, from) in to.iter_mut().zip(&from[t0..t0 + len]) {
                // bf16 is the upper half of an f32: exact, and no call into `half`'s dispatch.
                *to = f32::from_bits(u32::from(from.to_bits()) << 16);
            }
        }
        (&buf[..rows * len], len)
    }
}

/// How many chunks ahead of the one being widened a row's weights are asked into the cache.
const PREFETCH_AHEAD: usize = 2;

/// Asks the cache lines of `row[from..from + len]` into L1 (as far as the row goes): a bf16 chunk
/// is widened and then multiplied for a few hundred cycles, about one trip to memory, so the
/// lines two chunks ahead arrive before their widening needs them.
#[inline(always)]
fn prefetch<T>(row: &[T], from: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let end = (from + len).min(row.len());
        let line = 64 / std::mem::size_of::<T>().max(1);
        let mut at = from;
        while at < end {
            // SAFETY: a prefetch is a hint that never faults; `at < row.len()`, so the address
            // is inside the row.
            #[allow(unsafe_code)]
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(row.as_ptr().add(at).cast());
            }
            at += line;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (row, from, len);
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
        let one_vector = m <= S::F32_LANES;
        let mb = if one_vector { 1 } else { 2 } * S::F32_LANES;
        let nr = tile_rows(one_vector);
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
    // x packed block by block: block b, step t holds rows b * mb .. b * mb + mb at t, as one or
    // two vectors (the block's rows transposed); rows past m are zeros (their outputs are
    // dropped).
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
        let nr = tile_rows(one);
        let cols = w.len() / k;
        let z = simd.splat_f32s(0.0);
        // A bf16 tile's widened chunk (f32 rows are read in place: no buffer). Allocated here,
        // not as the chunks need it: a call inside the tiles' loops would push their
        // accumulators out of registers.
        let mut buf = vec![0f32; W::BUFFER];
        for (b, block) in xp.chunks_exact(k * mb).enumerate() {
            let (xv, _) = S::as_simd_f32s(block);
            let at = b * mb;
            let mut j = 0;
            while j < cols {
                let take = (cols - j).min(nr);
                let ws = &w[j * k..(j + take) * k];
                let out = &mut yt[j * mp..(j + take) * mp];
                if take == nr {
                    // The tile's accumulators: one vector per row of w, or two ([`tile_6`]).
                    let mut acc = [z; 12];
                    let mut t0 = 0;
                    while t0 < k {
                        let len = (k - t0).min(W::STEPS);
                        let (rows, stride) = W::chunk(ws, k, t0, len, &mut buf);
                        acc = if one {
                            tile_12_one(simd, &xv[t0..t0 + len], rows, stride, acc)
                        } else {
                            tile_6(simd, &xv[2 * t0..2 * (t0 + len)], rows, stride, acc)
                        };
                        t0 += len;
                    }
                    for c in 0..nr {
                        let out = &mut out[c * mp..][..mp];
                        if one {
                            store(simd, out, at, &[acc[c]]);
                        } else {
                            store(simd, out, at, &[acc[c], acc[NR + c]]);
                        }
                    }
                } else {
                    // The edge: one row of w at a time, summed in the tiles' order.
                    for c in 0..take {
                        let row = &ws[c * k..][..k];
                        let mut acc = [z; 2];
                        let mut t0 = 0;
                        while t0 < k {
                            let len = (k - t0).min(W::STEPS);
                            let (wr, _) = W::chunk(row, k, t0, len, &mut buf);
                            acc = if one {
                                column_one(simd, &xv[t0..t0 + len], &wr[..len], acc)
                            } else {
                                column(simd, &xv[2 * t0..2 * (t0 + len)], &wr[..len], acc)
                            };
                            t0 += len;
                        }
                        let vectors = if one { 1 } else { 2 };
                        store(simd, &mut out[c * mp..][..mp], at, &acc[..vectors]);
                    }
                }
                j += take;
            }
        }
    }
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

#[path = "streamed_tiles.rs"]
mod tiles;
use tiles::{column, column_one, store, tile_6, tile_12_one};

#[cfg(test)]
#[path = "streamed_tests.rs"]
mod tests;
