//! The device-generic path — candle's ops, which is what a CUDA device runs — against the fused CPU
//! kernels, on the CPU: the same logits for a prefill and cached decode steps (forward), the same
//! response log-probs, entropies and parameter gradients through the training forward (backward),
//! and the same samples and sampling log-probs from the generation engine (generation), to 1e-5
//! in f32, for Qwen2 (q/k/v biases), Qwen3 (q/k norms) and Llama (untied head).
//!
//! The fused kernels are switched off for the whole process (`roll::device::use_kernels`), so this
//! file holds one test: the fused results are computed first, then the generic ones. Nothing else
//! runs in this test binary at the same time.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use candle_core::{Device, Tensor};
use common::model_options;
use roll::device::Kernels;
use roll::model::{Arch, LoadedModel, Numerics, attention_mask, init_model_dir};
use roll::rollout::{Engine, Request, SamplingParams};
use roll::train::batch::{TrainBatch, response_forward};

/// Each parameter's gradient, flattened, by name.
type NamedGrads = Vec<(String, Vec<f32>)>;

/// Everything compared between the two paths, for one model.
struct Outputs {
    /// Logits of the prefill's last position, then of each of three cached decode steps.
    decode_logits: Vec<Vec<f32>>,
    logprobs: Vec<f32>,
    entropy: Vec<f32>,
    grads: NamedGrads,
    /// (id, tokens, sampling log-probs) of each finished request, by id.
    samples: Vec<(u64, Vec<u32>, Vec<f32>)>,
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

/// Prefill a left-padded batch of two rows, then three decode steps through the KV cache.
fn decode_logits(model: &LoadedModel) -> Vec<Vec<f32>> {
    use roll::model::KvCache;
    let m = &model.transformer;
    let dev = m.device().clone();
    let groups = m.config().kv_groups();
    let valid_from = vec![0usize, 2];
    let mut cache = KvCache::new(m.config().num_hidden_layers, valid_from.clone());
    let ids = Tensor::from_vec(vec![4u32, 9, 2, 7, 5, 0, 0, 3, 8, 6], (2, 5), &dev).unwrap();
    let pos = Tensor::from_vec(vec![0u32, 1, 2, 3, 4, 0, 0, 0, 1, 2], (2, 5), &dev).unwrap();
    let mask = attention_mask(&valid_from, 0, 5, groups, &dev).unwrap();
    let h = m
        .forward_hidden(&ids, &pos, &mask, Some(&mut cache), Numerics::Fast)
        .unwrap();
    let mut steps = vec![flat(
        &m.logits(&h.narrow(1, 4, 1).unwrap(), Numerics::Fast)
            .unwrap(),
    )];
    for step in 0..3u32 {
        let ids = Tensor::from_vec(vec![10 + step, 12 + step], (2, 1), &dev).unwrap();
        let pos = Tensor::from_vec(vec![5 + step, 3 + step], (2, 1), &dev).unwrap();
        let mask = attention_mask(&valid_from, 5 + step as usize, 1, groups, &dev).unwrap();
        let h = m
            .forward_hidden(&ids, &pos, &mask, Some(&mut cache), Numerics::Fast)
            .unwrap();
        steps.push(flat(&m.logits(&h, Numerics::Fast).unwrap()));
    }
    steps
}

/// The training forward over a ragged batch, cut per layer as training does, and the gradient of
/// a loss that weights every token's log-prob and entropy differently.
fn training(model: &LoadedModel) -> (Vec<f32>, Vec<f32>, NamedGrads) {
    let m = &model.transformer;
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = (0..5u32)
        .map(|i| {
            let prompt = (0..1 + i % 4).map(|k| 3 + (i * 5 + k) % 18).collect();
            let response = (0..2 + (i * 3) % 5).map(|k| 3 + (i + k * 7) % 18).collect();
            (prompt, response)
        })
        .collect();
    let refs: Vec<(&[u32], &[u32])> = pairs
        .iter()
        .map(|(p, r)| (p.as_slice(), r.as_slice()))
        .collect();
    let batch = TrainBatch::new(&refs, model.pad_id, m.config().kv_groups(), m.device()).unwrap();
    let mut tape = roll::model::Tape::default();
    let (lp, h) = response_forward(
        m,
        &batch,
        0.9,
        Numerics::Differentiable,
        true,
        Some(&mut tape),
    )
    .unwrap();
    let h = h.unwrap();
    let (b, r) = lp.dims2().unwrap();
    let w: Vec<f32> = (0..b * r)
        .map(|i| ((i * 37) % 11) as f32 / 5.0 - 1.0)
        .collect();
    let w = Tensor::from_vec(w, (b, r), m.device()).unwrap();
    let loss = ((&lp * &w).unwrap().sum_all().unwrap()
        + (&h * &w).unwrap().sum_all().unwrap() * 0.3)
        .unwrap();
    let grads = tape.backward(loss).unwrap();
    let named = m
        .params()
        .named_vars()
        .into_iter()
        .map(|(name, var)| (name, flat(grads.get(var.as_tensor()).unwrap())))
        .collect();
    (flat(&lp), flat(&h), named)
}

/// Thirteen seeded requests of ragged prompts through the continuous-batching engine, five slots.
fn generation(model: &LoadedModel) -> Vec<(u64, Vec<u32>, Vec<f32>)> {
    let mut engine = Engine::with_lanes(&model.transformer, vec![5], 5, 1);
    for i in 0..13u64 {
        engine.submit(Request {
            id: i,
            prompt_ids: (0..(1 + i as u32 % 4))
                .map(|k| 3 + (k * 5 + i as u32) % 18)
                .collect(),
            params: SamplingParams {
                temperature: 1.0,
                max_new_tokens: 3 + i as usize % 6,
                ..Default::default()
            },
            seed: 100 + i,
        });
    }
    let mut out = engine.run_to_completion().unwrap();
    out.sort_by_key(|c| c.id);
    out.into_iter()
        .map(|c| (c.id, c.token_ids, c.logprobs))
        .collect()
}

fn outputs(model: &LoadedModel) -> Outputs {
    let (logprobs, entropy, grads) = training(model);
    Outputs {
        decode_logits: decode_logits(model),
        logprobs,
        entropy,
        grads,
        samples: generation(model),
    }
}

fn close(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
            "{what}[{i}]: generic {x} vs fused {y}"
        );
    }
}

#[test]
fn the_generic_path_computes_what_the_fused_kernels_compute() {
    let archs = [Arch::Qwen2, Arch::Qwen3, Arch::Llama];
    let dirs: Vec<_> = archs.iter().map(|_| tempfile::tempdir().unwrap()).collect();
    let models: Vec<LoadedModel> = archs
        .iter()
        .zip(&dirs)
        .map(|(&arch, dir)| {
            let model = init_model_dir(dir.path(), &model_options(arch)).unwrap();
            // Biases start at zero; give them values so that adding them is compared too.
            for (name, var) in model.transformer.params().named_vars() {
                if name.ends_with(".bias") {
                    var.set(&Tensor::randn(0f32, 0.5, var.dims(), &Device::Cpu).unwrap())
                        .unwrap();
                }
            }
            model
        })
        .collect();
    assert_eq!(roll::device::kernels(), Kernels::Auto);
    let fused: Vec<Outputs> = models.iter().map(outputs).collect();
    roll::device::use_kernels(Kernels::Generic);
    assert!(
        !roll_cpu_kernels::enabled(),
        "the switch reaches the kernels"
    );
    let generic: Vec<Outputs> = models.iter().map(outputs).collect();
    roll::device::use_kernels(Kernels::Auto);
    // Two implementations, not one run twice: their sums are taken in other orders, so some
    // values differ in their last bits.
    let bits = |o: &Outputs| -> Vec<u32> {
        o.decode_logits
            .iter()
            .flatten()
            .chain(&o.logprobs)
            .map(|v| v.to_bits())
            .collect()
    };
    assert!(
        generic.iter().zip(&fused).any(|(g, f)| bits(g) != bits(f)),
        "the generic run gave the fused run's bits exactly: the switch did not change the path"
    );
    for ((arch, g), f) in archs.iter().zip(&generic).zip(&fused) {
        for (step, (a, b)) in g.decode_logits.iter().zip(&f.decode_logits).enumerate() {
            close(&format!("{arch:?} decode step {step} logits"), a, b);
        }
        close(&format!("{arch:?} log-probs"), &g.logprobs, &f.logprobs);
        close(&format!("{arch:?} entropy"), &g.entropy, &f.entropy);
        assert_eq!(g.grads.len(), f.grads.len());
        for ((name, a), (_, b)) in g.grads.iter().zip(&f.grads) {
            // Relative to the gradient's largest element: sums over the batch are taken in
            // another order by each path.
            let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!(scale > 0.0, "{arch:?} {name}: no gradient");
            let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            assert!(
                worst <= 1e-5 * scale,
                "{arch:?} {name}: gradient {worst} off the fused one (of {scale})"
            );
        }
        assert_eq!(g.samples.len(), 13);
        for ((id, tokens, lps), (_, f_tokens, f_lps)) in g.samples.iter().zip(&f.samples) {
            assert_eq!(tokens, f_tokens, "{arch:?} request {id}: tokens");
            close(&format!("{arch:?} request {id} log-probs"), lps, f_lps);
        }
    }
}
