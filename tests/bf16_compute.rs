//! A bf16 model on the CPU keeps its weights in bf16 and computes its layers in f32 through the
//! fused kernels (`Transformer::compute_dtype`). Its twin is the same directory loaded as f32: the
//! same bf16 values, widened exactly. Computing in f32, the two make the same bits until the
//! bf16 model rounds its final hidden states (and its weights' gradients) to bf16 once: so the
//! bf16 model's values are the twin's rounded, exactly. candle's per-op bf16 path rounds after
//! every op instead, and fails these comparisons.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use candle_core::{DType, Device, Tensor};
use roll::model::hf_dir::InitOptions;
use roll::model::{
    Arch, LoadedModel, Numerics, Tape, Transformer, attention_mask, init_model_dir, load_model_dir,
};
use roll::train::batch::{TrainBatch, response_forward};

fn opts(arch: Arch) -> InitOptions {
    InitOptions {
        dtype: "bfloat16".into(),
        seed: 5,
        ..common::model_options(arch)
    }
}

/// A bf16 model as stored, and the same directory loaded as f32.
fn twins(arch: Arch) -> (tempfile::TempDir, LoadedModel, LoadedModel) {
    let dir = tempfile::tempdir().unwrap();
    init_model_dir(dir.path(), &opts(arch)).unwrap();
    let bf16 = load_model_dir(dir.path(), None, &Device::Cpu).unwrap();
    let f32 = load_model_dir(dir.path(), Some(DType::F32), &Device::Cpu).unwrap();
    assert_eq!(bf16.transformer.dtype(), DType::BF16);
    (dir, bf16, f32)
}

/// Two rows of 6 tokens, the second left-padded by 2: (ids, positions, mask).
fn batch(m: &Transformer) -> (Tensor, Tensor, Tensor) {
    let dev = Device::Cpu;
    let ids: Vec<u32> = vec![4, 9, 2, 7, 11, 3, 0, 0, 5, 8, 13, 6];
    let pos: Vec<u32> = vec![0, 1, 2, 3, 4, 5, 0, 0, 0, 1, 2, 3];
    let mask = attention_mask(&[0, 2], 0, 6, m.config().kv_groups(), &dev).unwrap();
    (
        Tensor::from_vec(ids, (2, 6), &dev).unwrap(),
        Tensor::from_vec(pos, (2, 6), &dev).unwrap(),
        mask,
    )
}

/// `t` rounded to bf16 and back, as f32 values.
fn rounded(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

#[test]
fn a_bf16_models_hidden_states_are_its_f32_twins_rounded_once() {
    for arch in [Arch::Qwen2, Arch::Qwen3, Arch::Llama] {
        let (_dir, m16, m32) = twins(arch);
        let (ids, pos, mask) = batch(&m16.transformer);
        // 12 rows: at inference both take the streamed product (the bf16 model's reading its
        // weights in place). At 8 rows or fewer the twin's would take the skinny one, whose
        // sums run in another order: the same values to the last bits, not bit for bit.
        for numerics in [Numerics::Fast, Numerics::Differentiable] {
            let h16 = m16
                .transformer
                .forward_hidden(&ids, &pos, &mask, None, numerics)
                .unwrap();
            let h32 = m32
                .transformer
                .forward_hidden(&ids, &pos, &mask, None, numerics)
                .unwrap();
            assert_eq!(h16.dtype(), DType::BF16, "{arch:?}: the heads get bf16");
            assert!(
                rounded(&h16) == rounded(&h32),
                "{arch:?} {numerics:?}: not the f32 twin's hidden states rounded"
            );
            // The head widens both factors and computes in f32: the twin's head on the same
            // (rounded) hidden states, not logits rounded to bf16.
            let flat = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let l16 = m16.transformer.logits(&h16, numerics).unwrap();
            let h16_wide = h16.to_dtype(DType::F32).unwrap();
            let l32 = m32.transformer.logits(&h16_wide, numerics).unwrap();
            assert!(
                flat(l16) == flat(l32),
                "{arch:?} {numerics:?}: the head is not the twin's in f32"
            );
        }
    }
}

#[test]
fn a_bf16_models_gradients_are_its_f32_twins_rounded_once() {
    for arch in [Arch::Qwen2, Arch::Qwen3, Arch::Llama] {
        let (_dir, m16, m32) = twins(arch);
        let (ids, pos, mask) = batch(&m16.transformer);
        // A loss that weights every hidden value differently, by multiples of 1/8 (exact in
        // bf16): the gradient that reaches both models' final norms is the same f32 values.
        let hidden = m16.transformer.config().hidden_size;
        let c: Vec<f32> = (0..2 * 6 * hidden)
            .map(|i| ((i * 37) % 17) as f32 / 8.0 - 1.0)
            .collect();
        let c = Tensor::from_vec(c, (2, 6, hidden), &Device::Cpu).unwrap();
        let grads = |m: &Transformer| {
            let mut tape = Tape::default();
            let h = m
                .forward_hidden_taped(&ids, &pos, &mask, Numerics::Differentiable, &mut tape)
                .unwrap();
            let loss = (h.to_dtype(DType::F32).unwrap() * &c)
                .unwrap()
                .sum_all()
                .unwrap();
            let grads = tape.backward(loss).unwrap();
            m.params()
                .named_vars()
                .into_iter()
                // Every variable but an untied output head (which this loss does not use).
                .filter_map(|(name, var)| Some((name, grads.get(var.as_tensor())?.clone())))
                .collect::<Vec<_>>()
        };
        let (g16, g32) = (grads(&m16.transformer), grads(&m32.transformer));
        let untied = usize::from(arch == Arch::Llama);
        assert_eq!(
            g16.len(),
            m16.transformer.params().named_vars().len() - untied
        );
        assert_eq!(g16.len(), g32.len());
        for ((name, a), (_, b)) in g16.iter().zip(&g32) {
            assert_eq!(a.dtype(), DType::BF16, "{arch:?} {name}");
            let (a, b) = (rounded(a), rounded(b));
            if name.contains("embed_tokens") {
                // The lookup's rows reach the table in bf16 and are summed there, each rounded
                // first: a rounding (2^-8 relative) apart at most.
                let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                let worst = a
                    .iter()
                    .zip(&b)
                    .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(
                    scale > 0.0 && worst <= scale / 64.0,
                    "{arch:?} {name}: {worst} of {scale}"
                );
            } else {
                assert!(
                    a == b,
                    "{arch:?} {name}: not the f32 twin's gradient rounded"
                );
            }
        }
    }
}

/// Training's path (`response_forward` on a tape, the fused head): log-probs near the f32 twin's
/// (the hidden states differ by their bf16 rounding) and a bf16 gradient for every weight.
#[test]
fn a_bf16_model_trains_through_the_f32_head() {
    for arch in [Arch::Qwen2, Arch::Llama] {
        let (_dir, m16, m32) = twins(arch);
        let pairs: [(&[u32], &[u32]); 2] = [(&[4, 9, 2], &[7, 11, 3]), (&[5], &[8, 13, 6, 10])];
        let logprobs_and_grads = |m: &LoadedModel| {
            let groups = m.transformer.config().kv_groups();
            let batch = TrainBatch::new(&pairs, m.pad_id, groups, &Device::Cpu).unwrap();
            let mut tape = Tape::default();
            let (lp, _) = response_forward(
                &m.transformer,
                &batch,
                1.0,
                Numerics::Differentiable,
                false,
                Some(&mut tape),
            )
            .unwrap();
            let loss = lp.sum_all().unwrap().neg().unwrap();
            let values = lp.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            let grads = tape.backward(loss).unwrap();
            let dtypes: Vec<_> = m
                .transformer
                .params()
                .named_vars()
                .into_iter()
                .map(|(name, var)| (name, grads.get(var.as_tensor()).map(Tensor::dtype)))
                .collect();
            (values, dtypes)
        };
        let ((lp16, g16), (lp32, _)) = (logprobs_and_grads(&m16), logprobs_and_grads(&m32));
        let worst = lp16
            .iter()
            .zip(&lp32)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(worst < 0.02, "{arch:?}: log-probs {worst} off the twin's");
        for (name, dtype) in g16 {
            assert_eq!(dtype, Some(DType::BF16), "{arch:?} {name}");
        }
    }
}
