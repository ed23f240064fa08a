//! The fused attention kernel alone, at the shapes the engine gives it: a lane's decode step and a
//! training micro-batch of the tiny Qwen2 (4 heads, 2 KV heads, head_dim 32), and a decode step of
//! the Qwen2.5-0.5B shape (14 heads, 2 KV heads, head_dim 64), forward and (training) backward.
//! Keys and values of a decode step are views of a cache with room for 64 positions, as
//! `KvCache` holds them.
//!
//! Prints the least time per call (best of 15 batches) and per (query row, key) pair, on one
//! thread (a lane's view of the kernel: the other cores run lanes of their own) and on the pool.
//!
//! Run: `cargo bench -p roll-cpu-kernels --bench attention [-- NAME]` (record figures in
//! benches/RESULTS.md).

use std::time::Instant;

use candle_core::{Device, Tensor};
use roll_cpu_kernels::attention::{attention, attention_backward};

struct Shape {
    name: &'static str,
    batch: usize,
    queries: usize,
    keys: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    backward: bool,
}

const SHAPES: [Shape; 6] = [
    Shape {
        name: "tiny decode, 32 rows, 8 keys",
        batch: 32,
        queries: 1,
        keys: 8,
        heads: 4,
        kv_heads: 2,
        head_dim: 32,
        backward: false,
    },
    Shape {
        name: "tiny decode, 32 rows, 38 keys",
        batch: 32,
        queries: 1,
        keys: 38,
        heads: 4,
        kv_heads: 2,
        head_dim: 32,
        backward: false,
    },
    Shape {
        name: "tiny training, 32 x 16",
        batch: 32,
        queries: 16,
        keys: 16,
        heads: 4,
        kv_heads: 2,
        head_dim: 32,
        backward: true,
    },
    Shape {
        name: "tiny training, 16 x 128",
        batch: 16,
        queries: 128,
        keys: 128,
        heads: 4,
        kv_heads: 2,
        head_dim: 32,
        backward: true,
    },
    Shape {
        name: "0.5B decode, 16 rows, 38 keys",
        batch: 16,
        queries: 1,
        keys: 38,
        heads: 14,
        kv_heads: 2,
        head_dim: 64,
        backward: false,
    },
    Shape {
        name: "0.5B training, 16 x 64",
        batch: 16,
        queries: 64,
        keys: 64,
        heads: 14,
        kv_heads: 2,
        head_dim: 64,
        backward: true,
    },
];

/// The least seconds per call of `f` over `reps` timed batches of `iters` calls each: the machine
/// is shared, and other work only ever adds time.
fn time(iters: usize, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_secs_f64() / iters as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool");
    // `cargo bench ... -- decode` runs the shapes whose name holds "decode".
    let filter = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    for s in SHAPES
        .iter()
        .filter(|s| filter.as_deref().is_none_or(|f| s.name.contains(f)))
    {
        let groups = s.heads / s.kv_heads;
        let q = Tensor::randn(0f32, 1.0, (s.batch, s.queries, s.heads, s.head_dim), &dev)?;
        // Decode reads the first `keys` positions of a 64-position cache; training's keys are
        // the step's own.
        let capacity = if s.queries == 1 { 64 } else { s.keys };
        let cache = |seed: f32| -> candle_core::Result<Tensor> {
            let c = (Tensor::randn(0f32, 1.0, (s.batch, capacity, s.kv_heads, s.head_dim), &dev)?
                + f64::from(seed))?;
            c.narrow(1, 0, s.keys)
        };
        let (k, v) = (cache(0.0)?, cache(0.1)?);
        // Causal for training (query i sees keys 0..=i), all keys for a decode step.
        let mask: Vec<f32> = (0..s.batch * groups * s.queries * s.keys)
            .map(|at| {
                let (i, j) = ((at / s.keys) % s.queries, at % s.keys);
                if s.queries > 1 && j > i { -1e9 } else { 0.0 }
            })
            .collect();
        let mask = Tensor::from_vec(mask, (s.batch, 1, groups * s.queries, s.keys), &dev)?;
        let scale = 1.0 / (s.head_dim as f64).sqrt();
        let pairs = (s.batch * s.heads * s.queries * s.keys) as f64;
        let iters = (2e6 / pairs).ceil() as usize;
        let forward = || {
            attention(&q, &k, &v, &mask, scale)
                .map(drop)
                .expect("attention")
        };
        let out = attention(&q, &k, &v, &mask, scale)?;
        let dy = Tensor::randn(0f32, 1.0, out.dims(), &dev)?;
        let (kc, vc) = (k.contiguous()?, v.contiguous()?);
        let backward = || {
            attention_backward(&q, &kc, &vc, &mask, scale, &out, &dy)
                .map(drop)
                .expect("attention backward")
        };
        for (threads, pool) in [("1 thread", Some(&one)), ("pool", None)] {
            let run = |f: &(dyn Fn() + Sync)| match pool {
                Some(p) => p.install(|| time(iters, 15, f)),
                None => time(iters, 15, f),
            };
            let fwd = run(&forward);
            print!(
                "{}, {threads}: forward {:.1} us ({:.2} ns a pair)",
                s.name,
                fwd * 1e6,
                fwd * 1e9 / pairs
            );
            if s.backward {
                let bwd = run(&backward);
                print!(
                    ", backward {:.1} us ({:.2} ns a pair)",
                    bwd * 1e6,
                    bwd * 1e9 / pairs
                );
            }
            println!();
        }
    }
    Ok(())
}
