//! Lanes: a micro-batch cut into parts whose passes run side by side must train exactly as those
//! parts would as micro-batches of their own, one after the other.

use super::*;
use crate::config::RlConfig;
use crate::config::RunConfig;
use crate::config::load::from_yaml_str;
use crate::model::hf_dir::{InitOptions, init_model};
use crate::model::{Arch, LoadedModel};
use crate::train::{AdamW, OptimizerConfig};

/// A tiny random policy (also the worker tests' model).
pub(crate) fn model() -> LoadedModel {
    init_model(&InitOptions {
        arch: Arch::Qwen2,
        hidden: 32,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        intermediate: 64,
        head_dim: None,
        tie_embeddings: true,
        max_positions: 32,
        rope_theta: 10_000.0,
        chars: "0123456789+=".into(),
        dtype: "float32".into(),
        seed: 5,
    })
    .expect("model")
}

pub(crate) fn rl() -> RlConfig {
    let cfg: RunConfig = from_yaml_str(
        "name: t\nmodel: { init: { arch: qwen2, hidden: 32, layers: 2, heads: 4, kv_heads: 2, \
         intermediate: 64, chars: \"0\" } }\n\
         data: { domains: [ { name: d, synthetic: { task: addition, count: 1 }, reward: exact_match } ] }\n\
         rl: { steps: 1, prompts_per_step: 2, group_size: 4, ppo_epochs: 2, mini_batches: 2 }\n",
        "<test>",
    )
    .expect("config");
    cfg.rl.expect("rl")
}

/// 8 ragged rows in 2 groups of 4, with advantages and behaviour log-probs of either sign.
pub(crate) fn step(micro: usize) -> ActorStep {
    let dev = Device::Cpu;
    let prompts: Vec<Vec<u32>> = (0..8u32)
        .map(|i| (0..1 + i % 3).map(|k| 3 + (i + k) % 9).collect())
        .collect();
    let responses: Vec<Vec<u32>> = (0..8u32)
        .map(|i| (0..2 + i % 4).map(|k| 3 + (i * 2 + k) % 9).collect())
        .collect();
    let width = 5;
    let mask: Vec<f32> = responses
        .iter()
        .flat_map(|r| (0..width).map(move |j| f32::from(u8::from(j < r.len()))))
        .collect();
    let t = |v: Vec<f32>| Tensor::from_vec(v, (8, width), &dev).expect("t");
    ActorStep {
        rows: EpochRows {
            prompts,
            responses,
            group_size: 4,
            micro,
            loss_mask: t(mask),
            seed: 11,
        },
        targets: Targets::Policy(PolicyTargets {
            temperature: 1.0,
            kl_coef: 0.0,
            adv: t((0..40).map(|i| ((i * 7 % 11) as f32 - 5.0) / 5.0).collect()),
            old_logp: t((0..40).map(|i| -2.0 - (i % 5) as f32 * 0.1).collect()),
            ref_logp: None,
        }),
    }
}

/// Train a fresh model for one step; its weights after, and the metrics.
fn train(micro: usize, lanes: usize) -> (Vec<Vec<f32>>, Metrics) {
    let m = model();
    let vars = m.transformer.params().named_vars();
    let mut opt = AdamW::new(
        vars.clone(),
        OptimizerConfig {
            lr: 1e-2,
            ..Default::default()
        },
        10,
    )
    .expect("opt");
    let metrics = actor::actor_epochs_in_lanes(
        &rl().actor_recipe(),
        &step(micro),
        &m.transformer,
        (m.pad_id, lanes),
        &mut opt,
    )
    .expect("epochs")
    .metrics;
    (weights(&vars), metrics)
}

/// Every parameter's values.
fn weights(vars: &[(String, candle_core::Var)]) -> Vec<Vec<f32>> {
    vars.iter()
        .map(|(_, v)| {
            v.as_tensor()
                .flatten_all()
                .and_then(|t| t.to_vec1())
                .expect("w")
        })
        .collect()
}

#[test]
fn lanes_train_exactly_as_their_parts_would_one_after_the_other() {
    // A mini-batch is one group of 4 rows, taken by length (prompt + response, `step`): rows
    // 0-3 are 1+2, 2+3, 3+4, 1+5 long, so in the order 0, 1, 3, 2; rows 4-7 are 2+2, 3+3, 1+4,
    // 2+5, so 4, 6, 5, 7. Micro-batches of 4 in 2 lanes cut each where the costlier lane is
    // cheapest (`lane_rows`): two and two (rows 3 and 2 pad to 3 + 5: 2 x 8 = 16; three and one
    // costs 3 x (2 + 5) = 21, one and three 3 x 8 = 24), the rows that micro-batches of 2 in
    // one lane take. Same sums in the same order: bit for bit.
    let (two_lanes, m2) = train(4, 2);
    let (small_micro, m1) = train(2, 1);
    assert_eq!(two_lanes, small_micro);
    assert_eq!(m2, m1);
    // And the step did move the weights, to about where whole micro-batches take them.
    let before = weights(&model().transformer.params().named_vars());
    let (whole, whole_metrics) = train(4, 1);
    let moved = |a: &[Vec<f32>], b: &[Vec<f32>]| {
        a.iter()
            .flatten()
            .zip(b.iter().flatten())
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    };
    assert!(
        moved(&two_lanes, &before) > 1e-3,
        "the step changed the weights"
    );
    // AdamW's first step moves each weight by about lr * sign(g) = 1e-2; only a weight whose
    // gradient nearly cancels to eps's size moves by an amount that a reordered sum shifts
    // (measured up to 1.2e-5). A lane trained wrong would be off by the step itself.
    assert!(
        moved(&two_lanes, &whole) < 1e-4,
        "lanes only reorder sums: {}",
        moved(&two_lanes, &whole)
    );
    // AdamW's step hides the gradient's scale (about lr * sign(g)); the metrics do not: a lane
    // weighted wrong would show in the loss and the gradient norm.
    assert_eq!(
        m2.keys().collect::<Vec<_>>(),
        whole_metrics.keys().collect::<Vec<_>>()
    );
    for (key, v) in &m2 {
        let w = whole_metrics[key];
        assert!(
            key.starts_with("time/") || (v - w).abs() <= 1e-4 * (1.0 + w.abs()),
            "{key}: lanes {v}, whole micro-batches {w}"
        );
    }
}

/// 4 preference pairs (rows 2k chosen, 2k+1 rejected, each pair one prompt) and the frozen
/// policy's per-token log-probs of them as the reference.
fn pairs_step(m: &LoadedModel, micro: usize) -> ActorStep {
    let dev = Device::Cpu;
    let prompts: Vec<Vec<u32>> = (0..8u32)
        .map(|i| (0..2 + i / 2 % 3).map(|k| 3 + (i / 2 + k) % 9).collect())
        .collect();
    let responses: Vec<Vec<u32>> = (0..8u32)
        .map(|i| (0..2 + i % 3).map(|k| 3 + (i * 5 + k) % 9).collect())
        .collect();
    let width = responses.iter().map(Vec::len).max().unwrap_or(0);
    let rows = crate::role::rows::Rows {
        prompts: &prompts,
        responses: &responses,
        micro: 8,
        width,
    };
    let ref_logp =
        crate::role::rows::response_logprobs(&m.transformer, m.pad_id, &rows, 1.0).expect("ref");
    ActorStep {
        rows: EpochRows {
            loss_mask: EpochRows::response_mask(&responses, &dev).expect("mask"),
            prompts,
            responses,
            group_size: 2,
            micro,
            seed: 3,
        },
        targets: Targets::Preference {
            ref_logp,
            pair_domains: vec![0, 1, 0, 1],
        },
    }
}

fn dpo(loss_type: crate::algo::preference::PreferenceLossType) -> crate::role::recipe::TrainRecipe {
    crate::role::recipe::TrainRecipe {
        optimizer: OptimizerConfig {
            lr: 1e-2,
            ..Default::default()
        },
        epochs: 1,
        mini_batches: 1,
        shuffle: false,
        objective: crate::role::recipe::Objective::Preference(
            crate::algo::preference::PreferenceParams {
                loss_type,
                beta: 0.1,
                label_smoothing: 0.0,
                weight: 1.0,
                sft_weight: 0.0,
            },
        ),
    }
}

#[test]
fn preference_pairs_start_at_the_losses_of_a_tie_and_learn_the_chosen_rows() {
    use crate::algo::preference::PreferenceLossType::{Ipo, Sigmoid};
    let m = model();
    let vars = m.transformer.params().named_vars();
    let recipe = dpo(Sigmoid);
    let mut opt = AdamW::new(vars, recipe.optimizer.clone(), 20).expect("opt");
    let step = pairs_step(&m, 8);
    let first = actor_epochs(&recipe, &step, &m.transformer, m.pad_id, &mut opt)
        .expect("dpo")
        .metrics;
    // The policy is the reference: every pair's z is 0, so DPO's loss is -log σ(0) = ln 2 and
    // every implicit reward 0 (up to the two forward paths' rounding).
    assert!(
        (first["loss"] - std::f64::consts::LN_2).abs() < 1e-5,
        "{first:?}"
    );
    // Pairs 0 and 2 are domain 0, 1 and 3 domain 1: two each, so the domains' means average to
    // the batch's.
    let halves_agree = |m: &Metrics, names: &[&str]| {
        for name in names {
            let whole = m[&format!("rewards/{name}")];
            let halves = (m[&format!("rewards/0/{name}")] + m[&format!("rewards/1/{name}")]) / 2.0;
            assert!((whole - halves).abs() < 1e-9, "{name}: {whole} vs {halves}");
        }
    };
    halves_agree(&first, &["accuracies", "margins", "chosen", "rejected"]);
    for key in ["rewards/chosen", "rewards/rejected", "rewards/margins"] {
        assert!(first[key].abs() < 1e-5, "{key}: {first:?}");
    }
    // The rows' summed log-probs, not their means: a random model is near uniform over its 15
    // tokens (12 characters, 3 special), about -ln 15 = -2.7 a token, and every row has 2 to 4
    // tokens, so a sum is below -5 where a mean would be near -2.7.
    assert!(
        first["logps/chosen"] < -4.0 && first["logps/rejected"] < -4.0,
        "{first:?}"
    );
    let mut last = first;
    for _ in 0..10 {
        last = actor_epochs(&recipe, &step, &m.transformer, m.pad_id, &mut opt)
            .expect("dpo")
            .metrics;
    }
    assert!(last["loss"] < 0.6, "{last:?}");
    halves_agree(&last, &["accuracies", "margins"]);
    assert_eq!(last["rewards/accuracies"], 1.0, "{last:?}");
    assert!(
        last["rewards/chosen"] > last["rewards/rejected"],
        "{last:?}"
    );

    // IPO at a tie: (0 - 1/(2 * 0.1))^2 = 25.
    let m = model();
    let vars = m.transformer.params().named_vars();
    let recipe = dpo(Ipo);
    let mut opt = AdamW::new(vars, recipe.optimizer.clone(), 20).expect("opt");
    let ipo = actor_epochs(
        &recipe,
        &pairs_step(&m, 8),
        &m.transformer,
        m.pad_id,
        &mut opt,
    )
    .expect("ipo")
    .metrics;
    assert!((ipo["loss"] - 25.0).abs() < 1e-3, "{ipo:?}");
}

#[test]
fn preference_micro_batches_keep_pairs_whole_and_sum_to_the_batch() {
    // Micro-batches of 1 row still take whole pairs (one pair each); their losses and gradients
    // add up to the whole batch's, up to reordered sums.
    let train = |micro: usize| {
        let m = model();
        let vars = m.transformer.params().named_vars();
        let recipe = dpo(crate::algo::preference::PreferenceLossType::Sigmoid);
        let mut opt = AdamW::new(vars.clone(), recipe.optimizer.clone(), 20).expect("opt");
        let step = pairs_step(&m, micro);
        let mut metrics = Metrics::new();
        for _ in 0..3 {
            metrics = actor_epochs(&recipe, &step, &m.transformer, m.pad_id, &mut opt)
                .expect("dpo")
                .metrics;
        }
        (weights(&vars), metrics)
    };
    let (w1, m1) = train(1);
    let (w8, m8) = train(8);
    for (key, v) in &m8 {
        assert!((m1[key] - v).abs() < 1e-4, "{key}: {} vs {v}", m1[key]);
    }
    let moved = w1
        .iter()
        .flatten()
        .zip(w8.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(moved < 1e-3, "{moved}");
}
