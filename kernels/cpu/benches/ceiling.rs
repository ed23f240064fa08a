//! The arithmetic ceiling of a tiny forward+backward on one core, to tell how far the engine is
//! from what the machine can do at all:
//!
//! - `fma`: the core's rate of fused multiply-adds, in the widest vectors pulp finds, twelve
//!   independent chains (enough to cover the instructions' latency on the cores we run on);
//! - `amx`: Intel AMX's bf16 tile products on one core, where the CPU has them, against `fma`: what
//!   the matrix units would give the f32 products at f32's accuracy (`ceiling/amx.rs`);
//! - `products`: the matrix products of one lane's step of `engine fwd_bwd` (tiny Qwen2: hidden
//!   128, intermediate 512, 4 heads of 32, 2 KV heads, 4 layers; 32 rows of 15 positions, so 480
//!   rows a product), each on operands of its own in the layouts `roll::model::layer_grad` gives
//!   gemm, through `product::matmul` and `matmul_add` as the engine calls them, one thread. These
//!   84 products are the whole of the step's arithmetic but for a few per cent (attention's
//!   scores, the norms, the head over a 24-token vocabulary). Their operands (~50 MB) outrun the
//!   caches, so each product starts cold, where the step's read activations a kernel has just
//!   written: an estimate of what the step's products cost, not a strict bound (a step has come
//!   within 1% of it);
//! - `shapes`: each distinct product of that list alone, repeated on the same operands (so in
//!   cache): what gemm reaches at that shape and layout when nothing else competes for the
//!   caches, and the step's 84 at those rates: the optimistic end;
//! - `cold-by-shape`: the products of `products` timed one by one and summed by shape, beside each
//!   shape in cache: which shapes lose the most to starting cold (`ceiling/cold_by_shape.rs`);
//! - `fused`: q, k and v's products as one (their weights side by side) and gate and up's as
//!   one, against the separate products `layer_grad` runs, in cache and on a lane's four layers
//!   of operands of their own (benches/RESULTS.md's git history: the fused are slower).
//! - `qwen05`: the same per-product rates as `shapes` at the Qwen2.5-0.5B shape of `engine
//!   qwen05-fwd_bwd` (hidden 896, 2 KV heads of 64, intermediate 4864; one lane of 16 sequences of
//!   63 positions, so 1008 rows), and its 24 layers at those rates. Products this large outrun
//!   the caches even when repeated, so this is what gemm reaches at that shape on one core;
//!   `benches/peer_products.py --shape qwen05` times the same through PyTorch's MKL
//!   (benches/RESULTS.md's git history).
//!
//! Prints the least time of 9 (the machine is shared: other work only adds time), the rates, and
//! the tokens per second a 64 x 16 step would reach on the cores this process may use if it were
//! its products alone.
//!
//! Run: `cargo bench -p roll-cpu-kernels --bench ceiling` (record figures in benches/RESULTS.md).

use std::time::Instant;

use candle_core::{Device, Tensor};
use pulp::{Arch, Simd, WithSimd};
use roll_cpu_kernels::product::{matmul, matmul_add};

#[path = "ceiling/amx.rs"]
mod amx;
#[path = "ceiling/cold_by_shape.rs"]
mod cold_by_shape;

/// Twelve chains of `FMA_STEPS` fused multiply-adds each; returns their sum so that nothing is
/// optimised away.
struct FmaChains;

const FMA_STEPS: usize = 20_000_000;
const CHAINS: usize = 12;

impl WithSimd for FmaChains {
    type Output = (f32, usize);

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) -> (f32, usize) {
        let mut acc = [simd.splat_f32s(1.0); CHAINS];
        // x * 0.999999 + 1e-7 stays near 1: no overflow, no denormals.
        let (b, c) = (simd.splat_f32s(0.999_999), simd.splat_f32s(1e-7));
        for _ in 0..FMA_STEPS {
            for a in acc.iter_mut() {
                *a = simd.mul_add_f32s(*a, b, c);
            }
        }
        let sum = acc
            .iter()
            .fold(simd.splat_f32s(0.0), |s, &a| simd.add_f32s(s, a));
        (simd.reduce_sum_f32s(sum), S::F32_LANES)
    }
}

/// One core's f32 fused multiply-add rate in GFLOP/s (the least time of [`least`]), and the
/// vector lanes it ran in.
fn fma_gflops() -> (f64, usize) {
    let mut lanes = 0;
    let secs = least(|| {
        let (sum, l) = Arch::new().dispatch(FmaChains);
        lanes = l;
        std::hint::black_box(sum);
    });
    ((2 * FMA_STEPS * CHAINS * lanes) as f64 / secs / 1e9, lanes)
}

/// Rows of a product in one lane's step: 32 sequences of 15 positions.
const LANE_ROWS: usize = 32 * 15;
/// The tiny model's layers.
const LAYERS: usize = 4;
/// A layer's widths: hidden, the k and v projections' (KV heads x head size), the MLP's.
#[derive(Clone, Copy)]
struct Widths {
    hidden: usize,
    kv: usize,
    mlp: usize,
}
/// The tiny Qwen2 of `engine fwd_bwd`.
const TINY: Widths = Widths {
    hidden: 128,
    kv: 64,
    mlp: 512,
};
/// The Qwen2.5-0.5B shape of `engine qwen05-fwd_bwd` (14 heads and 2 KV heads of 64).
const QWEN05: Widths = Widths {
    hidden: 896,
    kv: 128,
    mlp: 4864,
};
/// Its rows: one lane (a model this size is not split) of 16 sequences of 64 tokens, the last
/// position of each predicting nothing.
const QWEN05_ROWS: usize = 16 * 63;
/// Its layers.
const QWEN05_LAYERS: usize = 24;

/// The cores this process may use, and the tokens per second of a 64 x 16 step made of two lanes
/// that take `lane_secs` each, shared out over those cores (as `engine fwd_bwd` does; its lanes
/// scale almost perfectly).
fn step_tokens_per_s(lane_secs: f64) -> (usize, f64) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores, 64.0 * 16.0 * cores as f64 / (2.0 * lane_secs))
}

/// Least seconds of `f` over 9 runs, after one to warm up.
fn least(mut f: impl FnMut()) -> f64 {
    f();
    (0..9)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// A product's left and right factors and the sum it adds into (see [`Product::operands`]).
type Operands = (Tensor, Tensor, Tensor);

/// One product of the step: (m, k) times (k, n). `a_t`: the left factor is a transposed view of a
/// (k, m) matrix (a gradient read as dyᵀ); `b_t`: the right one of an (n, k) matrix (a weight
/// read as wᵀ). `add`: summed into an existing (m, n) result.
struct Product {
    m: usize,
    k: usize,
    n: usize,
    a_t: bool,
    b_t: bool,
    add: bool,
}

impl Product {
    fn new(m: usize, k: usize, n: usize, a_t: bool, b_t: bool, add: bool) -> Product {
        Product {
            m,
            k,
            n,
            a_t,
            b_t,
            add,
        }
    }

    fn flops(&self) -> f64 {
        2.0 * (self.m * self.k * self.n) as f64
    }

    /// Its operands, random, in its layouts, and the sum it adds into when `add`.
    fn operands(&self, dev: &Device) -> candle_core::Result<Operands> {
        let a = if self.a_t {
            Tensor::randn(0f32, 1.0, (self.k, self.m), dev)?.t()?
        } else {
            Tensor::randn(0f32, 1.0, (self.m, self.k), dev)?
        };
        let b = if self.b_t {
            Tensor::randn(0f32, 1.0, (self.n, self.k), dev)?.t()?
        } else {
            Tensor::randn(0f32, 1.0, (self.k, self.n), dev)?
        };
        let sum = Tensor::zeros((self.m, self.n), candle_core::DType::F32, dev)?;
        Ok((a, b, sum))
    }

    /// The product on `operands` (from [`Product::operands`]): summed into their sum, or its
    /// result pushed onto `kept`.
    fn run(&self, (a, b, sum): &Operands, kept: &mut Vec<Tensor>) {
        if self.add {
            matmul_add(sum, a, b).expect("product");
        } else {
            kept.push(matmul(a, b).expect("product"));
        }
    }

    /// The product on `operands` once, its result dropped at once (so the next run's output takes
    /// the same buffer): run again and again, in cache.
    fn in_cache(&self, operands: &Operands) {
        let mut kept = Vec::with_capacity(1);
        self.run(operands, &mut kept);
        std::hint::black_box(kept);
    }

    /// How gemm is asked for it, e.g. "(480, 128) x (128, 512)ᵀ".
    fn label(&self) -> String {
        let t = |yes: bool| if yes { "ᵀ" } else { "" };
        format!(
            "({}, {}){} x ({}, {}){}{}",
            self.m,
            self.k,
            t(self.a_t),
            self.k,
            self.n,
            t(self.b_t),
            if self.add { ", summed" } else { "" }
        )
    }
}

/// The products of one layer's forward and backward as `layer_grad` makes them, for `rows` rows.
fn layer_products(rows: usize, widths: Widths) -> Vec<Product> {
    let Widths {
        hidden: h,
        kv,
        mlp: ff,
    } = widths;
    let p = Product::new;
    vec![
        // Forward: q, k, v, o, gate, up, down, each x wᵀ.
        p(rows, h, h, false, true, false),
        p(rows, h, kv, false, true, false),
        p(rows, h, kv, false, true, false),
        p(rows, h, h, false, true, false),
        p(rows, h, ff, false, true, false),
        p(rows, h, ff, false, true, false),
        p(rows, ff, h, false, true, false),
        // Backward, in `LayerRecord::backward`'s order: down's weight dyᵀ mlp, the MLP's input
        // dy w; gate's and up's weights; h2's gradient, the second summed in.
        p(h, rows, ff, true, false, false),
        p(rows, h, ff, false, false, false),
        p(ff, rows, h, true, false, false),
        p(ff, rows, h, true, false, false),
        p(rows, ff, h, false, false, false),
        p(rows, ff, h, false, false, true),
        // o's weight and attention's gradient; q's, k's and v's weights; h1's gradient.
        p(h, rows, h, true, false, false),
        p(rows, h, h, false, false, false),
        p(h, rows, h, true, false, false),
        p(kv, rows, h, true, false, false),
        p(kv, rows, h, true, false, false),
        p(rows, h, h, false, false, false),
        p(rows, kv, h, false, false, true),
        p(rows, kv, h, false, false, true),
    ]
}

/// The products of one lane's tiny step (`LAYERS` layers), each with operands of its own, as the
/// step's are distinct tensors.
fn lane_step_products() -> candle_core::Result<(Vec<Product>, Vec<Operands>)> {
    let products: Vec<Product> = (0..LAYERS)
        .flat_map(|_| layer_products(LANE_ROWS, TINY))
        .collect();
    let operands = products
        .iter()
        .map(|p| p.operands(&Device::Cpu))
        .collect::<candle_core::Result<Vec<_>>>()?;
    Ok((products, operands))
}

fn main() -> candle_core::Result<()> {
    let filter = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let wants = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool");

    if wants("fma") {
        let (gflops, lanes) = fma_gflops();
        println!(
            "fma: {CHAINS} chains of {lanes}-lane fused multiply-adds, one core: {gflops:.1} GFLOP/s"
        );
    }

    if wants("amx") {
        match amx::bf16_tile_rate(|f| least(f)) {
            Ok(macs) => {
                let (fma, _) = fma_gflops();
                let (tile, f32_equivalent) = (2.0 * macs / 1e9, 2.0 * macs / 6.0 / 1e9);
                println!(
                    "amx: bf16 tile products, four 16 x 16 accumulators, one core: {tile:.1} \
                     GFLOP/s; at six per f32 product (bf16x3) {f32_equivalent:.1} GFLOP/s, \
                     {:.2}x the core's f32 fused multiply-adds ({fma:.1} GFLOP/s, measured after)",
                    f32_equivalent / fma
                );
            }
            Err(why) => println!("amx: not measured: {why}"),
        }
    }

    if wants("products") {
        let (products, operands) = lane_step_products()?;
        let flops: f64 = products.iter().map(Product::flops).sum();
        let secs = one.install(|| {
            least(|| {
                // The step keeps its products' results alive until its end (activations and
                // gradients), so the allocator hands each a buffer of its own.
                let mut kept = Vec::with_capacity(products.len());
                for (p, operands) in products.iter().zip(&operands) {
                    p.run(operands, &mut kept);
                }
                std::hint::black_box(kept);
            })
        });
        let (cores, tokens) = step_tokens_per_s(secs);
        println!(
            "products of one lane's tiny step ({} of them, {LANE_ROWS} rows, {:.2} GFLOP), one \
             thread: {:.1} ms, {:.1} GFLOP/s; a 64 x 16 step of these alone on {cores} core(s): \
             {tokens:.0} tokens/s",
            products.len(),
            flops / 1e9,
            secs * 1e3,
            flops / secs / 1e9,
        );
    }

    if wants("shapes") {
        // The step's 84 summed at those rates.
        let (lane_secs, flops) = rates_of_shapes(&one, LANE_ROWS, TINY, LAYERS)?;
        let (cores, tokens) = step_tokens_per_s(lane_secs);
        println!(
            "one lane's step at those rates: {:.1} ms, {:.1} GFLOP/s; a 64 x 16 step on {cores} \
             core(s): {tokens:.0} tokens/s",
            lane_secs * 1e3,
            flops / lane_secs / 1e9,
        );
    }
    if wants("qwen05") {
        let (secs, flops) = rates_of_shapes(&one, QWEN05_ROWS, QWEN05, QWEN05_LAYERS)?;
        println!(
            "the Qwen2.5-0.5B shape's {QWEN05_LAYERS} layers at those rates ({QWEN05_ROWS} rows, \
             the head not included): {:.2} s on one core, {:.1} GFLOP/s",
            secs,
            flops / secs / 1e9,
        );
    }
    if wants("cold-by-shape") {
        cold_by_shape::cold_by_shape(&one)?;
    }
    if wants("fused") {
        fused_against_separate(&one)?;
    }
    Ok(())
}

/// Each distinct product of a layer of `widths` at `rows` rows alone, on one thread, repeated on
/// the same operands, its time and rate printed; then `layers` such layers' products at those
/// rates: (seconds, FLOPs).
fn rates_of_shapes(
    one: &rayon::ThreadPool,
    rows: usize,
    widths: Widths,
    layers: usize,
) -> candle_core::Result<(f64, f64)> {
    let dev = Device::Cpu;
    let mut rates = std::collections::HashMap::new();
    let layer = layer_products(rows, widths);
    for p in &layer {
        let label = p.label();
        if rates.contains_key(&label) {
            continue;
        }
        let operands = p.operands(&dev)?;
        let secs = one.install(|| least(|| p.in_cache(&operands)));
        println!(
            "{label:36} one thread: {:8.1} us, {:5.1} GFLOP/s",
            secs * 1e6,
            p.flops() / secs / 1e9
        );
        rates.insert(label, secs);
    }
    let n = layers as f64;
    let secs: f64 = n * layer.iter().map(|p| rates[&p.label()]).sum::<f64>();
    let flops: f64 = n * layer.iter().map(Product::flops).sum::<f64>();
    Ok((secs, flops))
}

/// Which factor a group's separate products share, as `layer_grad` gives them one tensor: the
/// normed input (the forward's left factor, the weights' gradients' right one), or none (the
/// input's gradient, whose later products are summed into the first's result).
#[derive(Clone, Copy)]
enum Shared {
    Left,
    Right,
    Sum,
}

/// One layer's products of a group, with their (left, right) factors.
type GroupLayer<'p> = (Vec<&'p Product>, Vec<(Tensor, Tensor)>);

/// The `fused` measurement: each group of products the projections of one input make, apart and
/// as one product, in cache (the same operands again) and as a lane's step meets them (four
/// layers' operands of their own, the results kept).
fn fused_against_separate(one: &rayon::ThreadPool) -> candle_core::Result<()> {
    let dev = Device::Cpu;
    let Widths {
        hidden: h,
        kv,
        mlp: ff,
    } = TINY;
    let r = LANE_ROWS;
    let p = Product::new;
    let qkv = h + 2 * kv;
    let groups = [
        (
            "forward q, k, v",
            Shared::Left,
            vec![
                p(r, h, h, false, true, false),
                p(r, h, kv, false, true, false),
                p(r, h, kv, false, true, false),
            ],
            p(r, h, qkv, false, true, false),
        ),
        (
            "forward gate, up",
            Shared::Left,
            vec![
                p(r, h, ff, false, true, false),
                p(r, h, ff, false, true, false),
            ],
            p(r, h, 2 * ff, false, true, false),
        ),
        (
            "weights' gradients q, k, v",
            Shared::Right,
            vec![
                p(h, r, h, true, false, false),
                p(kv, r, h, true, false, false),
                p(kv, r, h, true, false, false),
            ],
            p(qkv, r, h, true, false, false),
        ),
        (
            "weights' gradients gate, up",
            Shared::Right,
            vec![
                p(ff, r, h, true, false, false),
                p(ff, r, h, true, false, false),
            ],
            p(2 * ff, r, h, true, false, false),
        ),
        (
            "input's gradient from q, k, v",
            Shared::Sum,
            vec![
                p(r, h, h, false, false, false),
                p(r, kv, h, false, false, true),
                p(r, kv, h, false, false, true),
            ],
            p(r, qkv, h, false, false, false),
        ),
        (
            "input's gradient from gate, up",
            Shared::Sum,
            vec![
                p(r, ff, h, false, false, false),
                p(r, ff, h, false, false, true),
            ],
            p(r, 2 * ff, h, false, false, false),
        ),
    ];
    // A group's factors, the shared one made once: (left, right) per product.
    let factors = |ps: &[Product], shared: Shared| -> candle_core::Result<Vec<(Tensor, Tensor)>> {
        let mut out: Vec<(Tensor, Tensor)> = Vec::new();
        for p in ps {
            let (a, b, _) = p.operands(&dev)?;
            out.push(match (shared, out.first()) {
                (Shared::Left, Some((a0, _))) => (a0.clone(), b),
                (Shared::Right, Some((_, b0))) => (a, b0.clone()),
                _ => (a, b),
            });
        }
        Ok(out)
    };
    // Each layer's products in order, the summed ones added into the layer's first result.
    let run = |layers: &[GroupLayer]| {
        let mut kept = Vec::new();
        for (ps, fs) in layers {
            let mut first: Option<Tensor> = None;
            for (p, (a, b)) in ps.iter().zip(fs) {
                match (&first, p.add) {
                    (Some(sum), true) => matmul_add(sum, a, b).expect("product"),
                    _ => first = Some(matmul(a, b).expect("product")),
                }
            }
            kept.extend(first);
        }
        std::hint::black_box(kept);
    };
    let mut totals = [[0.0; 2]; 2];
    for (name, shared, separate, fused) in &groups {
        let mut secs = [[0.0; 2]; 2];
        for (way, ps) in [separate.as_slice(), std::slice::from_ref(fused)]
            .into_iter()
            .enumerate()
        {
            let layer = |_| -> candle_core::Result<GroupLayer> {
                Ok((ps.iter().collect(), factors(ps, *shared)?))
            };
            let once = [layer(0)?];
            secs[way][0] = one.install(|| least(|| run(&once)));
            let step = (0..LAYERS)
                .map(layer)
                .collect::<candle_core::Result<Vec<_>>>()?;
            secs[way][1] = one.install(|| least(|| run(&step))) / LAYERS as f64;
        }
        for (total, s) in totals.iter_mut().zip(secs) {
            total[0] += s[0];
            total[1] += s[1];
        }
        println!(
            "{name:30} in cache: apart {:6.1} us, as one {:6.1} us; a layer of a lane's step: apart {:6.1} us, as one {:6.1} us",
            secs[0][0] * 1e6,
            secs[1][0] * 1e6,
            secs[0][1] * 1e6,
            secs[1][1] * 1e6
        );
    }
    println!(
        "a layer, all six: in cache apart {:.1} us, as one {:.1} us ({:.2}x); in a lane's step apart {:.1} us, as one {:.1} us ({:.2}x)",
        totals[0][0] * 1e6,
        totals[1][0] * 1e6,
        totals[0][0] / totals[1][0],
        totals[0][1] * 1e6,
        totals[1][1] * 1e6,
        totals[0][1] / totals[1][1]
    );
    Ok(())
}
