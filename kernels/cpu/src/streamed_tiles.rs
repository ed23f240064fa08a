//! The streamed product's register tiles: rows of w (a chunk of their steps, f32 as they lie or
//! widened) against one block of packed rows of x, their accumulators carried from chunk to chunk
//! in named registers. Every accumulator sums its products in step order, so the tiles and the
//! edge columns give an output the same bits.

use pulp::Simd;

/// One row of w (a chunk of its steps) against one block of x of two vectors, added to `acc`:
/// the edge of the product, summed in the order of [`tile_6`].
#[inline(always)]
pub(super) fn column<S: Simd>(
    simd: S,
    xv: &[S::f32s],
    w: &[f32],
    acc: [S::f32s; 2],
) -> [S::f32s; 2] {
    let [mut a, mut b] = acc;
    for (t, &wt) in w.iter().enumerate() {
        let v = simd.splat_f32s(wt);
        a = simd.mul_add_f32s(xv[2 * t], v, a);
        b = simd.mul_add_f32s(xv[2 * t + 1], v, b);
    }
    [a, b]
}

/// [`column`] against a block of one vector of x (`acc[1]` is left as it is).
#[inline(always)]
pub(super) fn column_one<S: Simd>(
    simd: S,
    xv: &[S::f32s],
    w: &[f32],
    acc: [S::f32s; 2],
) -> [S::f32s; 2] {
    let [mut a, b] = acc;
    for (t, &wt) in w.iter().enumerate() {
        a = simd.mul_add_f32s(xv[t], simd.splat_f32s(wt), a);
    }
    [a, b]
}

/// Twelve rows of w (a chunk of their steps, rows `stride` apart) against one block of one
/// vector of x, added to twelve accumulators kept in named registers, each summed in
/// [`tile_6`]'s order.
#[inline(always)]
pub(super) fn tile_12_one<S: Simd>(
    simd: S,
    xv: &[S::f32s],
    w: &[f32],
    stride: usize,
    acc: [S::f32s; 12],
) -> [S::f32s; 12] {
    let len = xv.len();
    let row = |c: usize| &w[c * stride..][..len];
    let (w0, w1, w2, w3, w4, w5) = (row(0), row(1), row(2), row(3), row(4), row(5));
    let (w6, w7, w8, w9, w10, w11) = (row(6), row(7), row(8), row(9), row(10), row(11));
    let [
        mut a0,
        mut a1,
        mut a2,
        mut a3,
        mut a4,
        mut a5,
        mut a6,
        mut a7,
        mut a8,
        mut a9,
        mut a10,
        mut a11,
    ] = acc;
    for (t, &x) in xv.iter().enumerate() {
        a0 = simd.mul_add_f32s(x, simd.splat_f32s(w0[t]), a0);
        a1 = simd.mul_add_f32s(x, simd.splat_f32s(w1[t]), a1);
        a2 = simd.mul_add_f32s(x, simd.splat_f32s(w2[t]), a2);
        a3 = simd.mul_add_f32s(x, simd.splat_f32s(w3[t]), a3);
        a4 = simd.mul_add_f32s(x, simd.splat_f32s(w4[t]), a4);
        a5 = simd.mul_add_f32s(x, simd.splat_f32s(w5[t]), a5);
        a6 = simd.mul_add_f32s(x, simd.splat_f32s(w6[t]), a6);
        a7 = simd.mul_add_f32s(x, simd.splat_f32s(w7[t]), a7);
        a8 = simd.mul_add_f32s(x, simd.splat_f32s(w8[t]), a8);
        a9 = simd.mul_add_f32s(x, simd.splat_f32s(w9[t]), a9);
        a10 = simd.mul_add_f32s(x, simd.splat_f32s(w10[t]), a10);
        a11 = simd.mul_add_f32s(x, simd.splat_f32s(w11[t]), a11);
    }
    [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11]
}

/// Six rows of w (a chunk of their steps, rows `stride` apart) against one block of x of two
/// vectors, added to its twelve accumulators (`acc[c]` and `acc[6 + c]`: row c's two vectors),
/// kept in named registers.
#[inline(always)]
pub(super) fn tile_6<S: Simd>(
    simd: S,
    xv: &[S::f32s],
    w: &[f32],
    stride: usize,
    acc: [S::f32s; 12],
) -> [S::f32s; 12] {
    let len = xv.len() / 2;
    let xv = &xv[..2 * len];
    let row = |c: usize| &w[c * stride..][..len];
    let (w0, w1, w2, w3, w4, w5) = (row(0), row(1), row(2), row(3), row(4), row(5));
    let [
        mut a0,
        mut a1,
        mut a2,
        mut a3,
        mut a4,
        mut a5,
        mut b0,
        mut b1,
        mut b2,
        mut b3,
        mut b4,
        mut b5,
    ] = acc;
    for t in 0..len {
        let (xa, xb) = (xv[2 * t], xv[2 * t + 1]);
        let v = simd.splat_f32s(w0[t]);
        a0 = simd.mul_add_f32s(xa, v, a0);
        b0 = simd.mul_add_f32s(xb, v, b0);
        let v = simd.splat_f32s(w1[t]);
        a1 = simd.mul_add_f32s(xa, v, a1);
        b1 = simd.mul_add_f32s(xb, v, b1);
        let v = simd.splat_f32s(w2[t]);
        a2 = simd.mul_add_f32s(xa, v, a2);
        b2 = simd.mul_add_f32s(xb, v, b2);
        let v = simd.splat_f32s(w3[t]);
        a3 = simd.mul_add_f32s(xa, v, a3);
        b3 = simd.mul_add_f32s(xb, v, b3);
        let v = simd.splat_f32s(w4[t]);
        a4 = simd.mul_add_f32s(xa, v, a4);
        b4 = simd.mul_add_f32s(xb, v, b4);
        let v = simd.splat_f32s(w5[t]);
        a5 = simd.mul_add_f32s(xa, v, a5);
        b5 = simd.mul_add_f32s(xb, v, b5);
    }
    [a0, a1, a2, a3, a4, a5, b0, b1, b2, b3, b4, b5]
}

/// One output column of a block (its `vectors.len()` vectors), at `out[at..]`.
#[inline(always)]
pub(super) fn store<S: Simd>(simd: S, out: &mut [f32], at: usize, vectors: &[S::f32s]) {
    let _ = simd;
    let (v, _) = S::as_mut_simd_f32s(&mut out[at..at + vectors.len() * S::F32_LANES]);
    v.copy_from_slice(vectors);
}
