//! `roll-tui model bench`: generation and forward+backward tokens/s of a model on the device
//! `ROLL_DEVICE` names, and on a GPU the device memory a training step took, as one line (or
//! JSON) — the engine's side of the GPU check against Hugging Face (benches/gpu/). Each figure
//! is the median of `--runs` runs after one warm-up. On the CPU `cargo bench --bench engine`
//! measures more (lanes, peers); this runs one batch whole, as an accelerator wants it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use candle_core::Device;

use super::{BenchArgs, BenchShape};
use crate::device;
use crate::model::hf_dir::InitOptions;
use crate::model::{Arch, LoadedModel, Numerics, Tape, init_model, load_model_dir};
use crate::rollout::{Request, SamplingParams, generate};
use crate::train::batch::{TrainBatch, response_forward};

fn shape_options(shape: BenchShape, dtype: &str) -> InitOptions {
    let (hidden, layers, heads, kv_heads, intermediate, rope_theta, chars) = match shape {
        BenchShape::Tiny => (128, 4, 4, 2, 512, 10_000.0, "0123456789+=abc>".to_string()),
        // Qwen2.5-0.5B: its 151,936-row tied embedding from a 151,933-character alphabet.
        BenchShape::Qwen05 => (
            896,
            24,
            14,
            2,
            4864,
            1e6,
            (0x4E00u32..)
                .filter_map(char::from_u32)
                .take(151_933)
                .collect(),
        ),
    };
    InitOptions {
        arch: Arch::Qwen2,
        hidden,
        layers,
        heads,
        kv_heads,
        intermediate,
        head_dim: None,
        tie_embeddings: true,
        max_positions: 1024,
        rope_theta,
        chars,
        dtype: dtype.into(),
        seed: 1,
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The lowest free memory the driver reports while `work` runs, polled every 2 ms (candle's
/// CUDA allocator keeps freed blocks in the stream's pool, so the low-water mark is the peak).
fn lowest_free_during<T>(
    dev: &Device,
    work: impl FnOnce() -> Result<T>,
) -> Result<(T, Option<u64>)> {
    if dev.is_cpu() {
        return Ok((work()?, None));
    }
    let lowest = Arc::new(AtomicU64::new(u64::MAX));
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let (dev, lowest, done) = (dev.clone(), Arc::clone(&lowest), Arc::clone(&done));
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                if let Ok(Some(m)) = device::memory_of(&dev) {
                    lowest.fetch_min(m.free_bytes, Ordering::Relaxed);
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
        })
    };
    let out = work();
    done.store(true, Ordering::Relaxed);
    let _ = poller.join();
    Ok((out?, Some(lowest.load(Ordering::Relaxed))))
}

pub fn bench(args: BenchArgs) -> Result<()> {
    let dev = device::tool_device()?;
    let spec = device::spec_of(&dev);
    let dtype = match args.dtype.as_str() {
        "float32" | "f32" => "float32",
        "bfloat16" | "bf16" => "bfloat16",
        other => bail!("--dtype must be float32 or bfloat16, got '{other}'"),
    };
    let (model, what): (LoadedModel, String) = match (&args.dir, args.shape) {
        (Some(dir), None) => {
            let candle_dtype = if dtype == "bfloat16" {
                candle_core::DType::BF16
            } else {
                candle_core::DType::F32
            };
            (
                load_model_dir(dir, Some(candle_dtype), &dev)?,
                dir.display().to_string(),
            )
        }
        (None, Some(shape)) => (
            init_model(&shape_options(shape, dtype))?.to_device(&dev)?,
            format!("the {} shape (random weights)", shape.name()),
        ),
        (Some(_), Some(_)) => bail!("give a model directory or --shape, not both"),
        (None, None) => bail!("give a model directory to benchmark, or --shape tiny|qwen2.5-0.5b"),
    };
    let m = &model.transformer;
    let vocab = m.config().vocab_size as u32;
    if args.train_len < 8 || args.runs == 0 || args.batch == 0 || args.train_batch == 0 {
        bail!("--train-len must be at least 8, and --runs, --batch and --train-batch positive");
    }
    let token = |i: usize, k: usize| 3 + ((i * 7 + k * 11) as u32) % (vocab - 3);
    // Generation: 6-token prompts, exactly --new-tokens each (no EOS), T = 1.
    let mut gen_rates = vec![];
    for run in 0..=args.runs {
        let reqs = (0..args.batch)
            .map(|i| Request {
                id: i as u64,
                prompt_ids: (0..6).map(|k| token(i, k)).collect(),
                params: SamplingParams {
                    temperature: 1.0,
                    max_new_tokens: args.new_tokens,
                    ..Default::default()
                },
                seed: i as u64,
            })
            .collect();
        let t = Instant::now();
        let out = generate(m, &[], reqs, args.batch, None).context("generation")?;
        let tokens: usize = out.iter().map(|c| c.token_ids.len()).sum();
        if run > 0 {
            gen_rates.push(tokens as f64 / t.elapsed().as_secs_f64());
        }
    }
    // Forward+backward of the summed response log-probs over --train-batch x --train-len tokens.
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = (0..args.train_batch)
        .map(|i| {
            let prompt = (0..6).map(|k| token(i, k)).collect();
            let response = (0..args.train_len - 6).map(|k| token(i, k + 6)).collect();
            (prompt, response)
        })
        .collect();
    let rows: Vec<(&[u32], &[u32])> = pairs
        .iter()
        .map(|(p, r)| (p.as_slice(), r.as_slice()))
        .collect();
    let batch = TrainBatch::new(&rows, model.pad_id, m.config().kv_groups(), &dev)?;
    let free_before = device::memory_of(&dev)?.map(|m| m.free_bytes);
    let mut train_rates = vec![];
    let mut lowest = None::<u64>;
    for run in 0..=args.runs {
        let t = Instant::now();
        let ((), low) = lowest_free_during(&dev, || {
            let mut tape = Tape::default();
            let (logp, _) = response_forward(
                m,
                &batch,
                1.0,
                Numerics::Differentiable,
                false,
                Some(&mut tape),
            )?;
            let loss = logp.sum_all()?.neg()?;
            drop(logp);
            let grads = tape.backward(loss)?;
            dev.synchronize()?;
            drop(grads);
            Ok(())
        })?;
        lowest = match (lowest, low) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if run > 0 {
            train_rates
                .push((args.train_batch * args.train_len) as f64 / t.elapsed().as_secs_f64());
        }
    }
    let peak = free_before
        .zip(lowest)
        .map(|(before, low)| before.saturating_sub(low));
    let (generation, train) = (median(gen_rates), median(train_rates));
    if args.json {
        let line = serde_json::json!({
            "device": spec.to_string(),
            "model": what,
            "dtype": dtype,
            "params": m.params().num_params(),
            "generation": { "batch": args.batch, "new_tokens": args.new_tokens, "tokens_per_s": generation },
            "forward_backward": {
                "batch": args.train_batch, "len": args.train_len, "tokens_per_s": train,
                "peak_device_bytes": peak,
            },
        });
        println!("{line}");
    } else {
        println!(
            "{what} on {spec} in {dtype}: generation {generation:.0} tokens/s (batch {} x {} new); \
             forward+backward {train:.0} tokens/s ({} x {}){}",
            args.batch,
            args.new_tokens,
            args.train_batch,
            args.train_len,
            peak.map_or(String::new(), |p| format!(
                ", peak device memory {}",
                crate::text::human_bytes(p)
            ))
        );
    }
    Ok(())
}
