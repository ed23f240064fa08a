//! Our transformer against candle-transformers' Qwen2 and Llama, an implementation written
//! independently of ours (its own attention, rotary tables and masks), on the same weights: the
//! logits of an unpadded sequence agree to 1e-4 in f32, through the fused CPU kernels and through
//! the device-generic path alike. On a GPU the same comparison runs in the GPU check
//! (benches/gpu/check.sh).

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::{llama, qwen2};
use roll::model::{Arch, LoadedModel, Numerics, attention_mask};
use roll::parity::small_model;

const IDS: [u32; 7] = [4, 9, 2, 7, 5, 13, 6];

/// Our logits at every position of [`IDS`]: (t, vocab) flattened.
fn ours(model: &LoadedModel, numerics: Numerics) -> Vec<f32> {
    let m = &model.transformer;
    let dev = Device::Cpu;
    let t = IDS.len();
    let ids = Tensor::from_vec(IDS.to_vec(), (1, t), &dev).unwrap();
    let pos = Tensor::from_vec((0..t as u32).collect::<Vec<_>>(), (1, t), &dev).unwrap();
    let mask = attention_mask(&[0], 0, t, m.config().kv_groups(), &dev).unwrap();
    let h = m.forward_hidden(&ids, &pos, &mask, None, numerics).unwrap();
    let logits = m.logits(&h, numerics).unwrap();
    logits.flatten_all().unwrap().to_vec1().unwrap()
}

fn weights(model: &LoadedModel) -> VarBuilder<'static> {
    let tensors: HashMap<String, Tensor> = model
        .transformer
        .params()
        .named_tensors()
        .into_iter()
        .collect();
    VarBuilder::from_tensors(tensors, DType::F32, &Device::Cpu)
}

fn close(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
            "{what}[{i}]: ours {x} vs candle-transformers {y}"
        );
    }
}

#[test]
fn qwen2_logits_match_candle_transformers() {
    // Its biases are given values (they start at zero), so that both add them.
    let model = small_model(Arch::Qwen2).unwrap();
    let c = model.config();
    let cfg = qwen2::Config {
        vocab_size: c.vocab_size,
        hidden_size: c.hidden_size,
        intermediate_size: c.intermediate_size,
        num_hidden_layers: c.num_hidden_layers,
        num_attention_heads: c.num_attention_heads,
        num_key_value_heads: c.num_key_value_heads,
        max_position_embeddings: c.max_position_embeddings,
        sliding_window: c.max_position_embeddings,
        max_window_layers: c.num_hidden_layers,
        tie_word_embeddings: c.tie_word_embeddings,
        rope_theta: c.rope_theta,
        rms_norm_eps: c.rms_norm_eps,
        use_sliding_window: false,
        hidden_act: candle_nn::Activation::Silu,
    };
    let mut theirs = qwen2::Model::new(&cfg, weights(&model)).unwrap();
    let ids = Tensor::from_vec(IDS.to_vec(), (1, IDS.len()), &Device::Cpu).unwrap();
    let hidden = theirs.forward(&ids, 0, None).unwrap();
    let head = model.transformer.lm_head().clone();
    let logits = hidden.broadcast_matmul(&head.t().unwrap()).unwrap();
    let theirs: Vec<f32> = logits.flatten_all().unwrap().to_vec1().unwrap();
    for numerics in [
        Numerics::Fast,
        Numerics::Differentiable,
        Numerics::Reference,
    ] {
        close(
            &format!("qwen2 {numerics:?}"),
            &ours(&model, numerics),
            &theirs,
        );
    }
}

#[test]
fn llama_logits_match_candle_transformers() {
    let model = small_model(Arch::Llama).unwrap();
    let c = model.config();
    let cfg = llama::Config {
        hidden_size: c.hidden_size,
        intermediate_size: c.intermediate_size,
        vocab_size: c.vocab_size,
        num_hidden_layers: c.num_hidden_layers,
        num_attention_heads: c.num_attention_heads,
        num_key_value_heads: c.num_key_value_heads,
        use_flash_attn: false,
        rms_norm_eps: c.rms_norm_eps,
        rope_theta: c.rope_theta as f32,
        bos_token_id: None,
        eos_token_id: None,
        rope_scaling: None,
        max_position_embeddings: c.max_position_embeddings,
        tie_word_embeddings: c.tie_word_embeddings,
    };
    let theirs = llama::Llama::load(weights(&model), &cfg).unwrap();
    let mut cache = llama::Cache::new(false, DType::F32, &cfg, &Device::Cpu).unwrap();
    let ids = Tensor::from_vec(IDS.to_vec(), (1, IDS.len()), &Device::Cpu).unwrap();
    // Its logits are the last position's.
    let theirs: Vec<f32> = theirs
        .forward(&ids, 0, &mut cache)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let vocab = c.vocab_size;
    for numerics in [
        Numerics::Fast,
        Numerics::Differentiable,
        Numerics::Reference,
    ] {
        let all = ours(&model, numerics);
        close(
            &format!("llama {numerics:?}"),
            &all[all.len() - vocab..],
            &theirs,
        );
    }
}
