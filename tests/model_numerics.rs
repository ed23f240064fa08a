//! Model numerics through the real load path: KV-cache decoding equals full recomputation, generation
//! log-probs equal training log-probs, save/load round-trips, and broken directories give clear errors.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use common::model_options;

use candle_core::{Device, Tensor};
use roll::model::hf_dir::InitOptions;
use roll::model::{Arch, Numerics, attention_mask, init_model_dir, load_model_dir};
use roll::rollout::{Request, SamplingParams, generate};
use roll::train::batch::{TrainBatch, response_forward};

/// (prompt, response) pairs as a training batch of `model`.
fn batch_of(model: &roll::model::LoadedModel, pairs: &[(Vec<u32>, Vec<u32>)]) -> TrainBatch {
    let pairs: Vec<(&[u32], &[u32])> = pairs
        .iter()
        .map(|(p, r)| (p.as_slice(), r.as_slice()))
        .collect();
    let groups = model.transformer.config().kv_groups();
    TrainBatch::new(&pairs, model.pad_id, groups, &Device::Cpu).unwrap()
}

/// Every parameter's gradient in `grads`, flattened, with its name, in the store's order.
fn named_grads(
    model: &roll::model::Transformer,
    grads: &candle_core::backprop::GradStore,
) -> Vec<(String, Vec<f32>)> {
    model
        .params()
        .named_vars()
        .into_iter()
        .map(|(name, var)| {
            let g = grads.get(var.as_tensor()).unwrap();
            (name, g.flatten_all().unwrap().to_vec1::<f32>().unwrap())
        })
        .collect()
}

/// The largest |a - b| over the elements, and the largest |b|.
fn worst_and_scale(a: &[f32], b: &[f32]) -> (f32, f32) {
    let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    (worst, b.iter().fold(0f32, |m, v| m.max(v.abs())))
}

/// Logits of the last position for one unpadded sequence, computed without any cache.
fn full_last_logits(model: &roll::model::Transformer, ids: &[u32]) -> Vec<f32> {
    let dev = Device::Cpu;
    let t = ids.len();
    let x = Tensor::from_vec(ids.to_vec(), (1, t), &dev).unwrap();
    let pos = Tensor::from_vec((0..t as u32).collect::<Vec<_>>(), (1, t), &dev).unwrap();
    let mask = attention_mask(&[0], 0, t, model.config().kv_groups(), &dev).unwrap();
    let h = model
        .forward_hidden(&x, &pos, &mask, None, Numerics::Differentiable)
        .unwrap();
    let logits = model
        .logits(&h.narrow(1, t - 1, 1).unwrap(), Numerics::Differentiable)
        .unwrap();
    logits.flatten_all().unwrap().to_vec1().unwrap()
}

/// The largest difference between the log-probs recorded at generation and those the training
/// forward pass computes for the same tokens.
fn worst_logprob_gap(
    model: &roll::model::LoadedModel,
    out: &[roll::rollout::Completion],
    temperature: f64,
) -> f32 {
    let m = &model.transformer;
    let pairs: Vec<(&[u32], &[u32])> = out
        .iter()
        .map(|c| (c.prompt_ids.as_slice(), c.token_ids.as_slice()))
        .collect();
    let batch =
        TrainBatch::new(&pairs, model.pad_id, m.config().kv_groups(), &Device::Cpu).unwrap();
    let (logp, _) = response_forward(
        m,
        &batch,
        temperature,
        Numerics::Differentiable,
        false,
        None,
    )
    .unwrap();
    let logp = logp.to_vec2::<f32>().unwrap();
    let mut worst = 0f32;
    for (row, c) in out.iter().enumerate() {
        for (k, lp) in c.logprobs.iter().enumerate() {
            worst = worst.max((logp[row][k] - lp).abs());
        }
    }
    worst
}

#[test]
fn kv_cache_decoding_matches_full_recomputation_for_every_arch() {
    for arch in [Arch::Qwen2, Arch::Qwen3, Arch::Llama] {
        let dir = tempfile::tempdir().unwrap();
        let model = init_model_dir(dir.path(), &model_options(arch)).unwrap();
        let m = &model.transformer;
        // Ragged prompts decoded together (continuous batching with max_batch 2 forces left padding
        // and row removal), greedy so that the tokens are a deterministic function of the logits.
        let prompts: Vec<Vec<u32>> = vec![vec![5, 6, 7, 8, 9, 10], vec![11, 12], vec![3, 4, 5]];
        let params = SamplingParams {
            temperature: 0.0,
            max_new_tokens: 6,
            ..Default::default()
        };
        let reqs = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| Request {
                id: i as u64,
                prompt_ids: p.clone(),
                params: params.clone(),
                seed: 1,
            })
            .collect();
        let out = generate(m, &[], reqs, 2, None).unwrap();
        for (prompt, c) in prompts.iter().zip(&out) {
            assert_eq!(c.token_ids.len(), 6);
            let mut ids = prompt.clone();
            for (k, &tok) in c.token_ids.iter().enumerate() {
                let logits = full_last_logits(m, &ids);
                let best = logits
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .unwrap()
                    .0;
                assert_eq!(best as u32, tok, "{arch:?} prompt {prompt:?} token {k}");
                let max = logits.iter().copied().fold(f32::MIN, f32::max);
                let lse = max + logits.iter().map(|l| (l - max).exp()).sum::<f32>().ln();
                assert!(
                    (logits[tok as usize] - lse - c.logprobs[k]).abs() < 1e-4,
                    "{arch:?} logprob {k}"
                );
                ids.push(tok);
            }
        }
    }
}

#[test]
fn sampled_logprobs_equal_training_logprobs() {
    let dir = tempfile::tempdir().unwrap();
    let model = init_model_dir(dir.path(), &model_options(Arch::Qwen2)).unwrap();
    let m = &model.transformer;
    let params = SamplingParams {
        temperature: 0.7,
        top_k: 5,
        max_new_tokens: 10,
        ..Default::default()
    };
    let reqs = (0..6u64)
        .map(|i| Request {
            id: i,
            prompt_ids: (0..(2 + i as u32 % 4))
                .map(|k| 3 + (k + i as u32) % 18)
                .collect(),
            params: params.clone(),
            seed: 100 + i,
        })
        .collect();
    let out = generate(m, &model.eos_ids, reqs, 4, None).unwrap();
    let worst = worst_logprob_gap(&model, &out, 0.7);
    assert!(
        worst <= 1e-4,
        "max |train - generation| log-prob difference {worst}"
    );
}

#[test]
fn saved_directory_loads_back_with_identical_logits() {
    let dir = tempfile::tempdir().unwrap();
    let model = init_model_dir(dir.path(), &model_options(Arch::Qwen3)).unwrap();
    let again = load_model_dir(dir.path(), None, &Device::Cpu).unwrap();
    let ids = [4u32, 9, 2, 7];
    assert_eq!(
        full_last_logits(&model.transformer, &ids),
        full_last_logits(&again.transformer, &ids)
    );
    assert_eq!(again.eos_ids, vec![1]);
    assert_eq!(
        again.tokenizer.tokenizer.get_vocab_size(true),
        model.config().vocab_size
    );
}

#[test]
fn broken_directories_name_the_file_and_tensor() {
    let dir = tempfile::tempdir().unwrap();
    init_model_dir(dir.path(), &model_options(Arch::Qwen2)).unwrap();
    let weights = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();

    // Truncated file.
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    let err = load_model_dir(dir.path(), None, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("model.safetensors"), "{err}");

    // Config that disagrees with the weights: every mismatch is listed by tensor name.
    std::fs::write(&weights, &bytes).unwrap();
    let cfg_path = dir.path().join("config.json");
    let cfg = std::fs::read_to_string(&cfg_path).unwrap();
    std::fs::write(
        &cfg_path,
        cfg.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3"),
    )
    .unwrap();
    let err = load_model_dir(dir.path(), None, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("missing tensor 'model.layers.2.self_attn.q_proj.weight'"),
        "{err}"
    );

    // Missing config.
    std::fs::remove_file(&cfg_path).unwrap();
    let err = load_model_dir(dir.path(), None, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("config.json"), "{err}");
}

#[test]
fn bfloat16_models_run_and_stay_close_to_float32() {
    let mut o = model_options(Arch::Qwen2);
    let dir32 = tempfile::tempdir().unwrap();
    let m32 = init_model_dir(dir32.path(), &o).unwrap();
    o.dtype = "bfloat16".into();
    let dir16 = tempfile::tempdir().unwrap();
    init_model_dir(dir16.path(), &o).unwrap();
    let m16 = load_model_dir(dir16.path(), None, &Device::Cpu).unwrap();
    assert_eq!(m16.transformer.dtype(), candle_core::DType::BF16);
    let ids = [4u32, 9, 2, 7, 11];
    let (a, b) = (
        full_last_logits(&m32.transformer, &ids),
        full_last_logits(&m16.transformer, &ids),
    );
    // Same seeded weights rounded to bf16 (8-bit mantissa): logits agree to a few 1e-2.
    let worst = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(
        b.iter().all(|x| x.is_finite()) && worst < 0.05,
        "max |f32 - bf16| logit difference {worst}"
    );
    let params = SamplingParams {
        temperature: 0.0,
        max_new_tokens: 4,
        ..Default::default()
    };
    let req = Request {
        id: 0,
        prompt_ids: ids.to_vec(),
        params,
        seed: 0,
    };
    let out = generate(&m16.transformer, &[], vec![req], 1, None).unwrap();
    assert_eq!(out[0].token_ids.len(), 4);
}

#[test]
fn aborting_requests_mid_generation_keeps_the_others_exact() {
    let dir = tempfile::tempdir().unwrap();
    let model = init_model_dir(dir.path(), &model_options(Arch::Qwen2)).unwrap();
    let m = &model.transformer;
    let params = SamplingParams {
        temperature: 1.0,
        max_new_tokens: 8,
        ..Default::default()
    };
    let mut engine = roll::rollout::Engine::new(m, vec![], 3);
    for i in 0..6u64 {
        engine.submit(Request {
            id: i,
            prompt_ids: (0..(2 + i as u32 % 3))
                .map(|k| 3 + (k + i as u32) % 18)
                .collect(),
            params: params.clone(),
            seed: 7 + i,
        });
    }
    // Requests 0-2 are decoding, 3-5 queued: cancel one of each.
    let mut done = engine.step().unwrap();
    done.extend(engine.step().unwrap());
    assert!(
        done.is_empty(),
        "no EOS ids: nothing finishes before 8 tokens"
    );
    assert_eq!(engine.abort(|id| id == 1 || id == 4).unwrap(), 2);
    assert_eq!((engine.running(), engine.queued()), (2, 2));
    let out = engine.run_to_completion().unwrap();
    let mut ids: Vec<u64> = out.iter().map(|c| c.id).collect();
    ids.sort();
    assert_eq!(ids, [0, 2, 3, 5]);
    assert!(out.iter().all(|c| c.token_ids.len() == 8));
    // The survivors' KV-cache rows stayed with them: generation log-probs equal training ones.
    let worst = worst_logprob_gap(&model, &out, 1.0);
    assert!(
        worst <= 1e-4,
        "max |train - generation| log-prob difference {worst}"
    );
}

/// The fused CPU kernels (the `Differentiable` path in f32 on the CPU) against candle's ops (the
/// `Reference` path, which the transformer ran before and still runs off the CPU): the same
/// log-probs and entropies, and the same gradient for every parameter, for each architecture
/// (Qwen2 with q/k/v biases, Qwen3 with q/k norms, Llama with an untied head), on a ragged batch
/// with left and right padding.
#[test]
fn fused_kernels_give_the_reference_logprobs_and_gradients() {
    for arch in [Arch::Qwen2, Arch::Qwen3, Arch::Llama] {
        let dir = tempfile::tempdir().unwrap();
        let model = init_model_dir(dir.path(), &model_options(arch)).unwrap();
        let m = &model.transformer;
        let pairs: Vec<(Vec<u32>, Vec<u32>)> = (0..5u32)
            .map(|i| {
                let prompt = (0..1 + i % 4).map(|k| 3 + (i * 5 + k) % 18).collect();
                let response = (0..2 + (i * 3) % 5).map(|k| 3 + (i + k * 7) % 18).collect();
                (prompt, response)
            })
            .collect();
        let batch = batch_of(&model, &pairs);
        // `taped`: the forward cut after every layer and differentiated piece by piece
        // (`roll::model::Tape`), as training does.
        let run = |numerics: Numerics, taped: bool| {
            let mut tape = roll::model::Tape::default();
            let tape_arg = if taped { Some(&mut tape) } else { None };
            let (lp, h) = response_forward(m, &batch, 0.9, numerics, true, tape_arg).unwrap();
            let h = h.unwrap();
            // A loss that weights every token's log-prob and entropy differently.
            let (b, r) = lp.dims2().unwrap();
            let w: Vec<f32> = (0..b * r)
                .map(|i| ((i * 37) % 11) as f32 / 5.0 - 1.0)
                .collect();
            let w = Tensor::from_vec(w, (b, r), &Device::Cpu).unwrap();
            let loss = ((&lp * &w).unwrap().sum_all().unwrap()
                + (&h * &w).unwrap().sum_all().unwrap() * 0.3)
                .unwrap();
            let grads = if taped {
                assert_eq!(
                    tape.len(),
                    m.config().num_hidden_layers,
                    "one cut per layer"
                );
                tape.backward(loss).unwrap()
            } else {
                loss.backward().unwrap()
            };
            let named = named_grads(m, &grads);
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            (flat(&lp), flat(&h), named)
        };
        let fused = run(Numerics::Differentiable, false);
        let reference = run(Numerics::Reference, false);
        // Cutting the graph changes no bit of the values, on either path. On candle's ops it
        // changes no bit of the gradients either (tied embeddings included: Qwen2 and Qwen3
        // here); on the fused kernels the tape differentiates each layer by hand
        // (`model::layer_grad`), which must give candle's backward of the same forward but for
        // sums taken in another order.
        for (numerics, whole) in [
            (Numerics::Differentiable, &fused),
            (Numerics::Reference, &reference),
        ] {
            let cut = run(numerics, true);
            assert!(
                cut.0 == whole.0 && cut.1 == whole.1,
                "{arch:?} {numerics:?}: values"
            );
            for ((name, a), (_, b)) in cut.2.iter().zip(&whole.2) {
                if numerics == Numerics::Reference {
                    assert!(
                        a == b,
                        "{arch:?} {numerics:?} {name}: the taped gradient differs"
                    );
                    continue;
                }
                let (worst, scale) = worst_and_scale(a, b);
                assert!(
                    worst <= 1e-6 * scale,
                    "{arch:?} {name}: the hand-differentiated layers' gradient is {worst} off candle's (of {scale})"
                );
            }
        }
        let (lp, h, grads) = fused;
        let (lp_ref, h_ref, grads_ref) = reference;
        for (what, a, b) in [("log-probs", &lp, &lp_ref), ("entropy", &h, &h_ref)] {
            for (x, y) in a.iter().zip(b.iter()) {
                assert!(
                    (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                    "{arch:?} {what}: {x} vs {y}"
                );
            }
        }
        assert_eq!(grads.len(), grads_ref.len());
        for ((name, g), (_, g_ref)) in grads.iter().zip(&grads_ref) {
            let (worst, scale) = worst_and_scale(g, g_ref);
            assert!(scale > 0.0, "{arch:?} {name}: no gradient");
            assert!(
                worst <= 1e-4 * scale,
                "{arch:?} {name}: worst {worst} of {scale}"
            );
        }
    }
}

/// One loss over two forwards on one tape (a preference pair's chosen and rejected), through the
/// hand-differentiated layers: each weight's gradient is the sum of both forwards', as candle's
/// backward of the same two forwards gives it (to 1e-6 of its largest value). A layer that added
/// its second forward's part in place of the first's, or dropped it, would be off by a whole part.
#[test]
fn two_forwards_on_one_tape_sum_their_layers_gradients() {
    let dir = tempfile::tempdir().unwrap();
    let model = init_model_dir(dir.path(), &model_options(Arch::Qwen2)).unwrap();
    let m = &model.transformer;
    let batch = |seed: u32| {
        let pairs: Vec<(Vec<u32>, Vec<u32>)> = (0..3u32)
            .map(|i| {
                let prompt = (0..2 + i % 2)
                    .map(|k| 3 + (seed + i * 5 + k) % 18)
                    .collect();
                let response = (0..3 + i)
                    .map(|k| 3 + (seed * 3 + i + k * 7) % 18)
                    .collect();
                (prompt, response)
            })
            .collect();
        batch_of(&model, &pairs)
    };
    let (a, b) = (batch(1), batch(7));
    let grads_of = |taped: bool| {
        let mut tape = roll::model::Tape::default();
        let mut loss = Tensor::zeros((), candle_core::DType::F32, &Device::Cpu).unwrap();
        for (batch, weight) in [(&a, 1.0), (&b, -0.5)] {
            let t = if taped { Some(&mut tape) } else { None };
            let (lp, _) =
                response_forward(m, batch, 1.0, Numerics::Differentiable, false, t).unwrap();
            loss = (loss + (lp.sum_all().unwrap() * weight).unwrap()).unwrap();
        }
        let grads = if taped {
            assert_eq!(tape.len(), 2 * m.config().num_hidden_layers);
            tape.backward(loss).unwrap()
        } else {
            loss.backward().unwrap()
        };
        named_grads(m, &grads)
    };
    let (taped, whole) = (grads_of(true), grads_of(false));
    for ((name, g), (_, want)) in taped.iter().zip(&whole) {
        let (worst, scale) = worst_and_scale(g, want);
        assert!(scale > 0.0, "{name}: no gradient");
        assert!(worst <= 1e-6 * scale, "{name}: worst {worst} of {scale}");
    }
}

/// Decoding with a KV cache through the fused kernels (cache columns on axis 1) and through
/// candle's ops (axis 2) gives the same logits at every step, for every architecture, with a
/// left-padded row.
#[test]
fn cached_decoding_in_the_fused_kernels_equals_candles_ops() {
    use roll::model::KvCache;
    let dev = Device::Cpu;
    // Wide enough (256 columns, a few rows) that the projections of prefill, decode steps and
    // logits take the skinny product (`roll_cpu_kernels::skinny`), with Qwen2's q/k/v biases.
    let wide = |arch| InitOptions {
        hidden: 256,
        intermediate: 512,
        ..model_options(arch)
    };
    for (arch, opts) in [Arch::Qwen2, Arch::Qwen3, Arch::Llama]
        .into_iter()
        .flat_map(|a| [(a, model_options(a)), (a, wide(a))])
    {
        let dir = tempfile::tempdir().unwrap();
        let model = init_model_dir(dir.path(), &opts).unwrap();
        let m = &model.transformer;
        // Biases start at zero; give them values so that adding them is checked too.
        for (name, var) in m.params().named_vars() {
            if name.ends_with(".bias") {
                var.set(&Tensor::randn(0f32, 0.5, var.dims(), &dev).unwrap())
                    .unwrap();
            }
        }
        let groups = m.config().kv_groups();
        let layers = m.config().num_hidden_layers;
        let decode = |numerics: Numerics| -> Vec<Vec<f32>> {
            // Row 0: a 5-token prompt; row 1: 3 tokens after 2 columns of left padding.
            let valid_from = vec![0usize, 2];
            let mut cache = KvCache::new(layers, valid_from.clone());
            let ids =
                Tensor::from_vec(vec![4u32, 9, 2, 7, 5, 0, 0, 3, 8, 6], (2, 5), &dev).unwrap();
            let pos =
                Tensor::from_vec(vec![0u32, 1, 2, 3, 4, 0, 0, 0, 1, 2], (2, 5), &dev).unwrap();
            let mask = attention_mask(&valid_from, 0, 5, groups, &dev).unwrap();
            let h = m
                .forward_hidden(&ids, &pos, &mask, Some(&mut cache), numerics)
                .unwrap();
            let mut steps = vec![m.logits(&h.narrow(1, 4, 1).unwrap(), numerics).unwrap()];
            for step in 0..3u32 {
                let ids = Tensor::from_vec(vec![10 + step, 12 + step], (2, 1), &dev).unwrap();
                let pos = Tensor::from_vec(vec![5 + step, 3 + step], (2, 1), &dev).unwrap();
                let mask = attention_mask(&valid_from, 5 + step as usize, 1, groups, &dev).unwrap();
                let h = m
                    .forward_hidden(&ids, &pos, &mask, Some(&mut cache), numerics)
                    .unwrap();
                steps.push(m.logits(&h, numerics).unwrap());
            }
            steps
                .iter()
                .map(|l| l.flatten_all().unwrap().to_vec1().unwrap())
                .collect()
        };
        let fused = decode(Numerics::Fast);
        let reference = decode(Numerics::Reference);
        for (step, (a, b)) in fused.iter().zip(&reference).enumerate() {
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y).abs() <= 1e-5 * (1.0 + y.abs()),
                    "{arch:?} hidden {} step {step}: {x} vs {y}",
                    opts.hidden
                );
            }
        }
    }
}

/// The batch split into lanes decoded side by side (one per thread) gives every request the
/// tokens it gets in one lane, and its log-probs to f32 rounding: a row's logits depend only on
/// its own tokens (up to the order of a few sums: the matrix products' blocking depends on how
/// many rows share them), and each request samples from its own seeded RNG. Ragged prompts, an EOS id that ends
/// some samples early (their slots are refilled from the queue), and more requests than slots.
#[test]
fn lanes_do_not_change_any_sample() {
    let dir = tempfile::tempdir().unwrap();
    let model = init_model_dir(dir.path(), &model_options(Arch::Qwen2)).unwrap();
    let run = |lanes: usize| {
        let mut engine = roll::rollout::Engine::with_lanes(&model.transformer, vec![5], 5, lanes);
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
        out
    };
    let one = run(1);
    assert_eq!(one.len(), 13);
    assert!(
        one.iter()
            .any(|c| c.finish == roll::rollout::FinishReason::Eos),
        "some sample ends at the EOS id"
    );
    let tokens = |out: &[roll::rollout::Completion]| {
        out.iter()
            .map(|c| (c.id, c.token_ids.clone(), c.finish))
            .collect::<Vec<_>>()
    };
    for lanes in [2, 3, 5, 8] {
        let split = run(lanes);
        assert_eq!(tokens(&split), tokens(&one), "{lanes} lanes");
        for (a, b) in split.iter().zip(&one) {
            for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                assert!(
                    (x - y).abs() <= 1e-5,
                    "{lanes} lanes, request {}: {x} vs {y}",
                    a.id
                );
            }
        }
    }
}
