//! One RL update moves the policy the right way: the rewarded completion becomes more likely and the
//! unrewarded one less likely, for every policy loss.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use roll::algo::kl::KlController;
use roll::algo::normalize::RunningStats;
use roll::config::load::{apply_overrides, from_yaml_str};
use roll::config::{RlConfig, RunConfig};
use roll::model::{Arch, InitOptions, LoadedModel, init_model};
use roll::pipeline::rl_update::{RlBatch, UpdateOutput, UpdateState, update};
use roll::role::actor_train::ActorTrain;
use roll::train::AdamW;
use roll::train::batch::score_pair;

const CFG: &str = r#"
name: direction
model: { init: { arch: qwen2, hidden: 32, layers: 2, heads: 2, kv_heads: 1, intermediate: 64, chars: "x" } }
data: { domains: [ { name: d, synthetic: { task: addition, count: 1 }, reward: exact_match } ] }
rl: { steps: 1, prompts_per_step: 1, group_size: 4, sampling: { temperature: 1.0, max_new_tokens: 4 }, optimizer: { lr: 0.001, max_grad_norm: null } }
"#;

/// The tiny policy every test here updates (seeded: each call returns the same weights).
fn tiny_policy() -> LoadedModel {
    init_model(&InitOptions {
        arch: Arch::Qwen2,
        hidden: 32,
        layers: 2,
        heads: 2,
        kv_heads: 1,
        intermediate: 64,
        head_dim: None,
        tie_embeddings: true,
        max_positions: 32,
        rope_theta: 10_000.0,
        chars: "0123456789+=".into(),
        dtype: "float32".into(),
        seed: 5,
    })
    .unwrap()
}

/// One RL update of `model` on `batch` with a fresh optimizer and no reference or critic.
fn update_once(rl: &RlConfig, model: &LoadedModel, batch: &RlBatch) -> UpdateOutput {
    let vars: Vec<_> = model.transformer.params().named_vars();
    let mut actor = ActorTrain::Local {
        opt: AdamW::new(vars, rl.optimizer.clone(), 1).unwrap(),
        recipe: Box::new(rl.actor_recipe()),
    };
    let mut kl = KlController::new(Default::default(), 0.0, 0.1, 1e4);
    let mut running = RunningStats::new();
    let state = UpdateState {
        actor: &mut actor,
        reference: None,
        critic: None,
        kl_ctl: &mut kl,
        running: &mut running,
        opd: None,
        seed: 0,
    };
    update(rl, model, state, batch).unwrap()
}

#[test]
fn rewarded_completions_gain_probability() {
    for kind in ["ppo", "gspo", "tis", "topr", "cispo", "raft_pp", "vanilla"] {
        let model = tiny_policy();
        let cfg: RunConfig = from_yaml_str(CFG, "<test>").unwrap();
        let cfg = apply_overrides(cfg, &[format!("rl.policy_loss.kind={kind}")]).unwrap();
        let rl = cfg.rl.unwrap();
        let prompt = vec![4u32, 5, 13, 6, 14];
        let responses: Vec<Vec<u32>> =
            vec![vec![7, 8, 1], vec![9, 9, 1], vec![7, 8, 1], vec![3, 1]];
        let rewards = vec![1.0f32, 0.0, 1.0, 0.0];
        let seq_logprob = |r: &Vec<u32>| -> f32 {
            score_pair(&model.transformer, &prompt, r, 0)
                .unwrap()
                .iter()
                .sum()
        };
        let before: Vec<f32> = responses.iter().map(seq_logprob).collect();
        let batch = RlBatch {
            prompts: vec![prompt.clone(); 4],
            responses: responses.clone(),
            gen_logprobs: responses
                .iter()
                .map(|r| score_pair(&model.transformer, &prompt, r, 0).unwrap())
                .collect(),
            truncated: vec![false; 4],
            correct: rewards.clone(),
            rewards,
            response_masks: None,
            advantages: None,
            group_size: 4,
            tags: vec![],
        };
        update_once(&rl, &model, &batch);
        let after: Vec<f32> = responses.iter().map(seq_logprob).collect();
        assert!(
            after[0] > before[0],
            "{kind}: rewarded completion lost probability: {before:?} -> {after:?}"
        );
        if kind != "raft_pp" {
            // RAFT++ trains on positive samples only; the others push the unrewarded ones down.
            assert!(
                after[1] < before[1],
                "{kind}: unrewarded completion gained: {before:?} -> {after:?}"
            );
            assert!(
                after[3] < before[3],
                "{kind}: unrewarded completion gained: {before:?} -> {after:?}"
            );
        }
    }
}

/// Trains one update on four rows whose middle response token is context (an environment's text
/// between two turns) when `mask` is set, with that token's behaviour log-prob replaced by
/// `masked_old`; returns the policy's weights afterwards.
fn update_with_context_token(mask: bool, masked_old: Option<f32>) -> Vec<Vec<f32>> {
    let model = tiny_policy();
    let cfg: RunConfig = from_yaml_str(CFG, "<test>").unwrap();
    let rl = cfg.rl.unwrap();
    let prompt = vec![4u32, 5, 13, 6, 14];
    let responses: Vec<Vec<u32>> = vec![vec![7, 8, 9], vec![9, 9, 7], vec![7, 3, 9], vec![3, 4, 5]];
    let gen_logprobs = responses
        .iter()
        .map(|r| {
            let mut lp = score_pair(&model.transformer, &prompt, r, 0).unwrap();
            if let Some(v) = masked_old {
                lp[1] = v;
            }
            lp
        })
        .collect();
    let batch = RlBatch {
        prompts: vec![prompt.clone(); 4],
        responses,
        gen_logprobs,
        truncated: vec![false; 4],
        correct: vec![1.0, 0.0, 1.0, 0.0],
        rewards: vec![1.0, 0.0, 1.0, 0.0],
        advantages: None,
        response_masks: mask.then(|| vec![vec![1.0, 0.0, 1.0]; 4]),
        group_size: 4,
        tags: vec![],
    };
    update_once(&rl, &model, &batch);
    model
        .transformer
        .params()
        .named_vars()
        .iter()
        .map(|(_, v)| {
            v.as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .collect()
}

#[test]
fn context_tokens_of_a_response_are_not_trained() {
    // A masked token is no term of the loss: whatever its behaviour log-prob says (here an absurd
    // −30, which the PPO ratio would clip and count), the update is the same. Without the mask the
    // same absurd value changes the update, so the comparison can fail.
    let masked = update_with_context_token(true, None);
    assert_eq!(masked, update_with_context_token(true, Some(-30.0)));
    assert_ne!(
        update_with_context_token(false, None),
        update_with_context_token(false, Some(-30.0))
    );
    assert_ne!(masked, update_with_context_token(false, None));
}

#[test]
fn given_advantages_replace_the_estimator() {
    // Every reward 0: GRPO's advantages are all 0 and the update leaves the sequence log-probs
    // where they were (up to float noise). Given advantages (+1 on row 0, −1 on row 1, as the
    // agentic estimators hand them over) move row 0 up and row 1 down instead.
    let model = tiny_policy();
    let cfg: RunConfig = from_yaml_str(CFG, "<test>").unwrap();
    let rl = cfg.rl.unwrap();
    let prompt = vec![4u32, 5, 13, 6, 14];
    let responses: Vec<Vec<u32>> = vec![vec![7, 8, 1], vec![9, 9, 1], vec![7, 3, 1], vec![3, 1]];
    let seq_logprob = |r: &Vec<u32>| -> f32 {
        score_pair(&model.transformer, &prompt, r, 0)
            .unwrap()
            .iter()
            .sum()
    };
    let before: Vec<f32> = responses.iter().map(seq_logprob).collect();
    let given: Vec<Vec<f32>> = responses
        .iter()
        .enumerate()
        .map(|(i, r)| vec![[1.0, -1.0, 0.0, 0.0][i]; r.len()])
        .collect();
    let batch = RlBatch {
        prompts: vec![prompt.clone(); 4],
        responses: responses.clone(),
        gen_logprobs: responses
            .iter()
            .map(|r| score_pair(&model.transformer, &prompt, r, 0).unwrap())
            .collect(),
        truncated: vec![false; 4],
        correct: vec![0.0; 4],
        rewards: vec![0.0; 4],
        response_masks: None,
        advantages: Some(given),
        group_size: 4,
        tags: vec![],
    };
    let out = update_once(&rl, &model, &batch);
    let after: Vec<f32> = responses.iter().map(seq_logprob).collect();
    assert!(after[0] > before[0] + 1e-3, "{before:?} -> {after:?}");
    assert!(after[1] < before[1] - 1e-3, "{before:?} -> {after:?}");
    assert_eq!(out.sample_advantages, [1.0, -1.0, 0.0, 0.0]);
}
