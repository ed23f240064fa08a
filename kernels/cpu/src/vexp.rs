//! `exp` over a slice, eight lanes at a time where the CPU has AVX2 and FMA.
//!
//! The kernels' softmaxes (attention, log-probs) and SwiGLU's sigmoid take an exponential per
//! element, and libm's scalar `expf` was 4-6% of a tiny model's training and decoding steps
//! (benches/RESULTS.md). This is the classic range reduction, `exp(x) = 2^n exp(r)` with
//! `n = round(x / ln 2)` and `|r| <= ln(2) / 2`, and Cephes' degree-6 polynomial for `exp(r)`
//! (the one of `expf` in the Cephes library), within 1 ulp of the correctly rounded value (tested).
//!
//! The same operations run in every lane and in the scalar [`exp`]: fused multiply-adds
//! (`f32::mul_add` in scalar code is fused too), so a value's exponential has the same bits
//! whether it sits in a vector or in the tail, on any CPU. Below [`ZERO_BELOW`] the result is
//! exactly 0, as libm's: masked attention scores (-1e9) stay in the vector path. The few inputs
//! left outside the reduction's range (near the underflow, overflowing, NaN) take libm's `expf`.
//!
//! On a CPU without FMA, `f32::mul_add` is a software call: correct, but slower than libm.

use pulp::{Arch, Simd, WithSimd};

/// The reduction's range: n = round(x / ln 2) stays in [-126, 127], so 2^n is a normal f32 and
/// so is the result (exp(-87) = 1.6e-38; exp(88) = 1.7e38). Outside it, libm.
const LO: f32 = -87.0;
const HI: f32 = 88.0;
/// At and below this, exp(x) < 2^-150 rounds to +0 (libm's `expf` gives +0 there too).
const ZERO_BELOW: f32 = -104.0;
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split in two, so that `x - n ln 2` is exact to f32 precision for |n| <= 127.
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 * 2^23: adding it rounds to an integer, held in the low bits of the sum's mantissa.
const ROUND: f32 = 12_582_912.0;
/// Cephes expf's polynomial, highest degree first; the last two terms (r and 1) are added apart.
const P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5, // Cephes writes 5.0000001201e-1, which is 0.5 in f32
];

/// exp(x), the same bits as one lane of [`exp_in_place`].
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    if !(LO..=HI).contains(&x) {
        return x.exp();
    }
    let t = x.mul_add(LOG2E, ROUND);
    let n = t - ROUND;
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = P[0];
    for c in &P[1..] {
        p = p.mul_add(r, *c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    // n + 127 in the exponent field: 2^n, n in [-126, 127] for x in [LO, HI].
    let e = t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23;
    y * f32::from_bits(e)
}

/// Every element replaced by its exponential.
pub fn exp_in_place(xs: &mut [f32]) {
    Arch::new().dispatch(ExpInPlace(xs));
}

struct ExpInPlace<'a>(&'a mut [f32]);

impl WithSimd for ExpInPlace<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        exp_in_place_with(simd, self.0);
    }
}

/// [`exp_in_place`] for a caller already running under `simd` (a kernel's own `WithSimd` task):
/// no second dispatch.
#[inline(always)]
pub(crate) fn exp_in_place_with<S: Simd>(simd: S, xs: &mut [f32]) {
    let (head, tail) = S::as_mut_simd_f32s(xs);
    for v in head {
        *v = exp_lanes(simd, *v);
    }
    // The tail as one partial vector (its padding lanes are zeros, in range): element by element
    // it took the scalar path, and a masked score's -inf went on to libm's expf. Attention's rows
    // at the tiny training shape (15 keys) are all tail in AVX-512's 16 lanes (benches/RESULTS.md's
    // git history). The same bits ([`exp`] is one lane of `exp_lanes`).
    if !tail.is_empty() {
        let v = exp_lanes(simd, simd.partial_load_f32s(tail));
        simd.partial_store_f32s(tail, v);
    }
}

/// exp of every lane, as [`exp`] computes one.
#[inline(always)]
pub(crate) fn exp_lanes<S: Simd>(simd: S, x: S::f32s) -> S::f32s {
    let lanes = S::F32_LANES;
    let zero = simd.less_than_or_equal_f32s(x, simd.splat_f32s(ZERO_BELOW));
    // NaN compares false both ways, so it counts as out of range.
    let outside = simd.or_m32s(
        simd.and_m32s(
            simd.less_than_f32s(x, simd.splat_f32s(LO)),
            simd.not_m32s(zero),
        ),
        simd.not_m32s(simd.less_than_or_equal_f32s(x, simd.splat_f32s(HI))),
    );
    if simd.first_true_m32s(outside) < lanes {
        // Rare (a masked score, an overflow): lane by lane through the scalar function.
        let mut buf = [0f32; 64];
        let buf = &mut buf[..lanes];
        simd.partial_store_f32s(buf, x);
        for v in buf.iter_mut() {
            *v = exp(*v);
        }
        return simd.partial_load_f32s(buf);
    }
    // Lanes at or below ZERO_BELOW are computed from LO (keeping the exponent in range) and
    // replaced by 0 at the end.
    let x = simd.max_f32s(x, simd.splat_f32s(LO));
    let round = simd.splat_f32s(ROUND);
    let t = simd.mul_add_f32s(x, simd.splat_f32s(LOG2E), round);
    let n = simd.sub_f32s(t, round);
    let r = simd.mul_add_f32s(n, simd.splat_f32s(-LN2_HI), x);
    let r = simd.mul_add_f32s(n, simd.splat_f32s(-LN2_LO), r);
    let mut p = simd.splat_f32s(P[0]);
    for c in &P[1..] {
        p = simd.mul_add_f32s(p, r, simd.splat_f32s(*c));
    }
    let y = simd.mul_add_f32s(p, simd.mul_f32s(r, r), r);
    let y = simd.add_f32s(y, simd.splat_f32s(1.0));
    let bits = simd.sub_u32s(
        simd.transmute_u32s_f32s(t),
        simd.splat_u32s(ROUND.to_bits() - 127),
    );
    let scale = simd.wrapping_dyn_shl_u32s(bits, simd.splat_u32s(23));
    let y = simd.mul_f32s(y, simd.transmute_f32s_u32s(scale));
    simd.select_f32s(zero, simd.splat_f32s(0.0), y)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within 1 ulp of the correctly rounded exp (computed in f64) over the whole range, and
    /// libm's results (0, infinity, NaN) outside it.
    #[test]
    fn exp_matches_f64_within_one_ulp() {
        let mut worst = 0u32;
        let mut x = LO;
        while x <= HI {
            let want = (f64::from(x)).exp() as f32;
            let got = exp(x);
            let ulp = (got.to_bits() as i64 - want.to_bits() as i64).unsigned_abs() as u32;
            worst = worst.max(ulp);
            x += 0.0007;
        }
        assert!(worst <= 1, "worst error {worst} ulp");
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-1e30), 0.0);
        assert_eq!(exp(-110.0), 0.0);
        assert_eq!(exp(-100.0), (-100f32).exp()); // subnormal, from libm
        assert_eq!(exp(100.0), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        // At the range's ends: exp(-87) = 1.6458e-38 (still normal), exp(88) = 1.6516e38.
        assert!((exp(-87.0) / 1.645_8e-38 - 1.0).abs() < 1e-4);
        assert!((exp(88.0) / 1.651_6e38 - 1.0).abs() < 1e-4);
    }

    /// Every f32 of the reduction's range, not a sample: `cargo test -p roll-cpu-kernels --release
    /// -- --ignored` (about 2.2e9 values; run when the polynomial or the reduction changes).
    #[test]
    #[ignore]
    fn exp_is_within_one_ulp_at_every_f32_of_the_range() {
        let (from, to) = (LO.to_bits(), HI.to_bits());
        // Negative floats count down in bits from -0.0 (0x8000_0000) to LO; positive up to HI.
        let negatives = (0x8000_0000..=from).map(f32::from_bits);
        let positives = (0..=to).map(f32::from_bits);
        let mut worst = 0u32;
        for x in negatives.chain(positives) {
            let want = f64::from(x).exp() as f32;
            let ulp = (exp(x).to_bits() as i64 - want.to_bits() as i64).unsigned_abs() as u32;
            worst = worst.max(ulp);
        }
        assert!(worst <= 1, "worst error {worst} ulp");
    }

    /// The vector lanes give the scalar function's bits, in range and out of it, whatever the
    /// slice's length (tails) and wherever a value sits among its neighbours.
    #[test]
    fn lanes_give_the_scalar_bits() {
        let mut xs: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin() * 90.0).collect();
        xs[13] = f32::NEG_INFINITY;
        xs[200] = f32::NAN;
        xs[517] = 1e4;
        // A masked score among ordinary ones, and the edges of the zero and libm ranges.
        xs[300] = -1e9;
        xs[301] = ZERO_BELOW;
        xs[302] = ZERO_BELOW + 0.5;
        xs[303] = LO - 0.001;
        // Slices whose tails (after 8 or 16 lanes) hold the -inf at 13, the values at 300-303 or
        // the NaN at 200 ((0, 14), (0, 15), (298, 7), (198, 5)), slices with them in whole vectors,
        // and slices of ordinary values.
        for (start, len) in [
            (0, 0),
            (0, 1),
            (0, 7),
            (0, 8),
            (0, 9),
            (0, 14),
            (0, 15),
            (0, 31),
            (0, 1000),
            (298, 7),
            (296, 23),
            (193, 8),
            (198, 5),
        ] {
            let xs = &xs[start..start + len];
            let mut got = xs.to_vec();
            exp_in_place(&mut got);
            for (g, x) in got.iter().zip(xs) {
                let want = exp(*x);
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "exp({x}): lanes {g}, scalar {want}"
                );
            }
        }
    }
}
