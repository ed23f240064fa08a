//! The fused head alone (`roll_cpu_kernels::head`): the logits' product, the log-probs and
//! entropies, and the chunked backward, at the Qwen2.5-0.5B shape of `engine qwen05-fwd_bwd`
//! (928 scored rows of 896, a vocabulary of 151,936; ~0.76 TFLOP, a quarter of that step's
//! arithmetic), with the weight's gradient left in a sink as the engine's tape takes it.
//!
//! Prints each of 7 repetitions (forward and backward) and their median, on the pool (both
//! cores).
//!
//! Run: `cargo bench -p roll-cpu-kernels --bench head` (record figures in benches/RESULTS.md).

use std::time::Instant;

use candle_core::{Device, Tensor, Var};
use roll_cpu_kernels::head::{WeightGradSink, head_logprobs};

const SEQUENCES: usize = 16;
/// Scored positions of a sequence: 64 tokens of which the 6 prompt tokens' first five predict
/// nothing scored, and the last predicts nothing.
const SCORED: usize = 58;
const HIDDEN: usize = 896;
const VOCAB: usize = 151_936;

fn main() -> candle_core::Result<()> {
    let dev = Device::Cpu;
    let hidden = Var::randn(0f32, 1.0, (SEQUENCES, SCORED, HIDDEN), &dev)?;
    let weight = Var::randn(0f32, 0.05, (VOCAB, HIDDEN), &dev)?;
    let rows = SEQUENCES * SCORED;
    let targets: Vec<u32> = (0..rows as u32).map(|i| i * 7919 % VOCAB as u32).collect();
    let targets = Tensor::from_vec(targets, (SEQUENCES, SCORED), &dev)?;
    let mut secs = Vec::new();
    for rep in 0..7 {
        let sink = WeightGradSink::default();
        let t = Instant::now();
        let (lp, h) = head_logprobs(
            hidden.as_tensor(),
            weight.as_tensor(),
            &targets,
            1.0,
            true,
            Some(&sink),
        )?;
        let grads = (lp.sum_all()? + h.sum_all()?)?.backward()?;
        let left = sink.close();
        let s = t.elapsed().as_secs_f64();
        assert!(grads.get(hidden.as_tensor()).is_some() && left.len() == 1);
        println!("head forward+backward, {rows} rows x {VOCAB} tokens, run {rep}: {s:.3} s");
        secs.push(s);
    }
    secs.sort_by(f64::total_cmp);
    println!("median of {}: {:.3} s", secs.len(), secs[secs.len() / 2]);
    Ok(())
}
