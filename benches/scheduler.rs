//! Scheduler benchmarks:
//!   1. simulation (virtual time, the real `SampleScheduler`, cost model `CostModel::GPU_LIKE`):
//!      α = 0 / 1 / 2, colocated against separate devices, continuous against static batching, and
//!      scaling over 8, 32 and 128 devices, on a heavy-tailed workload;
//!   2. scheduler overhead per sample (dispatch + reward routing) through trivial mock engines;
//!   3. offload/reload throughput of `HostArea` against a memcpy ceiling measured here.
//!
//! Run: `cargo bench --bench scheduler [sim|overhead|offload]` (a name runs that section only);
//! `SCHED_BENCH_QUICK=1` runs fewer steps and repetitions. Record the figures in benches/RESULTS.md.

use std::time::Instant;

use candle_core::{DType, Device, Tensor, Var};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use roll::scheduler::host_copy::HostArea;
use roll::scheduler::sim::{
    Batching, CostModel, ResponseLengths, SimConfig, SimPlacement, SimReport, Workload, simulate,
};
use roll::scheduler::{RolloutPolicy, SampleScheduler};

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn best(xs: &[f64]) -> f64 {
    xs.iter().copied().fold(f64::INFINITY, f64::min)
}

/// The pipeline's policy (`rollout_loop::policy_of`) for group 8 and
/// `rl.dynamic_sampling { enabled: true, max_rounds: 2, oversample }`.
fn policy_with(prompts_per_step: usize, async_ratio: usize, oversample: f64) -> RolloutPolicy {
    let margin = (prompts_per_step as f64 * oversample).ceil() as usize;
    RolloutPolicy {
        prompts_per_step,
        group_size: 8,
        max_prompts_per_version: prompts_per_step * 3 + margin,
        oversample,
        filter_flat: true,
        async_ratio,
    }
}

const OVERSAMPLE: f64 = 0.25;

fn policy(prompts_per_step: usize, async_ratio: usize) -> RolloutPolicy {
    policy_with(prompts_per_step, async_ratio, OVERSAMPLE)
}

/// 90% of responses 32-256 tokens, 10% at 2048; 128-token prompts.
fn heavy_tail() -> Workload {
    Workload {
        lengths: ResponseLengths::HeavyTail {
            p_long: 0.1,
            long_tokens: 2048,
            short_min: 32,
            short_max: 256,
        },
        prompt_tokens: 128,
    }
}

fn config(
    steps: usize,
    prompts_per_step: usize,
    async_ratio: usize,
    batching: Batching,
    placement: SimPlacement,
) -> SimConfig {
    SimConfig {
        seed: 2026,
        steps,
        policy: policy(prompts_per_step, async_ratio),
        workload: heavy_tail(),
        cost: CostModel::GPU_LIKE,
        batching,
        placement,
    }
}

fn split(devices: usize) -> SimPlacement {
    SimPlacement::Separate {
        infer_devices: devices / 2,
        train_devices: devices - devices / 2,
    }
}

fn run(cfg: &SimConfig) -> SimReport {
    simulate(cfg).expect("the benchmark's quotas leave room for filtered groups")
}

const SIM_HEADER: &str = "| setup | wall s | s/step | speedup | trained tok/s | mean trained len | \
     wasted tokens | aborted | filtered | stale dropped | staleness mean/max | infer util | slot occupancy |\n\
     | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |";

fn sim_row(name: &str, r: &SimReport, baseline_s: f64) {
    println!(
        "| {name} | {:.1} | {:.2} | {:.2}x | {:.0} | {:.0} | {:.0}% | {} | {} | {} | {:.2}/{} | {:.2} | {:.2} |",
        r.wall_s,
        r.wall_s / r.step_s.len() as f64,
        baseline_s / r.wall_s,
        r.tokens_trained as f64 / r.wall_s,
        r.mean_trained_tokens(),
        100.0 * (1.0 - r.tokens_trained as f64 / r.tokens_generated.max(1) as f64),
        r.samples_aborted,
        r.groups_filtered,
        r.samples_dropped_stale,
        r.staleness_mean,
        r.staleness_max,
        r.infer_utilisation,
        r.slot_occupancy,
    );
}

fn bench_simulation(quick: bool) {
    let steps = if quick { 5 } else { 20 };
    let c = &CostModel::GPU_LIKE;
    println!(
        "## Simulation: {steps} steps, group 8, 10% of responses 2048 tokens, 90% 32-256, filter \
         flat groups, oversample {OVERSAMPLE}, quota 3 x prompts_per_step + margin"
    );
    println!(
        "cost: decode step {} ms + {} ms/seq, prefill {} ms/seq, max_batch {}, train {} ms/token, \
         sync {} ms, swap {} ms, reward {} ms\n",
        c.step_base_ms,
        c.step_per_seq_ms,
        c.prefill_ms_per_seq,
        c.max_batch,
        c.train_ms_per_token,
        c.sync_ms,
        c.swap_ms,
        c.reward_ms
    );
    let started = Instant::now();
    let mut targets = vec![];
    for pps in [32, 64] {
        println!("### α, 8 devices, prompts_per_step {pps}, continuous batching\n{SIM_HEADER}");
        let sync = run(&config(
            steps,
            pps,
            0,
            Batching::Continuous,
            SimPlacement::Colocated { devices: 8 },
        ));
        sim_row("α=0 colocated 8", &sync, sync.wall_s);
        for alpha in [0, 1, 2] {
            let r = run(&config(steps, pps, alpha, Batching::Continuous, split(8)));
            sim_row(&format!("α={alpha} separate 4+4"), &r, sync.wall_s);
            if alpha == 2 {
                targets.push(format!(
                    "α=2 separate 4+4 against α=0 colocated 8, prompts_per_step {pps}: {:.2}x \
                     (target >= 2.5x)",
                    sync.wall_s / r.wall_s
                ));
            }
        }
        println!();
    }

    for pps in [32, 64] {
        println!("### batching, 8 devices, prompts_per_step {pps}\n{SIM_HEADER}");
        for (name, alpha, placement) in [
            ("α=0 colocated 8", 0, SimPlacement::Colocated { devices: 8 }),
            ("α=2 separate 4+4", 2, split(8)),
        ] {
            let stat = run(&config(steps, pps, alpha, Batching::Static, placement));
            let cont = run(&config(steps, pps, alpha, Batching::Continuous, placement));
            sim_row(&format!("{name} static"), &stat, stat.wall_s);
            sim_row(&format!("{name} continuous"), &cont, stat.wall_s);
            targets.push(format!(
                "continuous against static, {name}, prompts_per_step {pps}: {:.2}x (target >= 1.8x)",
                stat.wall_s / cont.wall_s
            ));
        }
        println!();
    }

    println!(
        "### scaling: prompts_per_step = 8 x devices, continuous batching (speedup: against α=0 \
         on the same devices)\n{SIM_HEADER}"
    );
    let mut per_device_8 = [0.0; 2];
    let mut efficiency = vec![];
    for devices in [8, 32, 128] {
        let pps = 8 * devices;
        let sync = run(&config(
            steps,
            pps,
            0,
            Batching::Continuous,
            SimPlacement::Colocated { devices },
        ));
        let async2 = run(&config(steps, pps, 2, Batching::Continuous, split(devices)));
        sim_row(
            &format!("{devices} devices α=0 colocated"),
            &sync,
            sync.wall_s,
        );
        sim_row(
            &format!(
                "{devices} devices α=2 {}+{}",
                devices / 2,
                devices - devices / 2
            ),
            &async2,
            sync.wall_s,
        );
        for (i, r) in [&sync, &async2].into_iter().enumerate() {
            let per_device = r.tokens_trained as f64 / r.wall_s / devices as f64;
            if devices == 8 {
                per_device_8[i] = per_device;
            }
            efficiency.push(format!(
                "{devices} devices {}: {:.0} trained tokens/s per device, {:.0}% of 8-device",
                ["α=0", "α=2"][i],
                per_device,
                100.0 * per_device / per_device_8[i]
            ));
        }
    }
    println!();
    for line in efficiency {
        println!("- {line}");
    }
    println!(
        "\n### what moves the α figures: 8 devices, prompts_per_step 64, continuous batching \
         (speedup: against α=0 colocated 8 with oversample {OVERSAMPLE})\n{SIM_HEADER}"
    );
    let baseline = run(&config(
        steps,
        64,
        0,
        Batching::Continuous,
        SimPlacement::Colocated { devices: 8 },
    ));
    for oversample in [0.5, 1.0] {
        let r = run(&SimConfig {
            policy: policy_with(64, 0, oversample),
            ..config(
                steps,
                64,
                0,
                Batching::Continuous,
                SimPlacement::Colocated { devices: 8 },
            )
        });
        sim_row(
            &format!("α=0 colocated 8, oversample {oversample}"),
            &r,
            baseline.wall_s,
        );
    }
    for (infer_devices, train_devices) in [(4, 4), (5, 3), (6, 2)] {
        let placement = SimPlacement::Separate {
            infer_devices,
            train_devices,
        };
        let r = run(&config(steps, 64, 2, Batching::Continuous, placement));
        sim_row(
            &format!("α=2 separate {infer_devices}+{train_devices}"),
            &r,
            baseline.wall_s,
        );
    }
    println!("\n### targets");
    for line in targets {
        println!("- {line}");
    }
    println!(
        "\n(simulation sections took {:.1} s of real time)\n",
        started.elapsed().as_secs_f64()
    );
}

/// Drive the scheduler with `samples` samples that finish as soon as they are submitted.
fn overhead_once(samples: usize, async_ratio: usize, rng: &mut StdRng) -> f64 {
    let group_size = 8;
    let mut sched: SampleScheduler<u64, u32> = SampleScheduler::new(policy(64, async_ratio), 0);
    let mut engine: std::collections::VecDeque<(u64, usize)> = Default::default();
    let mut delivered = 0;
    let mut version = 0;
    let started = Instant::now();
    while delivered < samples {
        for _ in 0..sched.prompts_wanted() {
            let group = sched.dispatch(version as u64);
            engine.extend((0..group_size).map(|i| (group, i)));
        }
        // The mock engine finishes everything submitted at once, in submission order.
        while let Some((group, index)) = engine.pop_front() {
            let reward = if rng.random::<bool>() { 1.0 } else { 0.0 };
            if sched.finish(group, index, index as u32, reward) {
                delivered += 1;
            }
        }
        while let Some(batch) = sched.take_batch() {
            std::hint::black_box(&batch);
            if async_ratio == 0 {
                sched.abort_in_flight();
            }
            version += 1;
            sched.set_version(version);
        }
    }
    std::hint::black_box(sched.take_stats());
    started.elapsed().as_secs_f64() * 1e9 / delivered as f64
}

fn bench_overhead(quick: bool) {
    let reps = if quick { 3 } else { 9 };
    let samples = 10_000;
    println!(
        "## Scheduler overhead: {samples} samples, group 8, 64 prompts per step, mock engines\n"
    );
    println!("| α | ns/sample (median of {reps}) | min |\n| --- | --- | --- |");
    let mut rng = StdRng::seed_from_u64(4);
    for alpha in [0, 2] {
        let times: Vec<f64> = (0..reps)
            .map(|_| overhead_once(samples, alpha, &mut rng))
            .collect();
        println!(
            "| {alpha} | {:.0} | {:.0} |",
            median(times.clone()),
            best(&times)
        );
    }
    println!();
}

fn bench_offload(quick: bool) {
    let reps = if quick { 2 } else { 5 };
    let tensors = 16;
    let elems = 4 << 20; // 16 MiB of f32 each, 256 MiB in all
    let bytes = (tensors * elems * 4) as f64;
    let dev = Device::Cpu;
    let mut rng = StdRng::seed_from_u64(5);
    let vars: Vec<(String, Var)> = (0..tensors)
        .map(|i| {
            let data: Vec<f32> = (0..elems).map(|_| rng.random::<f32>()).collect();
            let t = Tensor::from_vec(data, elems, &dev).expect("tensor");
            (
                format!("layer.{i}.weight"),
                Var::from_tensor(&t).expect("var"),
            )
        })
        .collect();
    let area = HostArea::new().expect("host area");
    let (mut offload, mut read, mut reload) = (vec![], vec![], vec![]);
    // An in-process role's offload: the same tensors over the copy already there.
    let mut rewrite = vec![];
    for _ in 0..reps {
        let snapshot: Vec<(String, Tensor)> = vars
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
            .collect();
        let t = Instant::now();
        let written = area.write("policy", &snapshot).expect("offload");
        offload.push(written as f64 / t.elapsed().as_secs_f64() / 1e9);
        let t = Instant::now();
        let written = area
            .overwrite("policy", &snapshot)
            .expect("offload in place");
        rewrite.push(written as f64 / t.elapsed().as_secs_f64() / 1e9);
        let zero = Tensor::zeros(elems, DType::F32, &dev).expect("zeros");
        for (_, v) in &vars {
            v.set(&zero).expect("clear");
        }
        // The file-to-tensor half of a reload alone, to show what setting the Vars adds.
        let t = Instant::now();
        let fresh = area.read("policy", &dev).expect("read");
        read.push(bytes / t.elapsed().as_secs_f64() / 1e9);
        drop(fresh);
        let t = Instant::now();
        let restored = area.read_into("policy", &vars).expect("reload");
        reload.push(restored as f64 / t.elapsed().as_secs_f64() / 1e9);
        assert_eq!(restored as f64, bytes);
    }
    let check = vars[3].1.as_tensor().sum_all().expect("sum");
    assert!(
        check.to_scalar::<f32>().expect("scalar") > 0.0,
        "reload restored the values"
    );

    let src = vec![7u8; bytes as usize];
    let mut dst = vec![0u8; bytes as usize];
    let memcpy: Vec<f64> = (0..reps.max(3))
        .map(|_| {
            let t = Instant::now();
            dst.copy_from_slice(&src);
            std::hint::black_box(&dst);
            bytes / t.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    let ceiling = memcpy.iter().copied().fold(0.0, f64::max);
    println!(
        "## Offload/reload through HostArea: {tensors} f32 Vars x 16 MiB = 256 MiB, {} \
         repetitions\n",
        reps
    );
    println!(
        "| copy | GB/s (median) | best | share of memcpy ceiling |\n| --- | --- | --- | --- |"
    );
    println!("| memcpy 256 MiB (copy_from_slice, best) | {ceiling:.1} | | 1.00 |");
    for (name, xs) in [
        ("offload (write: a new file)", offload),
        ("offload in place (overwrite)", rewrite),
        ("reload (read_into)", reload),
        ("  of which file to new tensors (read)", read),
    ] {
        let m = median(xs.clone());
        let top = xs.iter().copied().fold(0.0, f64::max);
        println!("| {name} | {m:.2} | {top:.2} | {:.2} |", m / ceiling);
    }
    println!();
}

fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let wants = |name: &str| filter.as_deref().is_none_or(|f| name.contains(f));
    let quick = std::env::var_os("SCHED_BENCH_QUICK").is_some();
    if wants("sim") {
        bench_simulation(quick);
    }
    if wants("overhead") {
        bench_overhead(quick);
    }
    if wants("offload") {
        bench_offload(quick);
    }
}
