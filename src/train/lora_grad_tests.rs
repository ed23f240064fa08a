//! An adapter attached to a model: the forward computes with `W + s B A`, and training takes
//! gradients of A and B only, the ones the merged weight's gradient gives by the chain rule.

use candle_core::{Device, Tensor};

use crate::model::hf_dir::{init_model, tiny_test_model, tiny_test_options};
use crate::model::lora::{LoraSettings, LoraVars};
use crate::model::{Numerics, Tape, Transformer};
use crate::train::{TrainBatch, response_forward};

const PAIRS: [(&[u32], &[u32]); 3] = [(&[3, 4, 5], &[6, 7]), (&[8], &[9, 3, 4]), (&[5, 5], &[6])];

/// The rows' summed response log-probs, taped, and their gradients.
fn logps_and_grads(model: &Transformer) -> (Vec<f32>, candle_core::backprop::GradStore) {
    logps_and_grads_by(model, Numerics::Differentiable)
}

/// [`logps_and_grads`] with the forward's `numerics`: `Differentiable` takes the fused layers
/// differentiated by hand (`model::layer_grad`), `Reference` candle's ops and its backward.
fn logps_and_grads_by(
    model: &Transformer,
    numerics: Numerics,
) -> (Vec<f32>, candle_core::backprop::GradStore) {
    logps_and_grads_seeded(model, numerics, Tape::default())
}

/// [`logps_and_grads_by`] on `tape` (whose seed draws LoRA dropout's masks).
fn logps_and_grads_seeded(
    model: &Transformer,
    numerics: Numerics,
    mut tape: Tape,
) -> (Vec<f32>, candle_core::backprop::GradStore) {
    let tb = TrainBatch::new(&PAIRS, 0, model.config().kv_groups(), &Device::Cpu).expect("tb");
    let (logp, _) =
        response_forward(model, &tb, 1.0, numerics, false, Some(&mut tape)).expect("forward");
    let rows = logp.sum(1).and_then(|x| x.to_vec1()).expect("rows");
    let grads = tape
        .backward(logp.sum_all().expect("sum"))
        .expect("backward");
    (rows, grads)
}

fn lora(model: &Transformer, targets: &[&str]) -> LoraVars {
    lora_with_dropout(model, targets, 0.0)
}

fn lora_with_dropout(model: &Transformer, targets: &[&str], dropout: f64) -> LoraVars {
    let settings = LoraSettings {
        rank: 2,
        alpha: 4.0,
        dropout,
        target_modules: targets.iter().map(|t| t.to_string()).collect(),
        rslora: false,
    };
    let layers = model.config().num_hidden_layers;
    LoraVars::init(&settings, layers, model.params(), 9, "tiny").expect("init")
}

#[test]
fn a_fresh_adapter_leaves_the_model_as_it_was_and_trains_only_b() {
    let plain = tiny_test_model("0123456789", 32, 4).transformer;
    let (base_rows, _) = logps_and_grads(&plain);
    let adapted = tiny_test_model("0123456789", 32, 4).transformer;
    let l = lora(&adapted, &["q_proj", "down_proj"]);
    let adapted = adapted.with_lora(Some(l.clone()));
    let (rows, grads) = logps_and_grads(&adapted);
    // B is zero: W + s B A is W, to the bit.
    assert_eq!(rows, base_rows);
    // Only the adapter's matrices are variables of the loss; B's gradient is s (dW) Aᵀ,
    // not zero, and A's is s Bᵀ dW = 0.
    for (name, v) in adapted.params().named_vars() {
        assert!(
            grads.get(v.as_tensor()).is_none(),
            "the frozen '{name}' got a gradient"
        );
    }
    let vars = adapted.trainable_vars();
    assert_eq!(vars.len(), 4);
    for (name, v) in &vars {
        let g = grads.get(v.as_tensor()).expect("adapter gradient");
        let norm = g
            .sqr()
            .and_then(|x| x.sum_all())
            .and_then(|x| x.to_scalar::<f32>());
        let norm = norm.expect("norm");
        if name.contains("lora_A") {
            assert_eq!(norm, 0.0, "{name}");
        } else {
            assert!(norm > 0.0, "{name}");
        }
    }
}

/// B made non-zero, so that the adapter changes the model and A gets a gradient.
fn with_nonzero_b(l: &LoraVars) {
    for (_, v) in l.named_vars() {
        if v.dims()[1] == 2 {
            let n = v.elem_count();
            let b: Vec<f32> = (0..n).map(|i| ((i * 5 % 9) as f32 - 4.0) * 0.05).collect();
            v.set(&Tensor::from_vec(b, v.dims(), &Device::Cpu).expect("b"))
                .expect("set");
        }
    }
}

/// The largest difference between two tensors, and the largest magnitude of the second.
fn off_by(got: &Tensor, want: &Tensor) -> (f32, f32) {
    let diff = (got - want)
        .and_then(|d| d.abs())
        .and_then(|d| d.max_all())
        .and_then(|d| d.to_scalar::<f32>())
        .expect("diff");
    let scale = want
        .abs()
        .and_then(|d| d.max_all())
        .and_then(|d| d.to_scalar::<f32>())
        .expect("scale");
    (diff, scale)
}

#[test]
fn the_fused_layers_and_candles_backward_give_an_adapter_the_same_gradients() {
    // Every projection adapted, so that each of the fused backward's seven products takes its
    // adapter's part (the input's gradient through s (dy B) A included: a projection whose
    // correction were lost would change the gradients of the layers below it: two layers, and
    // Qwen3's q/k norms between the projections and attention).
    let mut opts = tiny_test_options("0123456789", 32, 4);
    opts.layers = 2;
    opts.arch = crate::model::Arch::Qwen3;
    let model = init_model(&opts).expect("model").transformer;
    let l = lora(&model, &crate::model::lora::LINEAR_MODULES);
    with_nonzero_b(&l);
    let adapted = model.with_lora(Some(l.clone()));
    let (rows, grads) = logps_and_grads_by(&adapted, Numerics::Differentiable);
    let (ref_rows, ref_grads) = logps_and_grads_by(&adapted, Numerics::Reference);
    for (a, b) in rows.iter().zip(&ref_rows) {
        assert!((a - b).abs() < 1e-5, "{rows:?} vs {ref_rows:?}");
    }
    for (name, v) in adapted.trainable_vars() {
        let got = grads.get(v.as_tensor()).expect("fused gradient");
        let want = ref_grads.get(v.as_tensor()).expect("candle's gradient");
        let (diff, scale) = off_by(got, want);
        assert!(scale > 0.0, "{name}: no gradient");
        assert!(diff <= 1e-4 * scale, "{name}: off by {diff} of {scale}");
    }
}

#[test]
fn an_adapted_model_computes_and_differentiates_as_its_merged_weights() {
    let model = tiny_test_model("0123456789", 32, 4).transformer;
    let l = lora(&model, &["v_proj", "up_proj"]);
    with_nonzero_b(&l);
    let adapted = model.with_lora(Some(l.clone()));
    let (rows, grads) = logps_and_grads(&adapted);

    // The merged model: each adapted W replaced by W + s B A, trained in full.
    let merged = tiny_test_model("0123456789", 32, 4).transformer;
    l.to_adapter().merge_into(merged.params()).expect("merge");
    let (merged_rows, merged_grads) = logps_and_grads(&merged);
    for (a, b) in rows.iter().zip(&merged_rows) {
        assert!((a - b).abs() < 1e-5, "{rows:?} vs {merged_rows:?}");
    }
    // dL/dB = s (dL/dW) Aᵀ and dL/dA = s Bᵀ (dL/dW), with s = 4 / 2.
    for (name, (a, b)) in &l.to_adapter().pairs {
        let w = merged.params().get(name).expect("w");
        let dw = merged_grads.get(w.as_tensor()).expect("dW");
        let want_db = (dw.matmul(&a.t().expect("t")).expect("mm") * 2.0).expect("s");
        let want_da = (b.t().expect("t").matmul(dw).expect("mm") * 2.0).expect("s");
        for (got, want, which) in [
            (grads.get(b).expect("dB"), &want_db, "B"),
            (grads.get(a).expect("dA"), &want_da, "A"),
        ] {
            let (diff, scale) = off_by(got, want);
            assert!(
                diff <= 1e-4 * scale.max(1e-3),
                "{name} d{which}: off by {diff} of {scale}"
            );
        }
    }
}

/// LoRA dropout through the whole model. With p so small that every mask is 1 (to f32), the
/// dropout path — the base's products with the adapter's added apart, and the masked gradients —
/// computes what the merged weights do, in every layer and projection; with p = 0.5 a training
/// forward draws its masks from its tape's seed (the same seed the same numbers, another seed
/// others), and a forward without a tape (scoring, generation) drops nothing.
#[test]
fn lora_dropout_masks_the_adapters_input_in_training_forwards_only() {
    let mut opts = tiny_test_options("0123456789", 32, 4);
    opts.layers = 2;
    let base = || init_model(&opts).expect("model").transformer;
    let all = &crate::model::lora::LINEAR_MODULES;
    let plain = base();
    let l = lora(&plain, all);
    with_nonzero_b(&l);
    let plain = plain.with_lora(Some(l.clone()));
    let (want_rows, want_grads) = logps_and_grads_by(&plain, Numerics::Differentiable);

    let with_p = |p: f64| {
        let model = base();
        let d = lora_with_dropout(&model, all, p);
        d.copy_from(&l).expect("copy");
        model.with_lora(Some(d))
    };
    let tiny = with_p(1e-12);
    let (rows, grads) = logps_and_grads_seeded(&tiny, Numerics::Differentiable, Tape::seeded(1));
    for (a, b) in rows.iter().zip(&want_rows) {
        assert!((a - b).abs() < 1e-5, "{rows:?} vs {want_rows:?}");
    }
    for ((name, v), (_, w)) in tiny.trainable_vars().iter().zip(plain.trainable_vars()) {
        let (diff, scale) = off_by(
            grads.get(v.as_tensor()).expect("dropout path's gradient"),
            want_grads
                .get(w.as_tensor())
                .expect("merged path's gradient"),
        );
        assert!(scale > 0.0, "{name}: no gradient");
        assert!(diff <= 1e-4 * scale, "{name}: off by {diff} of {scale}");
    }

    let half = with_p(0.5);
    let run = |seed| logps_and_grads_seeded(&half, Numerics::Differentiable, Tape::seeded(seed)).0;
    let (one, again, two) = (run(1), run(1), run(2));
    assert_eq!(one, again, "the same seed draws the same masks");
    assert_ne!(one, two, "another seed draws other masks");
    assert!(
        one.iter()
            .zip(&want_rows)
            .any(|(a, b)| (a - b).abs() > 1e-3),
        "dropout changed nothing: {one:?} vs {want_rows:?}"
    );
    // Scoring takes no tape: no dropout, the merged weights' numbers.
    let tb = TrainBatch::new(&PAIRS, 0, half.config().kv_groups(), &Device::Cpu).expect("tb");
    let (scored, _) =
        response_forward(&half, &tb, 1.0, Numerics::Differentiable, false, None).expect("score");
    let (plain_scored, _) =
        response_forward(&plain, &tb, 1.0, Numerics::Differentiable, false, None).expect("score");
    assert_eq!(
        scored
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .expect("v"),
        plain_scored
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .expect("v")
    );
    // A training forward that cannot take the fused layers refuses dropout rather than skip it.
    let mut tape = Tape::seeded(1);
    let e = response_forward(&half, &tb, 1.0, Numerics::Reference, false, Some(&mut tape))
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("model.lora.dropout above 0 trains through the fused CPU layers"),
        "{e}"
    );
}
