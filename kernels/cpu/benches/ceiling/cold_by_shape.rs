//! `cold-by-shape`: where the step's products lose to the caches. The 84 products of `products`
//! (one lane's tiny step, each on operands of its own, run in the step's order with the results
//! kept) are timed one by one, each product's least time over ten passes of the whole list, and
//! summed by shape; beside each shape, the same product alone in cache (as `shapes` times it).
//! The difference is what that shape pays for starting cold: its operands read from memory, its
//! output's lines fetched before they are written.
//!
//! On the Zen 4 host (benches/RESULTS.md's git history) the cold list took 31.0 ms against
//! 26.4 ms in cache; the products of depth 64 and 128 into narrow outputs (480 x 128, 480 x 64)
//! lost the most, 26-33% of their rate, the depth-512 ones 4-7%.

use std::collections::BTreeMap;
use std::time::Instant;

use super::{lane_step_products, least};

/// Passes over the whole list; each product's least time over them is kept.
const PASSES: usize = 10;

/// A shape's products: how many, their seconds cold (summed), their FLOPs, and one of them alone
/// in cache.
#[derive(Default)]
struct Shape {
    count: usize,
    cold_secs: f64,
    flops: f64,
    warm_secs: f64,
}

pub fn cold_by_shape(one: &rayon::ThreadPool) -> candle_core::Result<()> {
    let (products, operands) = lane_step_products()?;
    let mut cold = vec![f64::INFINITY; products.len()];
    one.install(|| {
        for _ in 0..PASSES {
            let mut kept = Vec::with_capacity(products.len());
            for (i, (p, operands)) in products.iter().zip(&operands).enumerate() {
                let t = Instant::now();
                p.run(operands, &mut kept);
                cold[i] = cold[i].min(t.elapsed().as_secs_f64());
            }
            std::hint::black_box(kept);
        }
    });
    let mut shapes: BTreeMap<String, Shape> = BTreeMap::new();
    for ((p, operands), secs) in products.iter().zip(&operands).zip(&cold) {
        let shape = shapes.entry(p.label()).or_default();
        if shape.count == 0 {
            shape.warm_secs = one.install(|| least(|| p.in_cache(operands)));
        }
        shape.count += 1;
        shape.cold_secs += secs;
        shape.flops += p.flops();
    }
    let (mut cold_total, mut warm_total) = (0.0, 0.0);
    for (label, s) in &shapes {
        let warm = s.warm_secs * s.count as f64;
        cold_total += s.cold_secs;
        warm_total += warm;
        println!(
            "{label:36} x{:2}: cold {:7.1} us ({:5.1} GFLOP/s), in cache {:7.1} us ({:5.1} GFLOP/s): {:+6.1} us cold",
            s.count,
            s.cold_secs * 1e6,
            s.flops / s.cold_secs / 1e9,
            warm * 1e6,
            s.flops / warm / 1e9,
            (s.cold_secs - warm) * 1e6
        );
    }
    println!(
        "one lane's {} products one by one as the step meets them: {:.1} ms; in cache {:.1} ms ({:.2}x)",
        products.len(),
        cold_total * 1e3,
        warm_total * 1e3,
        cold_total / warm_total
    );
    Ok(())
}
