//! One model's numerics computed two ways — on two devices, or with two kernel sets — and
//! compared: the logits of a prefill and of cached decode steps, the training forward's response
//! log-probs, entropies and parameter gradients, and the generation engine's samples with their
//! log-probs. `tests/generic_path.rs` compares the generic path with the fused CPU kernels;
//! `roll-tui devices --check` compares a GPU with the CPU.

use candle_core::{Result, Tensor};

use crate::model::hf_dir::InitOptions;
use crate::model::{Arch, KvCache, LoadedModel, Numerics, Tape, attention_mask, init_model};
use crate::rollout::{Engine, Request, SamplingParams};
use crate::train::batch::{TrainBatch, response_forward};

/// Each parameter's gradient, flattened, by name.
pub type NamedGrads = Vec<(String, Vec<f32>)>;

/// (id, tokens, sampling log-probs) of each finished request, by id.
pub type Samples = Vec<(u64, Vec<u32>, Vec<f32>)>;

/// Everything compared, for one model on one device.
pub struct Outputs {
    /// Logits of the prefill's last position, then of each of three cached decode steps.
    pub decode_logits: Vec<Vec<f32>>,
    pub logprobs: Vec<f32>,
    pub entropy: Vec<f32>,
    pub grads: NamedGrads,
    pub samples: Samples,
}

/// A small random model of `arch` in host memory (2 layers, hidden 64, 4 heads over 2 kv heads),
/// its biases given fixed values too (they start at zero) so that adding them is compared.
pub fn small_model(arch: Arch) -> Result<LoadedModel> {
    small_model_seeded(arch, 3)
}

/// The options of [`small_model`]: 2 layers, hidden 64, 4 heads over 2 kv heads, a
/// 21-character tokenizer, f32; Llama's head untied.
pub fn small_options(arch: Arch, seed: u64) -> InitOptions {
    InitOptions {
        arch,
        hidden: 64,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        intermediate: 128,
        head_dim: None,
        tie_embeddings: arch != Arch::Llama,
        max_positions: 128,
        rope_theta: 10_000.0,
        chars: "0123456789+=abcdefgh>".into(),
        dtype: "float32".into(),
        seed,
    }
}

/// [`small_model`] with the weights of another seed.
pub fn small_model_seeded(arch: Arch, seed: u64) -> Result<LoadedModel> {
    let model = init_model(&small_options(arch, seed))
        .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
    // Fixed values (candle's own `randn` is not seeded): spread over about ±0.5.
    for (n, (name, var)) in model
        .transformer
        .params()
        .named_vars()
        .into_iter()
        .enumerate()
    {
        if name.ends_with(".bias") {
            let count = var.elem_count();
            let values: Vec<f32> = (0..count)
                .map(|i| 0.5 * ((i * 7 + n * 13) as f32 * 0.618_034).sin())
                .collect();
            var.set(&Tensor::from_vec(values, var.dims(), var.device())?)?;
        }
    }
    Ok(model)
}

fn flat(t: &Tensor) -> Result<Vec<f32>> {
    t.flatten_all()?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1()
}

/// Prefill a left-padded batch of two rows, then three decode steps through the KV cache.
fn decode_logits(model: &LoadedModel) -> Result<Vec<Vec<f32>>> {
    let m = &model.transformer;
    let dev = m.device().clone();
    let groups = m.config().kv_groups();
    let valid_from = vec![0usize, 2];
    let mut cache = KvCache::new(m.config().num_hidden_layers, valid_from.clone());
    let ids = Tensor::from_vec(vec![4u32, 9, 2, 7, 5, 0, 0, 3, 8, 6], (2, 5), &dev)?;
    let pos = Tensor::from_vec(vec![0u32, 1, 2, 3, 4, 0, 0, 0, 1, 2], (2, 5), &dev)?;
    let mask = attention_mask(&valid_from, 0, 5, groups, &dev)?;
    let h = m.forward_hidden(&ids, &pos, &mask, Some(&mut cache), Numerics::Fast)?;
    let mut steps = vec![flat(&m.logits(&h.narrow(1, 4, 1)?, Numerics::Fast)?)?];
    for step in 0..3u32 {
        let ids = Tensor::from_vec(vec![10 + step, 12 + step], (2, 1), &dev)?;
        let pos = Tensor::from_vec(vec![5 + step, 3 + step], (2, 1), &dev)?;
        let mask = attention_mask(&valid_from, 5 + step as usize, 1, groups, &dev)?;
        let h = m.forward_hidden(&ids, &pos, &mask, Some(&mut cache), Numerics::Fast)?;
        steps.push(flat(&m.logits(&h, Numerics::Fast)?)?);
    }
    Ok(steps)
}

/// The training forward over a ragged batch, cut per layer as training does, and the gradient of
/// a loss that weights every token's log-prob and entropy differently.
fn training(model: &LoadedModel) -> Result<(Vec<f32>, Vec<f32>, NamedGrads)> {
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
    let batch = TrainBatch::new(&refs, model.pad_id, m.config().kv_groups(), m.device())?;
    let mut tape = Tape::default();
    let numerics = Numerics::Differentiable;
    let (lp, h) = response_forward(m, &batch, 0.9, numerics, true, Some(&mut tape))?;
    let h = h.ok_or_else(|| candle_core::Error::Msg("no entropy".into()))?;
    let (b, r) = lp.dims2()?;
    let w: Vec<f32> = (0..b * r)
        .map(|i| ((i * 37) % 11) as f32 / 5.0 - 1.0)
        .collect();
    let w = Tensor::from_vec(w, (b, r), m.device())?;
    let loss = ((&lp * &w)?.sum_all()? + ((&h * &w)?.sum_all()? * 0.3)?)?;
    let grads = tape.backward(loss)?;
    let mut named = vec![];
    for (name, var) in m.params().named_vars() {
        let g = grads
            .get(var.as_tensor())
            .ok_or_else(|| candle_core::Error::Msg(format!("no gradient for {name}")))?;
        named.push((name, flat(g)?));
    }
    Ok((flat(&lp)?, flat(&h)?, named))
}

/// Thirteen seeded requests of ragged prompts through the continuous-batching engine, five slots.
fn generation(model: &LoadedModel) -> Result<Samples> {
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
    let mut out = engine.run_to_completion()?;
    out.sort_by_key(|c| c.id);
    Ok(out
        .into_iter()
        .map(|c| (c.id, c.token_ids, c.logprobs))
        .collect())
}

/// Every output of [`Outputs`] for `model`, on the device it is on.
pub fn outputs(model: &LoadedModel) -> Result<Outputs> {
    let (logprobs, entropy, grads) = training(model)?;
    Ok(Outputs {
        decode_logits: decode_logits(model)?,
        logprobs,
        entropy,
        grads,
        samples: generation(model)?,
    })
}

/// One comparison: what, the worst difference found (relative to `1 + |reference|` for values,
/// to the largest element for gradients), and whether it is within the tolerance.
#[derive(Debug, Clone)]
pub struct Finding {
    pub what: String,
    pub worst: f32,
    pub ok: bool,
}

fn values(what: String, a: &[f32], b: &[f32], tol: f32) -> Finding {
    let worst = if a.len() == b.len() {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
            .fold(0f32, f32::max)
    } else {
        f32::INFINITY
    };
    Finding {
        what,
        ok: worst <= tol,
        worst,
    }
}

/// `a` against the reference `b`, every output, at tolerance `tol`.
pub fn compare(a: &Outputs, b: &Outputs, tol: f32) -> Vec<Finding> {
    let mut found = vec![];
    for (step, (x, y)) in a.decode_logits.iter().zip(&b.decode_logits).enumerate() {
        found.push(values(format!("decode step {step} logits"), x, y, tol));
    }
    found.push(values("log-probs".into(), &a.logprobs, &b.logprobs, tol));
    found.push(values("entropy".into(), &a.entropy, &b.entropy, tol));
    for ((name, x), (_, y)) in a.grads.iter().zip(&b.grads) {
        let scale = y.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs())) / scale.max(1e-30);
        found.push(Finding {
            what: format!("gradient of {name}"),
            ok: scale > 0.0 && x.len() == y.len() && worst <= tol,
            worst,
        });
    }
    let same_tokens = a.samples.len() == b.samples.len()
        && a.samples.iter().zip(&b.samples).all(|(x, y)| x.1 == y.1);
    found.push(Finding {
        what: "sampled tokens".into(),
        worst: if same_tokens { 0.0 } else { 1.0 },
        ok: same_tokens,
    });
    let lps = |o: &Outputs| -> Vec<f32> { o.samples.iter().flat_map(|s| s.2.clone()).collect() };
    found.push(values("sampling log-probs".into(), &lps(a), &lps(b), tol));
    found
}

/// Whether two runs' values differ in any bit (two implementations ran, not one twice).
pub fn any_bits_differ(a: &Outputs, b: &Outputs) -> bool {
    let bits = |o: &Outputs| -> Vec<u32> {
        o.decode_logits
            .iter()
            .flatten()
            .chain(&o.logprobs)
            .map(|v| v.to_bits())
            .collect()
    };
    bits(a) != bits(b)
}
