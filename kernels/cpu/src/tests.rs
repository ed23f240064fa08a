//! Each fused kernel against the same computation in candle's differentiable ops (what the
//! transformer ran before, and still runs off the CPU): values to 1e-5, and the gradients of a
//! random linear function of the output to 1e-4 of the largest gradient.

use candle_core::{D, Device, Tensor, Var};

use super::*;

/// The additive mask (b, 1, groups * t, past + t) of roll's `model::attention_mask`: query `i` of
/// row `n` sees key column `j` iff `valid_from[n] <= j <= past + i`.
fn attention_mask(valid_from: &[usize], past: usize, t: usize, groups: usize) -> Tensor {
    let total = past + t;
    let mut data = vec![];
    for &start in valid_from {
        for _ in 0..groups {
            for i in 0..t {
                data.extend((0..total).map(|j| {
                    if j < start || j > past + i {
                        -1e9f32
                    } else {
                        0.0
                    }
                }));
            }
        }
    }
    Tensor::from_vec(data, (valid_from.len(), 1, groups * t, total), &Device::Cpu).unwrap()
}

fn randn(shape: &[usize], seed_scale: f32) -> Tensor {
    Tensor::randn(0f32, seed_scale, shape, &Device::Cpu).unwrap()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// Elementwise `|a - b| <= tol (1 + |b|)`.
fn close(what: &str, a: &Tensor, b: &Tensor, tol: f32) {
    assert_eq!(a.dims(), b.dims(), "{what}: shapes");
    for (i, (x, y)) in values(a).iter().zip(values(b)).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

/// `max |a - b| <= tol max |b|`: gradients relative to their own scale.
fn close_rel(what: &str, a: &Tensor, b: &Tensor, tol: f32) {
    assert_eq!(a.dims(), b.dims(), "{what}: shapes");
    let (a, b) = (values(a), values(b));
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(scale > 0.0, "{what}: the reference gradient is zero");
    let worst = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        worst <= tol * scale,
        "{what}: worst {worst} vs scale {scale}"
    );
}

/// Runs `f` on fresh variables made from `inputs`, and returns its output and each input's
/// gradient of `sum(output * weights)`.
fn output_and_grads(
    inputs: &[&Tensor],
    weights: &Tensor,
    f: impl Fn(&[&Tensor]) -> Tensor,
) -> (Tensor, Vec<Tensor>) {
    let vars: Vec<Var> = inputs
        .iter()
        .map(|t| Var::from_tensor(t).unwrap())
        .collect();
    let ts: Vec<&Tensor> = vars.iter().map(|v| v.as_tensor()).collect();
    let out = f(&ts);
    let grads = (&out * weights)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let g = ts.iter().map(|t| grads.get(t).unwrap().clone()).collect();
    (out, g)
}

fn compare(
    names: &[&str],
    inputs: &[&Tensor],
    out_shape: &[usize],
    ours: impl Fn(&[&Tensor]) -> Tensor,
    theirs: impl Fn(&[&Tensor]) -> Tensor,
) {
    let weights = randn(out_shape, 1.0);
    let (a, ga) = output_and_grads(inputs, &weights, ours);
    let (b, gb) = output_and_grads(inputs, &weights, theirs);
    close("output", &a, &b, 1e-5);
    for ((name, x), y) in names.iter().zip(&ga).zip(&gb) {
        close_rel(name, x, y, 1e-4);
    }
}

#[test]
fn rms_norm_equals_candles_ops() {
    // Rows of 24 are whole chunks of the kernel's eight partial sums; rows of 13 end in a tail.
    for d in [24, 13] {
        let x = randn(&[3, 5, d], 2.0);
        let w = randn(&[d], 1.0);
        let eps = 1e-6;
        compare(
            &["x", "weight"],
            &[&x, &w],
            &[3, 5, d],
            |t| rms_norm::rms_norm(t[0], t[1], eps).unwrap(),
            |t| {
                let inv = (t[0].sqr().unwrap().mean_keepdim(D::Minus1).unwrap() + eps)
                    .unwrap()
                    .sqrt()
                    .unwrap()
                    .recip()
                    .unwrap();
                t[0].broadcast_mul(&inv)
                    .unwrap()
                    .broadcast_mul(t[1])
                    .unwrap()
            },
        );
    }
}

/// The residual's gradient added as the backward writes dx equals the backward followed by a sum
/// of its own, bit for bit (each element is one addition after the same dx), over more rows than
/// one of the kernel's blocks so that blocks past the first find their part of `plus`; dw is
/// unchanged by it. Adding zeros would pass unchanged code, so `plus` is random.
#[test]
fn rms_norm_backward_plus_equals_the_backward_then_a_sum() {
    for d in [24, 13] {
        let x = randn(&[7, 11, d], 2.0);
        let w = randn(&[d], 1.0);
        let dy = randn(&[7, 11, d], 1.0);
        let plus = randn(&[7, 11, d], 1.0);
        let (dx, dw) = rms_norm::rms_norm_backward(&x, &w, &dy, 1e-6).unwrap();
        let (dx_plus, dw_plus) =
            rms_norm::rms_norm_backward_plus(&x, &w, &dy, 1e-6, &plus).unwrap();
        let bits = |t: &Tensor| values(t).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&dx_plus),
            bits(&(&dx + &plus).unwrap()),
            "dx + plus, d {d}"
        );
        assert_eq!(bits(&dw_plus), bits(&dw), "dw, d {d}");
        let wrong = randn(&[7, 11, d + 1], 1.0);
        let err = rms_norm::rms_norm_backward_plus(&x, &w, &dy, 1e-6, &wrong).unwrap_err();
        assert!(err.to_string().contains("rms_norm"), "{err}");
    }
}

#[test]
fn rope_equals_rotate_half_and_its_backward_rotates_back() {
    // 21 (batch, position) rows: more than one of the kernel's blocks of 16, the last one short.
    let (b, t, h, d) = (3, 7, 3, 8);
    let x = randn(&[b, t, h, d], 1.0);
    let angles = randn(&[b, t, d / 2], 3.0);
    let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
    compare(
        &["x"],
        &[&x],
        &[b, t, h, d],
        |v| rope::rope(v[0], &cos, &sin).unwrap(),
        |v| {
            // The transformer's reference: rotate_half on (b, h, t, d).
            let x = v[0].transpose(1, 2).unwrap();
            let c = Tensor::cat(&[&cos, &cos], D::Minus1)
                .unwrap()
                .unsqueeze(1)
                .unwrap();
            let s = Tensor::cat(&[&sin, &sin], D::Minus1)
                .unwrap()
                .unsqueeze(1)
                .unwrap();
            let x1 = x.narrow(D::Minus1, 0, d / 2).unwrap();
            let x2 = x.narrow(D::Minus1, d / 2, d / 2).unwrap();
            let rot = Tensor::cat(&[&x2.neg().unwrap(), &x1], D::Minus1).unwrap();
            let y = (x.broadcast_mul(&c).unwrap() + rot.broadcast_mul(&s).unwrap()).unwrap();
            y.transpose(1, 2).unwrap()
        },
    );
    // No heads: an empty result, not a panic.
    let none = Tensor::zeros((b, t, 0, d), candle_core::DType::F32, &Device::Cpu).unwrap();
    let y = rope::rope(&none, &cos, &sin).unwrap();
    assert_eq!(y.dims(), [b, t, 0, d]);
}

/// Head dims whose halves are whole vectors (32 and 64: AVX2's 8 lanes, AVX-512's 16) take the
/// kernel's vector loop, the others (12) its element loop: both give, bit for bit, the formula
/// computed here element by element, `x1 c - x2 (sign s)` and `x2 c + x1 (sign s)`, forward
/// (sign 1) and backward (sign -1).
#[test]
fn rope_in_vectors_and_elements_gives_the_formulas_bits() {
    for d in [32, 64, 12] {
        let (b, t, h) = (2, 5, 3);
        let half = d / 2;
        let x = randn(&[b, t, h, d], 1.0);
        let angles = randn(&[b, t, half], 3.0);
        let (cos, sin) = (angles.cos().unwrap(), angles.sin().unwrap());
        let (xv, cv, sv) = (values(&x), values(&cos), values(&sin));
        for (sign, got) in [
            (1f32, rope::rope(&x, &cos, &sin).unwrap()),
            (-1f32, rope::rope_backward(&x, &cos, &sin).unwrap()),
        ] {
            let mut want = vec![0f32; xv.len()];
            for (head, (y, x)) in want.chunks_mut(d).zip(xv.chunks(d)).enumerate() {
                let pos = head / h;
                let (c, s) = (&cv[pos * half..][..half], &sv[pos * half..][..half]);
                for k in 0..half {
                    let sk = sign * s[k];
                    y[k] = x[k] * c[k] - x[half + k] * sk;
                    y[half + k] = x[half + k] * c[k] + x[k] * sk;
                }
            }
            let got: Vec<u32> = values(&got).iter().map(|v| v.to_bits()).collect();
            let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "head dim {d}, sign {sign}");
        }
    }
}

#[test]
fn swiglu_equals_silu_times_up() {
    // Large gates reach both tails of the sigmoid.
    let g = randn(&[4, 3, 33], 6.0);
    let u = randn(&[4, 3, 33], 1.0);
    compare(
        &["gate", "up"],
        &[&g, &u],
        &[4, 3, 33],
        |t| swiglu::swiglu(t[0], t[1]).unwrap(),
        |t| (t[0].silu().unwrap() * t[1]).unwrap(),
    );
}

/// The output made with the gradients is the forward's, and the gradients are the backward's
/// alone, bit for bit: one sigmoid serves the three, in the same operations' order. Sizes span
/// several of the kernel's parallel chunks with a tail past the last whole vector, and one under
/// a vector, whose elements all take the scalar path.
#[test]
fn swiglu_backward_and_output_equal_the_forward_and_the_backward_bit_for_bit() {
    let bits = |t: &Tensor| -> Vec<u32> { values(t).iter().map(|v| v.to_bits()).collect() };
    for dims in [vec![3, 2, 4099], vec![5]] {
        let g = randn(&dims, 6.0);
        let u = randn(&dims, 1.0);
        let dy = randn(&dims, 1.0);
        let (y, dg, du) = swiglu::swiglu_backward_and_output(&g, &u, &dy).unwrap();
        let (want_dg, want_du) = swiglu::swiglu_backward(&g, &u, &dy).unwrap();
        assert_eq!(y.dims(), &dims[..]);
        assert_eq!(
            bits(&y),
            bits(&swiglu::swiglu(&g, &u).unwrap()),
            "{dims:?}: y"
        );
        assert_eq!(bits(&dg), bits(&want_dg), "{dims:?}: d gate");
        assert_eq!(bits(&du), bits(&want_du), "{dims:?}: d up");
    }
}

/// The transformer's attention in candle's ops, on the fused kernel's (b, t, heads, hd) layout.
fn attention_reference(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Tensor, scale: f64) -> Tensor {
    let (b, t, nh, hd) = q.dims4().unwrap();
    let nkv = k.dim(2).unwrap();
    let q = q.transpose(1, 2).unwrap().contiguous().unwrap();
    let q = q.reshape((b, nkv, (nh / nkv) * t, hd)).unwrap();
    let k = k.transpose(1, 2).unwrap().contiguous().unwrap();
    let v = v.transpose(1, 2).unwrap().contiguous().unwrap();
    let scores = (q.matmul(&k.t().unwrap()).unwrap() * scale).unwrap();
    let probs = candle_nn::ops::softmax(&scores.broadcast_add(mask).unwrap(), D::Minus1).unwrap();
    probs
        .matmul(&v)
        .unwrap()
        .reshape((b, nh, t, hd))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .reshape((b, t, nh * hd))
        .unwrap()
}

#[test]
fn attention_equals_candles_ops_with_padding_groups_and_a_past() {
    // 3 rows with left padding from column 0, 2 and 6 (with 4 queries after 2 earlier columns,
    // the third row is padding only: uniform probabilities, which the reference gives too), 6
    // query heads on 2 kv heads, and earlier key columns so that keys outnumber queries. Head
    // dims: 8 and 12 (one vector, a vector and a tail), 16 and 48 (two vectors after any blocks
    // of four, in AVX2's 8 lanes; 48 is one block of two and one vector in AVX-512's 16), and 32
    // and 64, which the kernel compiles with the head dim as a constant. Keys: 6 (a softmax row
    // of a tail only), 18 and 27 (rows of two and three vectors and a tail, behind 9 and 7
    // queries), and 10 behind a single query (a decode step's shape, here through the backward
    // too).
    for hd in [8, 12, 16, 32, 48, 64] {
        for (t, past) in [(4, 2), (9, 9), (7, 20), (1, 9)] {
            let (b, nh, nkv) = (3, 6, 2);
            let mask = attention_mask(&[0, 2, 6], past, t, nh / nkv);
            compare_attention((b, t, past + t), (nh, nkv, hd), &mask);
        }
    }
}

/// The fused attention against candle's ops on random operands: `b` rows of `t` queries and `tk`
/// keys, `nh` query heads on `nkv` kv heads of `hd`, under `mask`.
fn compare_attention(
    (b, t, tk): (usize, usize, usize),
    (nh, nkv, hd): (usize, usize, usize),
    mask: &Tensor,
) {
    let q = randn(&[b, t, nh, hd], 1.0);
    let k = randn(&[b, tk, nkv, hd], 1.0);
    let v = randn(&[b, tk, nkv, hd], 1.0);
    let scale = 1.0 / (hd as f64).sqrt();
    compare(
        &["q", "k", "v"],
        &[&q, &k, &v],
        &[b, t, nh * hd],
        |x| attention::attention(x[0], x[1], x[2], mask, scale).unwrap(),
        |x| attention_reference(x[0], x[1], x[2], mask, scale),
    );
}

/// Masks whose open keys are a run in the middle of the row (sequences packed side by side, each
/// attending only to itself) or have holes in that run: the kernel visits only the keys from a
/// query's first open key to its last, and must still skip a masked key between them. Row 0
/// packs sequences of 4, 3 and 2 tokens; row 1 is causal with key 2 masked for every query
/// after it (a query whose only open key is itself still gets probability 1 there).
#[test]
fn attention_equals_candles_ops_over_packed_sequences_and_holes() {
    let (b, t, nh, nkv) = (2, 9, 4, 2);
    let starts = [0, 0, 0, 0, 4, 4, 4, 7, 7];
    let open = |n: usize, i: usize, j: usize| match n {
        0 => starts[i] <= j && j <= i,
        _ => j <= i && (j != 2 || i == 2),
    };
    let mut data = vec![];
    for n in 0..b {
        for _ in 0..nh / nkv {
            for i in 0..t {
                data.extend((0..t).map(|j| if open(n, i, j) { 0f32 } else { -1e9 }));
            }
        }
    }
    let mask = Tensor::from_vec(data, (b, 1, (nh / nkv) * t, t), &Device::Cpu).unwrap();
    for hd in [8, 32] {
        compare_attention((b, t, t), (nh, nkv, hd), &mask);
    }
}

#[test]
fn bad_shapes_are_errors_naming_the_kernel() {
    let x = randn(&[2, 3, 4], 1.0);
    let err = rms_norm::rms_norm(&x, &randn(&[5], 1.0), 1e-6).unwrap_err();
    assert!(err.to_string().contains("fused rms_norm"), "{err}");
    let mask = attention_mask(&[0], 0, 3, 2);
    let q = randn(&[1, 3, 2, 4], 1.0);
    let k = randn(&[1, 3, 2, 4], 1.0);
    let err = attention::attention(&q, &k, &k, &mask, 1.0).unwrap_err();
    assert!(err.to_string().contains("fused attention: mask"), "{err}");
    // Empty heads are refused, not divided by.
    let empty = randn(&[1, 3, 2, 1], 1.0).narrow(3, 0, 0).unwrap();
    let err = attention::attention(&empty, &empty, &empty, &mask, 1.0).unwrap_err();
    assert!(err.to_string().contains("fused attention"), "{err}");
    let no_angles = randn(&[1, 3, 1], 1.0).narrow(2, 0, 0).unwrap();
    let err = rope::rope(&empty, &no_angles, &no_angles).unwrap_err();
    assert!(err.to_string().contains("fused rope"), "{err}");
}

/// Keys and values in any layout give the same result: views the kernel cannot read row by row
/// (here transposed, and keys and values with different strides) are copied first.
#[test]
fn attention_takes_keys_and_values_in_any_layout() {
    let (b, t, nh, nkv, hd) = (2, 3, 4, 2, 8);
    let mask = attention_mask(&[0, 1], 0, t, nh / nkv);
    let q = randn(&[b, t, nh, hd], 1.0);
    let k = randn(&[b, t, nkv, hd], 1.0);
    let v = randn(&[b, t, nkv, hd], 1.0);
    let want = values(&attention::attention(&q, &k, &v, &mask, 0.3).unwrap());
    let k_t = k
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .transpose(1, 2)
        .unwrap();
    assert!(!k_t.is_contiguous());
    let got = values(&attention::attention(&q, &k_t, &v, &mask, 0.3).unwrap());
    assert_eq!(got, want);
    // Keys as a KV cache's view (rows 5 columns apart) beside contiguous values.
    let cache = Tensor::cat(&[&k, &randn(&[b, 2, nkv, hd], 1.0)], 1).unwrap();
    let k_view = cache.narrow(1, 0, t).unwrap();
    assert_ne!(k_view.stride(), v.stride());
    let got = values(&attention::attention(&q, &k_view, &v, &mask, 0.3).unwrap());
    assert_eq!(got, want);
}

/// No keys at all (a mask of zero columns): zeros out, not a slice past the keys' storage (the
/// second KV head's rows start past the end of an empty operand).
#[test]
fn attention_over_no_keys_is_zeros() {
    let (b, t, nh, nkv, hd) = (1, 2, 4, 2, 8);
    let q = randn(&[b, t, nh, hd], 1.0);
    let k = Tensor::zeros((b, 0, nkv, hd), DType::F32, &Device::Cpu).unwrap();
    let mask = Tensor::zeros((b, 1, (nh / nkv) * t, 0), DType::F32, &Device::Cpu).unwrap();
    let out = attention::attention(&q, &k, &k, &mask, 0.3).unwrap();
    assert_eq!(values(&out), vec![0.0; b * t * nh * hd]);
}
