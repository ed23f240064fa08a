//! LoRA against full fine-tuning, side by side in one process, at the Qwen2.5-0.5B shape
//! (`QWEN05_LAYERS` of its 24 layers, all by default; `-- tiny` for the engine bench's tiny
//! shape): one training step each, alternating, for `BENCH_ROUNDS` rounds (2 by default; the
//! first is a warm-up). A step is what the actor takes per mini-batch: forward+backward of 16
//! sequences of 6 + 58 tokens in the model's lanes, the gradients summed, one AdamW step.
//!
//! Full fine-tuning trains every parameter; LoRA (`LoraSettings::default()`: rank 8, alpha 8,
//! every linear layer) trains only its adapter, the base frozen; `dropout` is the same adapter
//! with `lora_dropout` 0.05 (its masks drawn and its products taken apart from the base's).
//! Each step prints its seconds,
//! the bytes of its summed gradients and of its optimizer's state (what the memory
//! criterion counts: both scale with what trains), and the process's peak resident memory
//! during the step. Both models share one copy of the base weights (the adapter's model is the
//! full one's clone, `Transformer::with_lora`), so full fine-tuning's steps move the base under
//! the adapter: the timing does not depend on the weights' values.
//!
//! The peak resident memory is the process's: with both contenders in one process it counts the
//! others' optimizer state and what the allocator kept of the others' steps. `-- full`,
//! `-- lora` or `-- dropout` runs one of them alone, for its own peak.
//!
//! Run: `cargo bench --bench lora` (the 0.5B shape: minutes, ~11 GB) or `cargo bench --bench
//! lora -- tiny`; record the figures in benches/RESULTS.md.

use std::time::Instant;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use roll::model::lora::{LoraSettings, LoraVars};
use roll::model::threads::side_by_side;
use roll::model::{Transformer, init_model};
use roll::train::{AdamW, GradAccumulator, OptimizerConfig};

#[path = "common/workloads.rs"]
mod workloads;
use workloads::{
    bench_dtype, forward_backward, lanes_of, peak_note, qwen05_layers, qwen05_options,
    reset_peak_rss, tiny_options,
};

/// One way of training the model, and what it has measured.
struct Contender {
    name: &'static str,
    model: Transformer,
    opt: AdamW,
    seconds: Vec<f64>,
    /// Summed gradients and optimizer state, bytes (the same every step).
    grad_bytes: usize,
    state_bytes: usize,
}

impl Contender {
    fn new(name: &'static str, model: Transformer) -> Contender {
        let opt =
            AdamW::new(model.trainable_vars(), OptimizerConfig::default(), 100).expect("optimizer");
        Contender {
            name,
            model,
            opt,
            seconds: vec![],
            grad_bytes: 0,
            state_bytes: 0,
        }
    }

    /// One training step over `tbs` (one batch per lane), timed.
    fn step(&mut self, tbs: &[roll::train::TrainBatch], round: usize) {
        reset_peak_rss();
        let t = Instant::now();
        let vars = self.model.trainable_vars();
        let mut acc = GradAccumulator::default();
        for g in side_by_side(tbs, |tb| forward_backward(&self.model, tb)) {
            acc.add(&vars, g).expect("gradients");
        }
        self.grad_bytes = acc.bytes();
        self.opt.step(acc).expect("optimizer step");
        let s = t.elapsed().as_secs_f64();
        self.state_bytes = self.opt.state_bytes();
        println!(
            "{:>4}, round {round}: {s:.2} s, gradients {:.1} MB, optimizer state {:.1} MB{}",
            self.name,
            self.grad_bytes as f64 / 1e6,
            self.state_bytes as f64 / 1e6,
            peak_note()
        );
        self.seconds.push(s);
    }
}

#[allow(unsafe_code)] // the binary's thread settings, before any thread exists
fn main() {
    for (key, value) in roll::model::threads::env_defaults() {
        // SAFETY: main's first statement: no other thread exists to read the environment.
        unsafe { std::env::set_var(key, value) };
    }
    roll::allocator::configure();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tiny = args.iter().any(|a| a == "tiny");
    let alone = ["full", "lora", "dropout"]
        .into_iter()
        .find(|name| args.iter().any(|a| a == name));
    let opts = if tiny {
        tiny_options()
    } else {
        qwen05_options(qwen05_layers())
    };
    let loaded = init_model(&opts).expect("model");
    let layers = opts.layers;
    let vocab = loaded.transformer.config().vocab_size as u32;
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = (0..16u32)
        .map(|i| {
            (
                (0..6).map(|k| 3 + (i * 7 + k * 3) % (vocab - 3)).collect(),
                (0..58).map(|k| 3 + (i + k * 11) % (vocab - 3)).collect(),
            )
        })
        .collect();
    let full = loaded.transformer;
    let settings = LoraSettings::default();
    let adapter = LoraVars::init(&settings, layers, full.params(), 7, "bench").expect("adapter");
    // A second view of the same parameters (shared, not copied), with the adapter attached.
    let dropped = LoraVars::init(
        &LoraSettings {
            dropout: 0.05,
            ..settings.clone()
        },
        layers,
        full.params(),
        7,
        "bench",
    )
    .expect("adapter");
    let view = || Transformer::new(full.config().clone(), full.params().clone()).expect("view");
    let adapted = view().with_lora(Some(adapter));
    let with_dropout = view().with_lora(Some(dropped));
    let lanes = full.lanes();
    let tbs = lanes_of(&pairs, lanes, full.config().kv_groups());
    let params: usize = full
        .params()
        .named_vars()
        .iter()
        .map(|(_, v)| v.elem_count())
        .sum();
    let trained: usize = adapted
        .trainable_vars()
        .iter()
        .map(|(_, v)| v.elem_count())
        .sum();
    println!(
        "{} shape, {layers} layers, {:.1}M parameters, {} ({lanes} lanes); LoRA rank {} alpha {} on {}: {:.2}M trained",
        if tiny { "tiny" } else { "qwen2.5-0.5b" },
        params as f64 / 1e6,
        bench_dtype(),
        settings.rank,
        settings.alpha,
        settings.target_modules.join(", "),
        trained as f64 / 1e6
    );
    let mut contenders: Vec<Contender> =
        [("full", full), ("lora", adapted), ("dropout", with_dropout)]
            .into_iter()
            .filter(|(name, _)| alone.is_none_or(|a| a == *name))
            .map(|(name, model)| Contender::new(name, model))
            .collect();
    let rounds = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .filter(|&n: &usize| n > 1)
        .unwrap_or(2);
    for round in 0..rounds {
        for c in &mut contenders {
            c.step(&tbs, round);
        }
    }
    let [full, lora, dropout] = &contenders[..] else {
        return;
    };
    // The warm rounds (all but the first), each LoRA step against the full step beside it.
    let ratios: Vec<String> = (1..rounds)
        .map(|r| format!("{:.2}", lora.seconds[r] / full.seconds[r]))
        .collect();
    println!(
        "lora / full: step time {} (warm rounds); gradients + optimizer state {:.2}% ({:.1} MB of {:.1} MB)",
        ratios.join(", "),
        100.0 * (lora.grad_bytes + lora.state_bytes) as f64
            / (full.grad_bytes + full.state_bytes) as f64,
        (lora.grad_bytes + lora.state_bytes) as f64 / 1e6,
        (full.grad_bytes + full.state_bytes) as f64 / 1e6
    );
    let ratios: Vec<String> = (1..rounds)
        .map(|r| format!("{:.2}", dropout.seconds[r] / lora.seconds[r]))
        .collect();
    println!(
        "lora with dropout 0.05 / lora: step time {} (warm rounds)",
        ratios.join(", ")
    );
}
