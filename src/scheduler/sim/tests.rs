use super::*;

/// Round numbers so every figure below can be added up by hand.
const HAND: CostModel = CostModel {
    step_base_ms: 10.0,
    step_per_seq_ms: 1.0,
    prefill_ms_per_seq: 5.0,
    max_batch: 8,
    train_ms_per_token: 0.5,
    sync_ms: 7.0,
    swap_ms: 3.0,
    reward_ms: 0.0,
};

const FREE: CostModel = CostModel {
    train_ms_per_token: 0.0,
    sync_ms: 0.0,
    swap_ms: 0.0,
    ..HAND
};

fn policy(prompts_per_step: usize, group_size: usize, async_ratio: usize) -> RolloutPolicy {
    RolloutPolicy {
        prompts_per_step,
        group_size,
        max_prompts_per_version: prompts_per_step,
        oversample: 0.0,
        filter_flat: false,
        async_ratio,
    }
}

fn traced(lengths: &[usize], policy: RolloutPolicy, cost: CostModel, devices: usize) -> SimConfig {
    SimConfig {
        seed: 1,
        steps: 1,
        policy,
        workload: Workload {
            lengths: ResponseLengths::Trace(lengths.to_vec()),
            prompt_tokens: 2,
        },
        cost,
        batching: Batching::Continuous,
        placement: SimPlacement::Colocated { devices },
    }
}

fn assert_close(got: f64, want: f64) {
    assert!((got - want).abs() < 1e-9, "got {got}, want {want}");
}

#[test]
fn synchronous_colocated_step_is_the_sum_of_its_parts() {
    let cfg = SimConfig {
        steps: 2,
        ..traced(&[4], policy(1, 2, 0), HAND, 1)
    };
    let r = simulate(&cfg).expect("runs");
    // Decode: step 1 admits both samples: 10 + 1×2 + 5×2 = 22 ms; steps 2-4: 10 + 1×2 = 12 ms
    // each; 58 ms. Training: (2 × 4 response + 2 × 2 prompt tokens) × 0.5 ms / 1 device = 6 ms,
    // between two 3 ms swaps; sync 7 ms. 58 + 3 + 6 + 3 + 7 = 77 ms a step.
    assert_eq!(r.step_s.len(), 2);
    assert_close(r.step_s[0], 0.077);
    assert_close(r.step_s[1], 0.077);
    assert_close(r.wall_s, 0.154);
    assert_eq!((r.tokens_generated, r.tokens_trained), (16, 16));
    assert_eq!(
        (r.samples_trained, r.samples_aborted, r.staleness_max),
        (4, 0, 0)
    );
    // Decoding 2 × 58 ms of 154; two of 8 slots in use while decoding.
    assert_close(r.infer_utilisation, 116.0 / 154.0);
    assert_close(r.slot_occupancy, 116.0 * 2.0 / 8.0 / 154.0);
}

#[test]
fn reward_latency_and_separate_training_devices_enter_the_step_time() {
    let cfg = SimConfig {
        placement: SimPlacement::Separate {
            infer_devices: 1,
            train_devices: 2,
        },
        cost: CostModel {
            reward_ms: 4.0,
            ..HAND
        },
        ..traced(&[4], policy(1, 2, 0), HAND, 1)
    };
    let r = simulate(&cfg).expect("runs");
    // 58 ms decode (as above) + 4 ms scoring + 12 tokens × 0.5 ms / 2 devices + 7 ms sync, no swaps.
    assert_close(r.wall_s, 0.072);
}

#[test]
fn continuous_batching_refills_slots_that_static_batching_leaves_empty() {
    let run = |batching| {
        let cfg = SimConfig {
            batching,
            ..traced(
                &[4, 1, 1, 1],
                policy(1, 4, 0),
                CostModel {
                    max_batch: 2,
                    prefill_ms_per_seq: 2.0,
                    ..FREE
                },
                1,
            )
        };
        simulate(&cfg).expect("runs").wall_s
    };
    // Continuous: [s0 s1] 10+2+2×2 = 16; s1 done, s2 joins: 10+2+2 = 14; s2 done, s3 joins: 14;
    // s0 alone: 11. 16 + 14 + 14 + 11 = 55 ms.
    assert_close(run(Batching::Continuous), 0.055);
    // Static: [s0 s1] 16, then s0 alone for 3 × 11 = 33, then [s2 s3] 16: 65 ms.
    assert_close(run(Batching::Static), 0.065);
}

#[test]
fn samples_go_to_the_least_loaded_device() {
    // Four samples on two devices: two each, so the step takes what two samples on one device take.
    let r = simulate(&traced(&[4], policy(1, 4, 0), FREE, 2)).expect("runs");
    assert_close(r.wall_s, 0.058);
    assert_close(r.infer_utilisation, 1.0);
    assert_close(r.slot_occupancy, 2.0 / 8.0);
}

#[test]
fn a_quota_used_up_by_filtered_groups_is_reported_as_a_stall() {
    // A group of one sample always has equal rewards, so the filter drops every group.
    let cfg = traced(
        &[3],
        RolloutPolicy {
            filter_flat: true,
            max_prompts_per_version: 3,
            ..policy(1, 1, 0)
        },
        HAND,
        1,
    );
    let e = simulate(&cfg).expect_err("no batch can form");
    assert!(
        matches!(
            e,
            SimError::Stalled {
                completed_steps: 0,
                steps: 1,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn invalid_configs_are_refused_with_the_value() {
    let cfg = traced(&[4], policy(1, 2, 1), HAND, 2);
    let e = simulate(&cfg).expect_err("async needs its own devices");
    assert!(e.to_string().contains("async_ratio is 1"), "{e}");
    let e = simulate(&traced(&[4, 0], policy(1, 2, 0), HAND, 1)).expect_err("zero length");
    assert!(e.to_string().contains("[4, 0]"), "{e}");
}

/// A small heavy-tailed workload on 2 + 2 devices.
fn heavy(seed: u64, async_ratio: usize) -> SimConfig {
    SimConfig {
        seed,
        steps: 8,
        policy: RolloutPolicy {
            prompts_per_step: 4,
            group_size: 4,
            max_prompts_per_version: 24,
            oversample: 0.25,
            filter_flat: true,
            async_ratio,
        },
        workload: Workload {
            lengths: ResponseLengths::HeavyTail {
                p_long: 0.1,
                long_tokens: 512,
                short_min: 8,
                short_max: 64,
            },
            prompt_tokens: 16,
        },
        cost: CostModel {
            max_batch: 8,
            train_ms_per_token: 2.0,
            sync_ms: 200.0,
            ..CostModel::GPU_LIKE
        },
        batching: Batching::Continuous,
        placement: SimPlacement::Separate {
            infer_devices: 2,
            train_devices: 2,
        },
    }
}

#[test]
fn every_token_is_accounted_once_and_batches_are_full() {
    for (seed, alpha) in [(0, 0), (1, 0), (2, 1), (3, 2), (4, 2)] {
        let cfg = heavy(seed, alpha);
        let r = simulate(&cfg).expect("runs");
        let at = format!("seed {seed}, α {alpha}: {r:?}");
        assert_eq!(
            r.tokens_generated,
            r.tokens_finished + r.tokens_unfinished,
            "{at}"
        );
        assert!(r.tokens_trained <= r.tokens_finished, "{at}");
        assert_eq!(r.samples_trained, 8 * 4 * 4, "{at}");
        assert_eq!(r.step_s.len(), 8, "{at}");
        assert_close(r.step_s.iter().sum::<f64>(), r.wall_s);
        assert!(r.staleness_max <= alpha, "{at}");
        assert!(
            r.infer_utilisation > 0.0 && r.infer_utilisation <= 1.0,
            "{at}"
        );
    }
}

#[test]
fn flat_groups_are_filtered_and_replaced() {
    let r = simulate(&heavy(5, 0)).expect("runs");
    // 2/5 of groups of four are flat under uniform solve rates: 32 trained groups bring ~20 flat.
    assert!(r.groups_filtered > 5, "{r:?}");
    assert_eq!(r.samples_trained, 8 * 16);
}

#[test]
fn asynchronous_rollout_is_never_slower_than_synchronous() {
    for seed in 0..6 {
        let sync = simulate(&heavy(seed, 0)).expect("α = 0");
        let async2 = simulate(&heavy(seed, 2)).expect("α = 2");
        assert!(
            async2.wall_s <= sync.wall_s,
            "seed {seed}: α = 2 took {} s, α = 0 {} s",
            async2.wall_s,
            sync.wall_s
        );
        assert!(
            async2.staleness_max > 0,
            "seed {seed}: α = 2 never ran ahead"
        );
    }
}

#[test]
fn the_same_seed_gives_the_same_report() {
    let cfg = heavy(7, 1);
    assert_eq!(simulate(&cfg).expect("a"), simulate(&cfg).expect("b"));
    let other = simulate(&SimConfig {
        seed: 8,
        ..cfg.clone()
    })
    .expect("c");
    assert_ne!(
        simulate(&cfg).expect("a").tokens_generated,
        other.tokens_generated
    );
}
