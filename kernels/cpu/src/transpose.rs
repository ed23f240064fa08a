//! A block of f32 transposed in vector registers: sixteen by sixteen where the CPU has AVX-512
//! (and the crate's `x86-v4` feature is on), eight by eight where it has AVX2, element by element
//! at the edges.
//!
//! The streamed product (`streamed.rs`) writes its outputs transposed and packs its left factor
//! transposed; element by element, the output's transpose alone was ~20% of a decode-step product
//! at depth 128 (one thread, 32 x 128 x 512: 182 GFLOP/s with it, 234 without, AVX-512 Zen 5):
//! a scalar load and a scalar store per element. Here eight rows of the source are loaded as
//! eight vectors, turned into eight columns by 24 shuffles, and stored as eight vectors; with
//! AVX-512, sixteen rows by 64 shuffles of twice the width, 0.25 shuffles an element against
//! 0.375. Data movement only: the values' bits are unchanged.

use std::mem::MaybeUninit;

/// An element a transpose writes: an f32, or one not written yet (a fresh output, which then
/// needs no zero fill first: `fresh::unwritten`).
pub(crate) trait Slot {
    fn put(&mut self, v: f32);
}

impl Slot for f32 {
    #[inline(always)]
    fn put(&mut self, v: f32) {
        *self = v;
    }
}

impl Slot for MaybeUninit<f32> {
    #[inline(always)]
    fn put(&mut self, v: f32) {
        self.write(v);
    }
}

/// `dst[c * dst_stride + r] = src[r * src_stride + c]` for r < rows, c < cols; the rest of `dst`
/// is left as it is.
///
/// # Panics
/// If `src` or `dst` is too short for those rows and columns at their strides.
pub(crate) fn transpose<T: Slot>(
    src: &[f32],
    src_stride: usize,
    (rows, cols): (usize, usize),
    dst: &mut [T],
    dst_stride: usize,
) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(
        src.len() >= (rows - 1) * src_stride + cols && dst.len() >= (cols - 1) * dst_stride + rows,
        "transpose: {rows} x {cols} at strides {src_stride} -> {dst_stride} does not fit {} -> {} values",
        src.len(),
        dst.len()
    );
    let mut block = Block {
        src,
        src_stride,
        dst,
        dst_stride,
    };
    #[cfg(all(target_arch = "x86_64", feature = "x86-v4"))]
    if let Some(simd) = pulp::x86::V4::try_new() {
        let (r16, c16) = (rows / 16 * 16, cols / 16 * 16);
        simd.vectorize(Sixteens {
            simd,
            block: &mut block,
            rows: r16,
            cols: c16,
        });
        // The edges: the last rows % 16 rows whole, the last cols % 16 columns of the rest.
        eights(*simd, &mut block, r16..rows, 0..cols);
        eights(*simd, &mut block, 0..r16, c16..cols);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = pulp::x86::V3::try_new() {
        eights(simd, &mut block, 0..rows, 0..cols);
        return;
    }
    block.scalar(0..rows, 0..cols);
}

/// Source rows `rows` by columns `cols` transposed eight by eight where whole, the edges (the
/// last rows % 8 rows whole, the last cols % 8 columns of the rest) one element at a time.
#[cfg(target_arch = "x86_64")]
fn eights<T: Slot>(simd: pulp::x86::V3, block: &mut Block<'_, T>, rows: Range, cols: Range) {
    let r8 = rows.start + rows.len() / 8 * 8;
    let c8 = cols.start + cols.len() / 8 * 8;
    simd.vectorize(Eights {
        simd,
        block: &mut *block,
        rows: rows.start..r8,
        cols: cols.start..c8,
    });
    block.scalar(r8..rows.end, cols.clone());
    block.scalar(rows.start..r8, c8..cols.end);
}

type Range = std::ops::Range<usize>;

/// The first source row and column of each `size` x `size` block of source rows `rows` by
/// columns `cols` (lengths multiples of `size`), in the order the vector transposes take them:
/// along the rows of whichever side has the wider stride (`strides`: source, destination). That
/// side's rows are then read or written in order, each a stream of whole cache lines, and the
/// narrow side's are close together anyway. Across them instead, its rows a whole stride apart
/// (2 KB in the streamed product: 512 outputs, or a depth of 512) fall in the same few L1 sets;
/// the output's transpose then kept ~a fifth of a 32 x 128 x 512 product's time.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn origins(
    (src_stride, dst_stride): (usize, usize),
    rows: Range,
    cols: Range,
    size: usize,
) -> impl Iterator<Item = (usize, usize)> {
    let by_columns = dst_stride > src_stride;
    let (outer, inner) = if by_columns {
        (cols, rows)
    } else {
        (rows, cols)
    };
    outer.step_by(size).flat_map(move |a| {
        inner
            .clone()
            .step_by(size)
            .map(move |b| if by_columns { (b, a) } else { (a, b) })
    })
}

/// `values` written into `dst` from `at` on: one vector's store (the compiler makes one of it).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn put_run<T: Slot, const N: usize>(dst: &mut [T], at: usize, values: [f32; N]) {
    for (d, v) in dst[at..at + N].iter_mut().zip(values) {
        d.put(v);
    }
}

struct Block<'a, T> {
    src: &'a [f32],
    src_stride: usize,
    dst: &'a mut [T],
    dst_stride: usize,
}

impl<T: Slot> Block<'_, T> {
    /// The transpose of source rows `rows` by columns `cols`, one element at a time.
    fn scalar(&mut self, rows: Range, cols: Range) {
        for r in rows {
            let row = &self.src[r * self.src_stride..];
            for c in cols.clone() {
                self.dst[c * self.dst_stride + r].put(row[c]);
            }
        }
    }
}

/// The whole 8 x 8 blocks of source rows `rows` by columns `cols` (lengths multiples of 8).
#[cfg(target_arch = "x86_64")]
struct Eights<'a, 'b, T> {
    simd: pulp::x86::V3,
    block: &'a mut Block<'b, T>,
    rows: Range,
    cols: Range,
}

#[cfg(target_arch = "x86_64")]
impl<T: Slot> pulp::NullaryFnOnce for Eights<'_, '_, T> {
    type Output = ();

    // Called inside `V3::vectorize`, so that the shuffles below compile to AVX instructions; no
    // closures around them (a closure is compiled apart from the target features of its caller:
    // `origins`' are index arithmetic only).
    #[inline(always)]
    fn call(self) {
        use core::arch::x86_64::__m256;
        let Eights {
            simd,
            block,
            rows,
            cols,
        } = self;
        let avx = simd.avx;
        let Block {
            src,
            src_stride,
            ref mut dst,
            dst_stride,
        } = *block;
        for (r0, c0) in origins((src_stride, dst_stride), rows, cols, 8) {
            let mut v = [pulp::cast::<[f32; 8], __m256>([0.0; 8]); 8];
            for (i, v) in v.iter_mut().enumerate() {
                let at = (r0 + i) * src_stride + c0;
                *v = pulp::cast(pulp::as_arrays::<8, f32>(&src[at..at + 8]).0[0]);
            }
            // Row i holds (a_i0 .. a_i7). Pairs interleaved: (a00 a10 a01 a11 | a04 a14 a05 a15), ...
            let t0 = avx._mm256_unpacklo_ps(v[0], v[1]);
            let t1 = avx._mm256_unpackhi_ps(v[0], v[1]);
            let t2 = avx._mm256_unpacklo_ps(v[2], v[3]);
            let t3 = avx._mm256_unpackhi_ps(v[2], v[3]);
            let t4 = avx._mm256_unpacklo_ps(v[4], v[5]);
            let t5 = avx._mm256_unpackhi_ps(v[4], v[5]);
            let t6 = avx._mm256_unpacklo_ps(v[6], v[7]);
            let t7 = avx._mm256_unpackhi_ps(v[6], v[7]);
            // Fours: (a00 a10 a20 a30 | a04 a14 a24 a34), (a01 .. a31 | a05 .. a35), ...
            let s0 = avx._mm256_shuffle_ps::<0x44>(t0, t2);
            let s1 = avx._mm256_shuffle_ps::<0xEE>(t0, t2);
            let s2 = avx._mm256_shuffle_ps::<0x44>(t1, t3);
            let s3 = avx._mm256_shuffle_ps::<0xEE>(t1, t3);
            let s4 = avx._mm256_shuffle_ps::<0x44>(t4, t6);
            let s5 = avx._mm256_shuffle_ps::<0xEE>(t4, t6);
            let s6 = avx._mm256_shuffle_ps::<0x44>(t5, t7);
            let s7 = avx._mm256_shuffle_ps::<0xEE>(t5, t7);
            // Column c: the low halves of rows 0-3's and 4-7's fours for c < 4, the high
            // halves for c >= 4.
            let columns = [
                avx._mm256_permute2f128_ps::<0x20>(s0, s4),
                avx._mm256_permute2f128_ps::<0x20>(s1, s5),
                avx._mm256_permute2f128_ps::<0x20>(s2, s6),
                avx._mm256_permute2f128_ps::<0x20>(s3, s7),
                avx._mm256_permute2f128_ps::<0x31>(s0, s4),
                avx._mm256_permute2f128_ps::<0x31>(s1, s5),
                avx._mm256_permute2f128_ps::<0x31>(s2, s6),
                avx._mm256_permute2f128_ps::<0x31>(s3, s7),
            ];
            for (j, column) in columns.into_iter().enumerate() {
                put_run::<T, 8>(dst, (c0 + j) * dst_stride + r0, pulp::cast(column));
            }
        }
    }
}

/// The whole 16 x 16 blocks of the first `rows` x `cols` (multiples of 16), in AVX-512 registers.
#[cfg(all(target_arch = "x86_64", feature = "x86-v4"))]
struct Sixteens<'a, 'b, T> {
    simd: pulp::x86::V4,
    block: &'a mut Block<'b, T>,
    rows: usize,
    cols: usize,
}

#[cfg(all(target_arch = "x86_64", feature = "x86-v4"))]
impl<T: Slot> pulp::NullaryFnOnce for Sixteens<'_, '_, T> {
    type Output = ();

    // As `Eights`: inside `V4::vectorize`, no closures.
    #[inline(always)]
    fn call(self) {
        use core::arch::x86_64::__m512;
        let Sixteens {
            simd,
            block,
            rows,
            cols,
        } = self;
        let f = simd.avx512f;
        let Block {
            src,
            src_stride,
            ref mut dst,
            dst_stride,
        } = *block;
        for (r0, c0) in origins((src_stride, dst_stride), 0..rows, 0..cols, 16) {
            let mut r = [pulp::cast::<[f32; 16], __m512>([0.0; 16]); 16];
            for (i, r) in r.iter_mut().enumerate() {
                let at = (r0 + i) * src_stride + c0;
                *r = pulp::cast(pulp::as_arrays::<16, f32>(&src[at..at + 16]).0[0]);
            }
            // Within each 128-bit lane L (columns 4L .. 4L + 3) it is the 8 x 8 steps: pairs
            // of rows interleaved, then pairs of pairs, so that u[4g + c] holds column 4L + c
            // of rows 4g .. 4g + 3 in lane L.
            let mut u = r;
            for g in 0..4 {
                let [w, x, y, z] = [r[4 * g], r[4 * g + 1], r[4 * g + 2], r[4 * g + 3]];
                let t0 = f._mm512_castps_pd(f._mm512_unpacklo_ps(w, x));
                let t1 = f._mm512_castps_pd(f._mm512_unpackhi_ps(w, x));
                let t2 = f._mm512_castps_pd(f._mm512_unpacklo_ps(y, z));
                let t3 = f._mm512_castps_pd(f._mm512_unpackhi_ps(y, z));
                u[4 * g] = f._mm512_castpd_ps(f._mm512_unpacklo_pd(t0, t2));
                u[4 * g + 1] = f._mm512_castpd_ps(f._mm512_unpackhi_pd(t0, t2));
                u[4 * g + 2] = f._mm512_castpd_ps(f._mm512_unpacklo_pd(t1, t3));
                u[4 * g + 3] = f._mm512_castpd_ps(f._mm512_unpackhi_pd(t1, t3));
            }
            // Column 4L + c is lane L of u[c], u[4 + c], u[8 + c] and u[12 + c], in that
            // order: lanes gathered two by two (0x44 takes lanes 0 and 1 of each operand,
            // 0xEE lanes 2 and 3), then every other one (0x88 the even, 0xDD the odd).
            let mut columns = r;
            for c in 0..4 {
                let low = f._mm512_shuffle_f32x4::<0x44>(u[c], u[4 + c]);
                let low2 = f._mm512_shuffle_f32x4::<0x44>(u[8 + c], u[12 + c]);
                let high = f._mm512_shuffle_f32x4::<0xEE>(u[c], u[4 + c]);
                let high2 = f._mm512_shuffle_f32x4::<0xEE>(u[8 + c], u[12 + c]);
                columns[c] = f._mm512_shuffle_f32x4::<0x88>(low, low2);
                columns[4 + c] = f._mm512_shuffle_f32x4::<0xDD>(low, low2);
                columns[8 + c] = f._mm512_shuffle_f32x4::<0x88>(high, high2);
                columns[12 + c] = f._mm512_shuffle_f32x4::<0xDD>(high, high2);
            }
            for (j, column) in columns.into_iter().enumerate() {
                put_run::<T, 16>(dst, (c0 + j) * dst_stride + r0, pulp::cast(column));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Slot for Option<f32> {
        fn put(&mut self, v: f32) {
            *self = Some(v);
        }
    }

    /// The plain loop, for reference.
    fn plain(src: &[f32], ss: usize, (rows, cols): (usize, usize), dst: &mut [f32], ds: usize) {
        for r in 0..rows {
            for c in 0..cols {
                dst[c * ds + r] = src[r * ss + c];
            }
        }
    }

    #[test]
    fn equals_the_plain_loop_with_whole_blocks_edges_and_strides() {
        // Under one block, exactly one, blocks with edges of 1-7 either way, and strides wider
        // than the block read or written (the streamed product's padded rows); blocks taken
        // along the source's rows (its stride the wider) and along the destination's.
        for &(rows, cols, pad_src, pad_dst) in &[
            (1, 1, 0, 0),
            (24, 16, 0, 40),
            (27, 21, 3, 100),
            (3, 5, 0, 2),
            (8, 8, 0, 0),
            (8, 16, 3, 0),
            (9, 8, 0, 5),
            (17, 23, 1, 7),
            (32, 512, 0, 0),
            (40, 64, 8, 24),
            (64, 130, 2, 0),
            // Sixteen by sixteen with AVX-512: one block, blocks with edges of 8 (taken by the
            // eights) and of 1-7, along either side.
            (16, 16, 0, 0),
            (48, 40, 0, 0),
            (130, 64, 0, 3),
            (35, 50, 5, 1),
        ] {
            let (ss, ds) = (cols + pad_src, rows + pad_dst);
            let src: Vec<f32> = (0..rows * ss).map(|i| i as f32 * 0.5 - 7.25).collect();
            // Both start as NaN, so an element written where it should not be, or left out,
            // shows as a difference in bits.
            let mut ours = vec![f32::NAN; cols * ds];
            let mut want = ours.clone();
            transpose(&src, ss, (rows, cols), &mut ours, ds);
            plain(&src, ss, (rows, cols), &mut want, ds);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&ours),
                bits(&want),
                "{rows} x {cols}, strides {ss} -> {ds}"
            );
            // The same through `Slot` into elements that record what they are given (as
            // `MaybeUninit` slots are written, but readable here: None where nothing was put).
            let mut recorded = vec![None; cols * ds];
            transpose(&src, ss, (rows, cols), &mut recorded, ds);
            let recorded: Vec<f32> = recorded.iter().map(|v| v.unwrap_or(f32::NAN)).collect();
            assert_eq!(
                bits(&recorded),
                bits(&want),
                "{rows} x {cols}, through slots"
            );
        }
    }

    #[test]
    fn nothing_to_move_for_an_empty_block_and_short_buffers_are_named() {
        let mut dst = vec![1.0f32; 4];
        transpose(&[], 0, (0, 3), &mut dst, 1);
        transpose(&[], 0, (3, 0), &mut dst, 1);
        assert_eq!(dst, [1.0; 4]);
        let short = std::panic::catch_unwind(|| {
            let mut dst = vec![0.0f32; 8];
            transpose(&[0.0; 10], 4, (3, 4), &mut dst, 3);
        });
        let message = short.expect_err("3 x 4 at stride 4 needs 12 values");
        let text = message
            .downcast_ref::<String>()
            .map(String::as_str)
            .unwrap_or_default();
        assert!(text.contains("does not fit 10 -> 8"), "{text}");
    }
}
