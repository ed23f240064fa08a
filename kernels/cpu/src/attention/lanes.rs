//! The vector-lane loops attention's tasks run: dot products, y += a x, sums, and weighted sums of
//! key or value rows, each under the `Simd` the task was dispatched with.

use pulp::Simd;

/// a · b: fused multiply-adds in vector lanes (two accumulators, so consecutive steps need not
/// wait for each other), the lanes then summed by the CPU's shuffles, where an 8-lane array
/// summed element by element took a store and seven dependent scalar adds per key.
#[inline(always)]
pub(super) fn dot<S: Simd>(simd: S, a: &[f32], b: &[f32]) -> f32 {
    let (ah, at) = S::as_simd_f32s(a);
    let (bh, bt) = S::as_simd_f32s(b);
    let (mut even, mut odd) = (simd.splat_f32s(0.0), simd.splat_f32s(0.0));
    let mut pairs_a = ah.chunks_exact(2);
    let mut pairs_b = bh.chunks_exact(2);
    for (x, y) in pairs_a.by_ref().zip(pairs_b.by_ref()) {
        even = simd.mul_add_f32s(x[0], y[0], even);
        odd = simd.mul_add_f32s(x[1], y[1], odd);
    }
    for (x, y) in pairs_a.remainder().iter().zip(pairs_b.remainder()) {
        even = simd.mul_add_f32s(*x, *y, even);
    }
    let mut sum = simd.reduce_sum_f32s(simd.add_f32s(even, odd));
    for (x, y) in at.iter().zip(bt) {
        sum = x.mul_add(*y, sum);
    }
    sum
}

/// y += a x, fused multiply-adds.
#[inline(always)]
pub(super) fn axpy<S: Simd>(simd: S, y: &mut [f32], a: f32, x: &[f32]) {
    let (yh, yt) = S::as_mut_simd_f32s(y);
    let (xh, xt) = S::as_simd_f32s(x);
    let av = simd.splat_f32s(a);
    for (y, x) in yh.iter_mut().zip(xh) {
        *y = simd.mul_add_f32s(av, *x, *y);
    }
    for (y, x) in yt.iter_mut().zip(xt) {
        *y = a.mul_add(*x, *y);
    }
}

/// Each element of xs replaced by `f` of it, in vector lanes, the tail as one partial vector (at
/// the tiny training shape a softmax row of 15 keys is all tail in AVX-512's 16 lanes). For a
/// single operation only: `f`'s body runs with the task's target features only where it is
/// inlined, and `vexp::exp_in_place_with` through this helper (`f` calling `exp_lanes`) made
/// the attention kernel four times slower, so vexp keeps its own loop.
#[inline(always)]
pub(super) fn map_in_place<S: Simd>(simd: S, xs: &mut [f32], f: impl Fn(S::f32s) -> S::f32s) {
    let (head, tail) = S::as_mut_simd_f32s(xs);
    for v in head {
        *v = f(*v);
    }
    if !tail.is_empty() {
        simd.partial_store_f32s(tail, f(simd.partial_load_f32s(tail)));
    }
}

/// Σ xs, in vector lanes (the tail a partial vector, its padding zeros) and then across them.
#[inline(always)]
pub(super) fn sum<S: Simd>(simd: S, xs: &[f32]) -> f32 {
    let (head, tail) = S::as_simd_f32s(xs);
    let mut acc = simd.partial_load_f32s(tail);
    for x in head {
        acc = simd.add_f32s(acc, *x);
    }
    simd.reduce_sum_f32s(acc)
}

/// o = Σ_j w_j row_j over the rows whose weight is not zero (o (head_dim) overwritten; `rows`
/// gives the rows afresh, in the weights' order). Four vectors of o at a time stay in registers
/// across the rows, where adding each row into o in memory (`axpy`) made every row wait for the
/// last one's store to reach its load; then two (head dim 32 in AVX-512's 16 lanes, 16 or 48 in
/// AVX2's 8), where one at a time walked the rows twice, each multiply-add waiting on the one
/// before; then one.
#[inline(always)]
pub(super) fn weighted_sum<'r, S: Simd, I: Iterator<Item = &'r [f32]>>(
    simd: S,
    o: &mut [f32],
    w: &[f32],
    rows: impl Fn() -> I,
) {
    let lanes = S::F32_LANES;
    let (oh, ot) = S::as_mut_simd_f32s(o);
    let n = oh.len();
    let fours = n / 4 * 4;
    let twos = fours + (n - fours) / 2 * 2;
    for at in (0..fours).step_by(4) {
        weighted_block::<4, S, I>(simd, &mut oh[at..at + 4], at, w, &rows);
    }
    for at in (fours..twos).step_by(2) {
        weighted_block::<2, S, I>(simd, &mut oh[at..at + 2], at, w, &rows);
    }
    for at in twos..n {
        weighted_block::<1, S, I>(simd, &mut oh[at..at + 1], at, w, &rows);
    }
    for (c, o) in ot.iter_mut().enumerate() {
        let col = n * lanes + c;
        *o = w
            .iter()
            .zip(rows())
            .filter(|(wj, _)| **wj != 0.0)
            .fold(0.0, |s, (wj, row)| wj.mul_add(row[col], s));
    }
}

/// Vectors `at..at + N` of [`weighted_sum`]'s o into `out`, summed over the rows in their order
/// in N accumulators (N a constant, so they stay in registers).
#[inline(always)]
fn weighted_block<'r, const N: usize, S: Simd, I: Iterator<Item = &'r [f32]>>(
    simd: S,
    out: &mut [S::f32s],
    at: usize,
    w: &[f32],
    rows: &impl Fn() -> I,
) {
    let lanes = S::F32_LANES;
    let mut acc = [simd.splat_f32s(0.0); N];
    for (&wj, row) in w.iter().zip(rows()) {
        if wj == 0.0 {
            continue;
        }
        let wv = simd.splat_f32s(wj);
        let (rh, _) = S::as_simd_f32s(&row[at * lanes..(at + N) * lanes]);
        for (a, r) in acc.iter_mut().zip(rh) {
            *a = simd.mul_add_f32s(wv, *r, *a);
        }
    }
    out.copy_from_slice(&acc);
}
