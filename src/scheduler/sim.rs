//! A discrete-event simulator of rollout and training on virtual devices, driving the real
//! [`SampleScheduler`](super::SampleScheduler) so that benchmarks at device counts this machine lacks
//! measure the policy code that runs. Everything happens in virtual time; nothing sleeps. It owns
//! the cost model below and must not grow a second rollout policy: every decision about which prompt
//! goes out, which group trains and what is aborted comes from the scheduler.
//!
//! # Cost model (all times in virtual milliseconds)
//!
//! - Decode: a device runs one decode step at a time over its running sequences (at most
//!   `max_batch`); every running sequence gains one token per step, and a step costs
//!   `step_base_ms + step_per_seq_ms × running + prefill_ms_per_seq × admitted`, where `admitted` is
//!   the number of sequences that joined the batch at the start of that step (their prefill also
//!   yields their first token). Decode is memory-bound, so the per-sequence term is small next to
//!   the base. A response of `n` tokens finishes at the end of its `n`-th step.
//! - Batching: [`Batching::Continuous`] admits queued requests into free slots before every step;
//!   [`Batching::Static`] admits a new batch only when the device is idle and runs it until every
//!   sequence in it has finished (or was cancelled).
//! - Dispatch: the requests of a group go out one sample at a time, each to the inference device
//!   with the fewest queued + running sequences (lowest index on ties).
//! - Reward: a finished response is scored `reward_ms` after its last step (0 = at once, before the
//!   device starts its next step). Each prompt has a solve rate drawn uniformly from [0, 1) and each
//!   sample's reward is Bernoulli(solve rate), so a group of `g` is flat with probability
//!   2/(g + 1) (2/9 for g = 8) and the dynamic-sampling filter has work to do.
//! - Training a batch: `train_ms_per_token × tokens / train_devices`, where `tokens` counts every
//!   sample's `prompt_tokens` plus its response.
//! - Weight sync after each step: `sync_ms`. With [`SimPlacement::Separate`] the trainer is busy for
//!   it and each inference device pauses for it once its current decode step ends.
//! - [`SimPlacement::Colocated`]: training time-shares the same devices, so generation stops (each
//!   device finishes its current step) before a step trains, and the phase costs
//!   `swap_ms` (offload rollout state, reload the trainer) + training + `swap_ms` (back) + `sync_ms`.
//!   Like the run config, it requires α = 0.
//!
//! The driver follows the pipeline's protocol: it dispatches what `prompts_wanted()` asks (with α = 0
//! only while no step is training, so that rollout waits for the new weights), takes a batch whenever
//! the trainer is free, aborts what is in flight after taking a batch when α = 0, and calls
//! `set_version` when a step's training ends, cancelling the requests of the groups it aborts.
//! A step is complete when its weight sync ends; the wall time is the end of the last step.

mod device;
mod engine;
#[cfg(test)]
mod tests;

use super::RolloutPolicy;

/// Virtual-time costs; see the module documentation for the formulas.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    pub step_base_ms: f64,
    pub step_per_seq_ms: f64,
    pub prefill_ms_per_seq: f64,
    pub max_batch: usize,
    pub train_ms_per_token: f64,
    pub sync_ms: f64,
    pub swap_ms: f64,
    pub reward_ms: f64,
}

impl CostModel {
    /// A 7B-class model, one device = one H100/H200-class GPU. Decode: ~15 GB of bf16 weights read
    /// per step plus overheads (20 ms), KV reads and compute per sequence (0.15 ms), 64 slots.
    /// Prefill of a 128-token prompt: 128 × 14 GFLOP at ~500 TFLOP/s ≈ 3.5 ms. Training: ~70
    /// GFLOP per token (forward + backward + old/reference log-probs) at ~200 TFLOP/s ≈ 0.35 ms.
    /// Sync: broadcasting ~15 GB of weights, 1 s. Swap: offloading one role's sharded state over
    /// PCIe and reloading the other's, 1 s per switch. Rule-based rewards: instantaneous.
    pub const GPU_LIKE: CostModel = CostModel {
        step_base_ms: 20.0,
        step_per_seq_ms: 0.15,
        prefill_ms_per_seq: 3.5,
        max_batch: 64,
        train_ms_per_token: 0.35,
        sync_ms: 1000.0,
        swap_ms: 1000.0,
        reward_ms: 0.0,
    };
}

/// How long each response is, in tokens; drawn in dispatch order.
#[derive(Debug, Clone, PartialEq)]
pub enum ResponseLengths {
    /// With probability `p_long` a response is `long_tokens` long, otherwise uniform in
    /// `short_min..=short_max`.
    HeavyTail {
        p_long: f64,
        long_tokens: usize,
        short_min: usize,
        short_max: usize,
    },
    /// The n-th dispatched sample gets `lengths[n % lengths.len()]` (replaying a measured trace, or
    /// a hand-built case).
    Trace(Vec<usize>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub lengths: ResponseLengths,
    /// Tokens of each prompt: training cost only (prefill has its own per-sequence cost).
    pub prompt_tokens: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batching {
    Continuous,
    Static,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimPlacement {
    /// Rollout and training time-share the same devices.
    Colocated { devices: usize },
    /// Rollout and training run on their own devices.
    Separate {
        infer_devices: usize,
        train_devices: usize,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Seeds response lengths and rewards; the same config gives the same report.
    pub seed: u64,
    /// Training steps to simulate.
    pub steps: usize,
    pub policy: RolloutPolicy,
    pub workload: Workload,
    pub cost: CostModel,
    pub batching: Batching,
    pub placement: SimPlacement,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SimReport {
    /// Virtual time until the last step's weight sync ended.
    pub wall_s: f64,
    /// Each step's duration, end of the previous step to end of this one.
    pub step_s: Vec<f64>,
    /// Every decoded token, wasted ones included.
    pub tokens_generated: u64,
    /// Response tokens of samples that finished decoding (trained or not).
    pub tokens_finished: u64,
    /// Tokens decoded for sequences that were cancelled, or still running at the end.
    pub tokens_unfinished: u64,
    /// Response tokens in the batches trained.
    pub tokens_trained: u64,
    pub samples_trained: usize,
    /// Finished samples the scheduler refused (their group was aborted while they were scored).
    pub samples_refused: usize,
    pub prompts_dispatched: usize,
    pub samples_aborted: usize,
    pub groups_filtered: usize,
    pub samples_dropped_stale: usize,
    pub staleness_mean: f64,
    pub staleness_max: usize,
    /// Fraction of the wall time the inference devices spent in decode steps (mean over devices).
    pub infer_utilisation: f64,
    /// Mean running sequences over `max_batch`, over the wall time and the inference devices.
    pub slot_occupancy: f64,
}

impl SimReport {
    /// Mean response length of the samples trained: below the workload's mean when rollout keeps
    /// short responses and drops long ones as stale.
    pub fn mean_trained_tokens(&self) -> f64 {
        self.tokens_trained as f64 / self.samples_trained.max(1) as f64
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SimError {
    #[error("simulation config: {0}")]
    Invalid(String),
    #[error(
        "simulation stalled at {at_s:.3} s after {completed_steps} of {steps} steps: nothing is in \
         flight and no batch is ready (dispatch quota used up by filtered groups?)"
    )]
    Stalled {
        completed_steps: usize,
        steps: usize,
        at_s: f64,
    },
}

/// Run `cfg.steps` training steps in virtual time.
pub fn simulate(cfg: &SimConfig) -> Result<SimReport, SimError> {
    validate(cfg)?;
    engine::Engine::new(cfg).run()
}

fn validate(cfg: &SimConfig) -> Result<(), SimError> {
    let bad = |msg: String| Err(SimError::Invalid(msg));
    let (infer, train) = match cfg.placement {
        SimPlacement::Colocated { devices } => (devices, devices),
        SimPlacement::Separate {
            infer_devices,
            train_devices,
        } => (infer_devices, train_devices),
    };
    if infer == 0 || train == 0 {
        return bad(format!(
            "placement {:?} needs at least one device for rollout and one for training",
            cfg.placement
        ));
    }
    if matches!(cfg.placement, SimPlacement::Colocated { .. }) && cfg.policy.async_ratio > 0 {
        return bad(format!(
            "async_ratio is {} but placement is colocated: asynchronous rollout needs its own devices",
            cfg.policy.async_ratio
        ));
    }
    let p = &cfg.policy;
    if p.prompts_per_step == 0 || p.group_size == 0 {
        return bad(format!(
            "prompts_per_step ({}) and group_size ({}) must be at least 1",
            p.prompts_per_step, p.group_size
        ));
    }
    let c = &cfg.cost;
    if c.max_batch == 0 {
        return bad("max_batch must be at least 1".into());
    }
    let costs = [
        ("step_base_ms", c.step_base_ms),
        ("step_per_seq_ms", c.step_per_seq_ms),
        ("prefill_ms_per_seq", c.prefill_ms_per_seq),
        ("train_ms_per_token", c.train_ms_per_token),
        ("sync_ms", c.sync_ms),
        ("swap_ms", c.swap_ms),
        ("reward_ms", c.reward_ms),
    ];
    if let Some((name, v)) = costs.iter().find(|(_, v)| !(v.is_finite() && *v >= 0.0)) {
        return bad(format!("{name} must be a finite number >= 0, got {v}"));
    }
    match &cfg.workload.lengths {
        ResponseLengths::HeavyTail {
            p_long,
            long_tokens,
            short_min,
            short_max,
        } => {
            if !(0.0..=1.0).contains(p_long) || *long_tokens == 0 || *short_min == 0 {
                return bad(format!(
                    "heavy tail needs p_long in [0, 1] and lengths >= 1, got p_long {p_long}, \
                     long_tokens {long_tokens}, short_min {short_min}"
                ));
            }
            if short_min > short_max {
                return bad(format!(
                    "short_min {short_min} is greater than short_max {short_max}"
                ));
            }
        }
        ResponseLengths::Trace(lengths) => {
            if lengths.is_empty() || lengths.contains(&0) {
                return bad(format!(
                    "length trace must be non-empty with every length >= 1, got {lengths:?}"
                ));
            }
        }
    }
    Ok(())
}
