//! What the engine benches share: peak memory, the models' dtype, the Qwen2.5-0.5B shape and
//! training's forward+backward. Included by path (`#[path = "common/workloads.rs"] mod
//! workloads;`): a folder of benches/ is no bench target of its own.
// Each bench takes what it needs of these.
#![allow(dead_code)]

use candle_core::Device;
use candle_core::backprop::GradStore;
use roll::model::threads::lane_rows;
use roll::model::{Arch, InitOptions, Numerics, Tape, Transformer};
use roll::train::{TrainBatch, response_forward};

/// Start a new peak: Linux resets the process's high-water mark of resident memory (`VmHWM`) when
/// "5" is written to its `clear_refs`. Elsewhere this does nothing and the peak is the process's.
pub fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The peak resident memory since the last [`reset_peak_rss`], in GB (`VmHWM`), where Linux tells.
pub fn peak_rss_gb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024.0 / 1e9)
}

/// " (peak RSS x.xx GB)" where known.
pub fn peak_note() -> String {
    peak_rss_gb()
        .map(|gb| format!(" (peak RSS {gb:.2} GB)"))
        .unwrap_or_default()
}

/// The models' dtype: `BENCH_DTYPE` (`float32` by default, or `bfloat16`).
pub fn bench_dtype() -> String {
    std::env::var("BENCH_DTYPE").unwrap_or_else(|_| "float32".into())
}

/// The engine bench's tiny Qwen2 shape (hidden 128, intermediate 512, 4 layers, 4 heads, 2 KV
/// heads, a 24-token character vocabulary, tied embeddings), random weights.
pub fn tiny_options() -> InitOptions {
    InitOptions {
        arch: Arch::Qwen2,
        hidden: 128,
        layers: 4,
        heads: 4,
        kv_heads: 2,
        intermediate: 512,
        head_dim: None,
        tie_embeddings: true,
        max_positions: 64,
        rope_theta: 10_000.0,
        chars: "0123456789+=abcdefgh>".into(),
        dtype: bench_dtype(),
        seed: 1,
    }
}

/// `QWEN05_LAYERS` of the 0.5B shape's 24 layers (all by default).
pub fn qwen05_layers() -> usize {
    std::env::var("QWEN05_LAYERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24)
}

/// The Qwen2.5-0.5B shape (hidden 896, intermediate 4864, 14 heads, 2 KV heads, tied
/// embeddings) with `layers` layers and random weights; the tokenizer is a character vocabulary
/// of 151,933 CJK-range characters (plus 3 specials), so the embedding has the real size.
pub fn qwen05_options(layers: usize) -> InitOptions {
    let chars: String = (0x4E00u32..)
        .filter_map(char::from_u32)
        .take(151_933)
        .collect();
    InitOptions {
        arch: Arch::Qwen2,
        hidden: 896,
        layers,
        heads: 14,
        kv_heads: 2,
        intermediate: 4864,
        head_dim: None,
        tie_embeddings: true,
        max_positions: 256,
        rope_theta: 1e6,
        chars,
        dtype: bench_dtype(),
        seed: 1,
    }
}

/// `pairs` as training batches, cut into lanes as training cuts its micro-batches ([`lane_rows`]).
pub fn lanes_of(pairs: &[(Vec<u32>, Vec<u32>)], lanes: usize, kv_groups: usize) -> Vec<TrainBatch> {
    let lens: Vec<(usize, usize)> = pairs.iter().map(|(p, r)| (p.len(), r.len())).collect();
    lane_rows(&lens, lanes)
        .iter()
        .map(|part| {
            let rows: Vec<(&[u32], &[u32])> = part
                .iter()
                .map(|&i| (pairs[i].0.as_slice(), pairs[i].1.as_slice()))
                .collect();
            TrainBatch::new(&rows, 0, kv_groups, &Device::Cpu).expect("batch")
        })
        .collect()
}

/// One forward and backward of the negated summed response log-probs, cut by layer as training
/// does (`roll::model::Tape`).
pub fn forward_backward(model: &Transformer, tb: &TrainBatch) -> GradStore {
    let mut tape = Tape::default();
    let (logp, _) = response_forward(
        model,
        tb,
        1.0,
        Numerics::Differentiable,
        false,
        Some(&mut tape),
    )
    .expect("fwd");
    let loss = logp.sum_all().and_then(|l| l.neg()).expect("loss");
    // As training does: the loss alone holds the head's piece, which its backward then frees.
    drop(logp);
    tape.backward(loss).expect("bwd")
}
