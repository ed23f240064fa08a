use candle_core::{Device, Var};

use super::*;

/// The unfused composition the head replaces, from candle's differentiable ops: logits by matmul,
/// scaled, then log-softmax, gather and entropy.
fn reference(hidden: &Tensor, weight: &Tensor, targets: &Tensor, scale: f64) -> (Tensor, Tensor) {
    let (b, s, dim) = hidden.dims3().unwrap();
    let logits = hidden
        .reshape((b * s, dim))
        .unwrap()
        .matmul(&weight.t().unwrap())
        .unwrap()
        .affine(scale, 0.0)
        .unwrap();
    let vocab = weight.dim(0).unwrap();
    crate::logprobs::tests::reference(&logits.reshape((b, s, vocab)).unwrap(), targets)
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// |a - b| <= tol * max |b| elementwise: gradients are compared at the scale of the largest one.
fn close_at_scale(what: &str, a: &Tensor, b: &Tensor, tol: f32) {
    let (a, b) = (flat(a), flat(b));
    assert_eq!(a.len(), b.len(), "{what}");
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert!(scale > 0.0, "{what}: all zero");
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            (x - y).abs() <= tol * scale,
            "{what} {i}: {x} vs {y} (scale {scale})"
        );
    }
}

struct Case {
    hidden: Var,
    weight: Var,
    targets: Tensor,
    /// Per-token weights of the loss `sum(w * lp) + 0.3 sum(w * h)`.
    w: Tensor,
}

fn case(b: usize, s: usize, dim: usize, vocab: usize) -> Case {
    let dev = Device::Cpu;
    let targets: Vec<u32> = (0..b * s).map(|i| ((i * 7 + 3) % vocab) as u32).collect();
    let w: Vec<f32> = (0..b * s)
        .map(|i| ((i * 5) % 7) as f32 / 3.0 - 1.0)
        .collect();
    Case {
        hidden: Var::randn(0f32, 1.0, (b, s, dim), &dev).unwrap(),
        weight: Var::randn(0f32, 0.7, (vocab, dim), &dev).unwrap(),
        targets: Tensor::from_vec(targets, (b, s), &dev).unwrap(),
        w: Tensor::from_vec(w, (b, s), &dev).unwrap(),
    }
}

/// The loss's gradients (hidden, weight) for the log-probs and entropies `lp`, `h`.
fn grads(c: &Case, lp: &Tensor, h: &Tensor) -> (Tensor, Tensor) {
    let loss = ((lp * &c.w).unwrap().sum_all().unwrap()
        + ((h * &c.w).unwrap().sum_all().unwrap() * 0.3).unwrap())
    .unwrap();
    let g = loss.backward().unwrap();
    (
        g.get(c.hidden.as_tensor()).unwrap().clone(),
        g.get(c.weight.as_tensor()).unwrap().clone(),
    )
}

/// Values and gradients against candle's ops, over chunkings that split the vocabulary of 29 into
/// one chunk, chunks of 8 columns (a short last one of 5) and single columns, with and without a
/// temperature.
#[test]
fn values_and_gradients_equal_candles_ops_for_every_chunking() {
    let c = case(2, 3, 16, 29);
    let rows = 6;
    for scale in [1.0, 1.0 / 0.7] {
        let (lp_ref, h_ref) = reference(
            c.hidden.as_tensor(),
            c.weight.as_tensor(),
            &c.targets,
            scale,
        );
        let (gh_ref, gw_ref) = grads(&c, &lp_ref, &h_ref);
        for chunk_values in [rows * 29, rows * 8, rows] {
            let (lp, h) = head_logprobs_in_chunks(
                c.hidden.as_tensor(),
                c.weight.as_tensor(),
                &c.targets,
                scale,
                true,
                chunk_values,
                None,
            )
            .unwrap();
            close_at_scale("log-probs", &lp, &lp_ref, 1e-5);
            close_at_scale("entropy", &h, &h_ref, 1e-5);
            let (gh, gw) = grads(&c, &lp, &h);
            close_at_scale("d hidden", &gh, &gh_ref, 1e-5);
            close_at_scale("d weight", &gw, &gw_ref, 1e-5);
        }
    }
}

/// A frozen (detached) weight takes no gradient, and the hidden states' is the one a variable
/// weight gives: the skipped product only ever fed the weight's.
#[test]
fn a_frozen_weight_takes_no_gradient_and_the_hidden_one_is_unchanged() {
    let c = case(2, 3, 16, 29);
    let run = |weight: &Tensor| {
        let (lp, h) =
            head_logprobs(c.hidden.as_tensor(), weight, &c.targets, 1.0, true, None).unwrap();
        let loss = ((lp * &c.w).unwrap().sum_all().unwrap()
            + ((h * &c.w).unwrap().sum_all().unwrap() * 0.3).unwrap())
        .unwrap();
        loss.backward().unwrap()
    };
    let live = run(c.weight.as_tensor());
    let frozen = run(&c.weight.as_tensor().detach());
    assert!(live.get(c.weight.as_tensor()).is_some());
    assert!(frozen.get(c.weight.as_tensor()).is_none());
    assert_eq!(
        flat(frozen.get(c.hidden.as_tensor()).unwrap()),
        flat(live.get(c.hidden.as_tensor()).unwrap())
    );
}

/// The log-probs are the unfused path's bits: the same matmul, the same scaling, the same rows.
#[test]
fn logprobs_equal_the_unfused_kernels_bit_for_bit() {
    let c = case(3, 4, 24, 50);
    let scale = 1.0 / 0.9;
    let (lp, h) = head_logprobs(
        c.hidden.as_tensor(),
        c.weight.as_tensor(),
        &c.targets,
        scale,
        true,
        None,
    )
    .unwrap();
    let logits = c
        .hidden
        .as_tensor()
        .reshape((12, 24))
        .unwrap()
        .matmul(&c.weight.as_tensor().t().unwrap())
        .unwrap();
    let logits = (logits / 0.9).unwrap().reshape((3, 4, 50)).unwrap();
    let (lp_unfused, h_unfused) =
        crate::logprobs::logprobs_and_entropy(&logits, &c.targets, true).unwrap();
    assert_eq!(flat(&lp), flat(&lp_unfused));
    assert_eq!(flat(&h), flat(&h_unfused));
}

/// Without the entropy, the entropy output is zero and the gradient is the log-probs' alone:
/// the option changes the gradient exactly by the entropy's share.
#[test]
fn without_entropy_the_gradient_is_the_logprobs_alone() {
    let c = case(1, 5, 8, 13);
    let (lp, h) = head_logprobs_in_chunks(
        c.hidden.as_tensor(),
        c.weight.as_tensor(),
        &c.targets,
        1.0,
        false,
        20,
        None,
    )
    .unwrap();
    assert!(flat(&h).iter().all(|&v| v == 0.0));
    let (_, gw) = grads(&c, &lp, &h);
    let (lp_ref, _) = reference(c.hidden.as_tensor(), c.weight.as_tensor(), &c.targets, 1.0);
    let g = (&lp_ref * &c.w)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    close_at_scale("d weight", &gw, g.get(c.weight.as_tensor()).unwrap(), 1e-5);
    let (lp2, h2) = head_logprobs(
        c.hidden.as_tensor(),
        c.weight.as_tensor(),
        &c.targets,
        1.0,
        true,
        None,
    )
    .unwrap();
    let (_, gw_with) = grads(&c, &lp2, &h2);
    let differ = flat(&gw)
        .iter()
        .zip(flat(&gw_with))
        .any(|(a, b)| (a - b).abs() > 1e-4);
    assert!(differ, "the entropy term must change the gradient");
}

/// With a sink, the weight's gradient waits there (the same values) and candle's store has none;
/// a weight that is not a variable passes its gradient through candle as usual.
#[test]
fn a_sink_takes_the_weights_gradient() {
    let c = case(2, 3, 8, 11);
    let run = |sink: Option<&WeightGradSink>, weight: &Tensor| {
        let (lp, h) =
            head_logprobs(c.hidden.as_tensor(), weight, &c.targets, 1.0, true, sink).unwrap();
        let loss = ((&lp * &c.w).unwrap().sum_all().unwrap()
            + ((&h * &c.w).unwrap().sum_all().unwrap() * 0.3).unwrap())
        .unwrap();
        loss.backward().unwrap()
    };
    let plain = run(None, c.weight.as_tensor());
    let sink = WeightGradSink::default();
    let sunk = run(Some(&sink), c.weight.as_tensor());
    assert!(sunk.get(c.weight.as_tensor()).is_none());
    let left = sink.close();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].0.id(), c.weight.as_tensor().id());
    assert_eq!(
        flat(&left[0].1),
        flat(plain.get(c.weight.as_tensor()).unwrap())
    );
    assert_eq!(
        flat(sunk.get(c.hidden.as_tensor()).unwrap()),
        flat(plain.get(c.hidden.as_tensor()).unwrap())
    );
    // Closed, the sink hands later gradients back to candle.
    let after = run(Some(&sink), c.weight.as_tensor());
    assert!(sink.close().is_empty());
    assert_eq!(
        flat(after.get(c.weight.as_tensor()).unwrap()),
        flat(plain.get(c.weight.as_tensor()).unwrap())
    );
    // A derived weight (here a scaled copy of the variable) keeps candle's path to the variable.
    let open = WeightGradSink::default();
    let derived = (c.weight.as_tensor() * 1.0).unwrap();
    let through = run(Some(&open), &derived);
    assert!(open.close().is_empty());
    assert!(through.get(c.weight.as_tensor()).is_some());
}

/// Bad operands are errors that say what is wrong, not panics.
#[test]
fn bad_operands_are_named() {
    let dev = Device::Cpu;
    let hidden = Tensor::zeros((1, 2, 4), DType::F32, &dev).unwrap();
    let weight = Tensor::zeros((6, 4), DType::F32, &dev).unwrap();
    let far = Tensor::new(&[[1u32, 6]], &dev).unwrap();
    let err = head_logprobs(&hidden, &weight, &far, 1.0, false, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("target 6 is outside the vocabulary of 6"),
        "{err}"
    );
    let narrow = Tensor::zeros((6, 3), DType::F32, &dev).unwrap();
    let ok_targets = Tensor::new(&[[1u32, 2]], &dev).unwrap();
    assert!(head_logprobs(&hidden, &narrow, &ok_targets, 1.0, false, None).is_err());
    let few = Tensor::new(&[[1u32]], &dev).unwrap();
    let err = head_logprobs(&hidden, &weight, &few, 1.0, false, None)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("targets [1, 1] for hidden states [1, 2, 4]"),
        "{err}"
    );
    // The right count in the wrong shape is refused too.
    let flat = Tensor::new(&[1u32, 2], &dev).unwrap();
    assert!(head_logprobs(&hidden, &weight, &flat, 1.0, false, None).is_err());
}

/// A bf16 weight, read as stored: the values and the hidden states' gradient of its widened f32
/// copy bit for bit, its own gradient that copy's rounded to bf16 (through candle) or in f32 as
/// made (through a sink), over chunks that split the vocabulary.
#[test]
fn a_bf16_weight_gives_the_results_of_its_widened_copy() {
    let c = case(2, 3, 8, 11);
    let w16 = Var::from_tensor(&c.weight.as_tensor().to_dtype(DType::BF16).unwrap()).unwrap();
    let wide = Var::from_tensor(&w16.as_tensor().to_dtype(DType::F32).unwrap()).unwrap();
    assert!(applies(c.hidden.as_tensor(), w16.as_tensor()));
    let run = |weight: &Var, sink: Option<&WeightGradSink>| {
        let (lp, h) = head_logprobs_in_chunks(
            c.hidden.as_tensor(),
            weight.as_tensor(),
            &c.targets,
            0.8,
            true,
            2 * 3 * 4,
            sink,
        )
        .unwrap();
        let loss = ((&lp * &c.w).unwrap().sum_all().unwrap()
            + ((&h * &c.w).unwrap().sum_all().unwrap() * 0.3).unwrap())
        .unwrap();
        let g = loss.backward().unwrap();
        let dh = g.get(c.hidden.as_tensor()).unwrap().clone();
        (
            flat(&lp),
            flat(&h),
            flat(&dh),
            g.get(weight.as_tensor()).cloned(),
        )
    };
    let (lp, h, dh, dw16) = run(&w16, None);
    let (lp_w, h_w, dh_w, dw) = run(&wide, None);
    assert!(
        lp == lp_w && h == h_w && dh == dh_w,
        "values or the hidden gradient"
    );
    let (dw16, dw) = (dw16.unwrap(), dw.unwrap());
    assert_eq!(dw16.dtype(), DType::BF16);
    let rounded = dw
        .to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    assert_eq!(flat(&dw16.to_dtype(DType::F32).unwrap()), flat(&rounded));
    // Through a sink the gradient stays as made, in f32.
    let sink = WeightGradSink::default();
    let (.., none) = run(&w16, Some(&sink));
    assert!(none.is_none());
    let left = sink.close();
    assert_eq!(left[0].0.id(), w16.as_tensor().id());
    assert_eq!(flat(&left[0].1), flat(&dw));
}
