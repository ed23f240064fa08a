//! Every RL/SFT option is reachable from a config: each override below runs two RL steps of a micro
//! model through the real pipeline, and the metrics it must produce are present and finite.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use roll::config::RunConfig;
use roll::config::load::{apply_overrides, from_yaml_str, validated};
use roll::metrics::MemorySink;
use roll::pipeline::{RunStatus, Silent, run};

const BASE: &str = r#"
name: options
seed: 11
model:
  init: { arch: qwen2, hidden: 16, layers: 1, heads: 2, kv_heads: 1, intermediate: 32, chars: "0123456789+=abc>" }
data:
  domains:
    - { name: add, synthetic: { task: addition, count: 16, digits: 1 }, reward: math_rule }
    - { name: rev, synthetic: { task: reversal, count: 16, min_len: 2, max_len: 3, alphabet: abc }, reward: exact_match, ratio: 0.5 }
sft: { steps: 2, batch_size: 4, micro_batch_size: 3, optimizer: { lr: 0.01, schedule: cosine, warmup_steps: 1 } }
rl:
  steps: 2
  prompts_per_step: 4
  group_size: 3
  rollout_batch: 5
  sampling: { temperature: 1.0, max_new_tokens: 4 }
  optimizer: { lr: 0.001 }
"#;

/// Run BASE with `overrides`; return the last RL step's metrics.
fn run_with(overrides: &[&str]) -> roll::metrics::Metrics {
    let dir = tempfile::tempdir().unwrap();
    let mut all: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
    all.push(format!("output_dir={}", dir.path().display()));
    let cfg: RunConfig = from_yaml_str(BASE, "<test>").unwrap();
    let cfg = validated(apply_overrides(cfg, &all).unwrap(), "<test>").unwrap();
    let mut sink = MemorySink::default();
    let stop = Arc::new(AtomicBool::new(false));
    let outcome = run(&cfg, &mut Silent, stop, &mut sink, None).unwrap();
    assert_eq!(outcome.status, RunStatus::Finished);
    let last = sink
        .records
        .into_iter()
        .rev()
        .find(|r| r.stage == "rl")
        .expect("an rl step");
    for (k, v) in &last.metrics {
        assert!(v.is_finite(), "{overrides:?}: metric {k} = {v}");
    }
    last.metrics
}

fn has(m: &roll::metrics::Metrics, keys: &[&str], ctx: &str) {
    for k in keys {
        assert!(
            m.contains_key(*k),
            "{ctx}: missing metric {k}; have {:?}",
            m.keys().collect::<Vec<_>>()
        );
    }
}

#[test]
fn every_advantage_estimator_runs() {
    for est in ["grpo", "rloo", "reinforce", "reinforce_plus_plus"] {
        let m = run_with(&[&format!("rl.adv_estimator={est}")]);
        has(
            &m,
            &[
                "adv/mean",
                "adv/std",
                "actor/pg_loss",
                "score/add/accuracy",
                "score/rev/accuracy",
            ],
            est,
        );
    }
    let m = run_with(&[
        "rl.adv_estimator=gae",
        "rl.critic={optimizer: {lr: 0.001}, value_clip: 0.5}",
        "rl.gamma=0.9",
        "rl.lambda=0.95",
    ]);
    has(
        &m,
        &[
            "critic/value_loss",
            "critic/vf_explained_var",
            "critic/grad_norm",
        ],
        "gae",
    );
}

#[test]
fn every_policy_loss_and_aggregation_runs() {
    for kind in ["ppo", "gspo", "tis", "topr", "cispo", "raft_pp", "vanilla"] {
        let m = run_with(&[&format!("rl.policy_loss.kind={kind}")]);
        has(
            &m,
            &[
                "actor/clip_frac_low",
                "actor/clip_frac_high",
                "actor/entropy",
            ],
            kind,
        );
    }
    for agg in [
        "token_mean",
        "seq_mean_token_sum",
        "seq_mean_token_mean",
        "seq_mean_token_sum_norm",
    ] {
        run_with(&[
            &format!("rl.policy_loss.agg={agg}"),
            "rl.policy_loss.norm_len=4",
        ]);
    }
    run_with(&[
        "rl.policy_loss.dual_clip=3.0",
        "rl.policy_loss.clip_high=0.28",
        "rl.policy_loss.tis_cap=1.5",
    ]);
}

#[test]
fn kl_modes_estimators_and_controllers_run() {
    let m = run_with(&["rl.kl={mode: in_reward, estimator: k1, coef: 0.05}"]);
    has(
        &m,
        &["actor/kl", "actor/kl_coef", "time/ref"],
        "kl in reward",
    );
    // Without KL there is no reference, and no time spent on one to record.
    let m = run_with(&["rl.kl={mode: none}"]);
    assert!(!m.contains_key("time/ref"), "{:?}", m.keys());
    for est in ["abs", "mse", "k3"] {
        let m = run_with(&[&format!(
            "rl.kl={{mode: in_loss, estimator: {est}, coef: 0.1, controller: adaptive, target: 0.01, horizon: 100}}"
        )]);
        has(&m, &["actor/kl"], est);
    }
}

#[test]
fn reward_shaping_masks_and_sampling_options_run() {
    for norm in ["group", "batch", "running"] {
        run_with(&[&format!("rl.reward_norm={norm}"), "rl.reward_clip=1.0"]);
    }
    run_with(&[
        "rl.adv_whiten=true",
        "rl.adv_clip=2.0",
        "rl.std_normalize=false",
        "rl.entropy_coef=0.01",
    ]);
    let m = run_with(&["rl.dynamic_sampling={enabled: true, max_rounds: 1}"]);
    has(
        &m,
        &["group/dropped", "group/frac_zero_std"],
        "dynamic sampling",
    );
    run_with(&[
        "rl.max_length_mask=true",
        "rl.difficulty_mask={low: 0.1, high: 0.9}",
    ]);
    run_with(&[
        "rl.sampling={temperature: 0.7, top_k: 3, top_p: 0.9, max_new_tokens: 3, stop_strings: ['1']}",
    ]);
    let m = run_with(&[
        "rl.ppo_epochs=2",
        "rl.mini_batches=2",
        "rl.micro_batch_size=5",
    ]);
    has(
        &m,
        &[
            "actor/approx_kl",
            "train_infer/logprob_abs_diff",
            "actor/lr",
        ],
        "epochs",
    );
}

#[test]
fn checkpoint_every_n_steps_and_same_seed_repeats() {
    let dir = tempfile::tempdir().unwrap();
    let cfg: RunConfig = from_yaml_str(BASE, "<test>").unwrap();
    let cfg = apply_overrides(
        cfg,
        &[
            format!("output_dir={}", dir.path().display()),
            "checkpoint.every=1".into(),
        ],
    )
    .unwrap();
    let mut sink = MemorySink::default();
    run(
        &cfg,
        &mut Silent,
        Arc::new(AtomicBool::new(false)),
        &mut sink,
        None,
    )
    .unwrap();
    assert_eq!(sink.checkpoints.len(), 4, "{:?}", sink.checkpoints);
    for name in ["sft-step1", "sft-step2", "rl-step1", "rl-step2"] {
        let ckpt = dir.path().join("checkpoints").join(name);
        assert!(
            ckpt.join("model.safetensors").is_file() && ckpt.join("trainer_state.json").is_file(),
            "{name}"
        );
    }
    let a = run_with(&[]);
    let b = run_with(&[]);
    let strip = |m: roll::metrics::Metrics| -> Vec<(String, f64)> {
        m.into_iter()
            .filter(|(k, _)| !k.starts_with("time/") && !k.starts_with("system/"))
            .collect()
    };
    assert_eq!(strip(a), strip(b), "same seed must give the same numbers");
}

/// BASE with a quarter of each domain held out and evaluated after every step.
fn held_out_config(eval: Option<&str>) -> RunConfig {
    let dir = tempfile::tempdir().unwrap().keep();
    let text = BASE
        .replace(
            "reward: math_rule }",
            "reward: math_rule, val_split: 0.25 }",
        )
        .replace("ratio: 0.5 }", "ratio: 0.5, val_split: 0.25 }");
    let mut overrides = vec![format!("output_dir={}", dir.display())];
    if let Some(extra) = eval {
        overrides.push(format!(
            "rl.eval={{every: 1, samples: 2, temperature: 1.0{extra}}}"
        ));
    }
    let cfg: RunConfig = from_yaml_str(&text, "<test>").unwrap();
    validated(apply_overrides(cfg, &overrides).unwrap(), "<test>").unwrap()
}

fn run_sink(cfg: &RunConfig) -> MemorySink {
    let mut sink = MemorySink::default();
    let stop = Arc::new(AtomicBool::new(false));
    let outcome = run(cfg, &mut Silent, stop, &mut sink, None).unwrap();
    assert_eq!(outcome.status, RunStatus::Finished);
    sink
}

#[test]
fn held_out_prompts_are_evaluated_and_never_trained_on() {
    let cfg = held_out_config(Some(""));
    let model = roll::pipeline::setup::load_policy(&cfg).unwrap();
    let domains = roll::pipeline::setup::load_domains(&cfg, &model).unwrap();
    let held: Vec<&str> = domains
        .domains
        .iter()
        .flat_map(|d| d.val.iter().map(|e| e.prompt.as_str()))
        .collect();
    // 16 examples each (some prompts repeat), a quarter of each domain's distinct prompts held
    // out with every copy; the rest is what every stage draws from.
    for d in &domains.domains {
        assert!(
            d.val.len() >= 3 && d.examples.len() >= 8,
            "{} {}",
            d.examples.len(),
            d.val.len()
        );
        assert!(
            d.examples
                .iter()
                .all(|e| !held.contains(&e.prompt.as_str()))
        );
    }
    let sink = run_sink(&cfg);
    let trained: Vec<&str> = sink.samples.iter().map(|s| s.prompt.as_str()).collect();
    assert!(!trained.is_empty());
    assert!(trained.iter().all(|p| !held.contains(p)), "{trained:?}");
    // Both domains' 4 held-out prompts, 2 samples each.
    let val: Vec<_> = sink
        .records
        .iter()
        .filter(|r| r.stage == "rl" && r.metrics.contains_key("val/add/prompts"))
        .collect();
    // Before training (the baseline, step 0) and after each of the 2 steps.
    let steps = |sink: &MemorySink| -> Vec<usize> {
        sink.records
            .iter()
            .filter(|r| r.stage == "rl" && r.metrics.contains_key("val/add/prompts"))
            .map(|r| r.step)
            .collect()
    };
    assert_eq!(steps(&sink), [0, 1, 2]);
    // The baseline is a record of its own, before the first step's.
    assert!(!val[0].metrics.contains_key("actor/pg_loss"));
    let no_baseline = run_sink(&held_out_config(Some(", before_training: false")));
    assert_eq!(steps(&no_baseline), [1, 2]);
    for r in &val {
        for d in ["add", "rev"] {
            let get = |k: &str| r.metrics[&format!("val/{d}/{k}")];
            // Each distinct held-out prompt once, however often the data repeats it.
            let val = &domains.domains.iter().find(|x| x.name == d).unwrap().val;
            let mut distinct: Vec<&str> = val.iter().map(|e| e.prompt.as_str()).collect();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(get("prompts"), distinct.len() as f64);
            assert!((0.0..=1.0).contains(&get("mean@2")));
            assert!(get("pass@2") >= get("accuracy"), "{:?}", r.metrics);
        }
    }
    // Evaluating leaves training alone: the same steps without rl.eval learn the same numbers.
    let plain = run_sink(&held_out_config(None));
    let learned = |sink: &MemorySink| -> Vec<(usize, String, f64)> {
        sink.records
            .iter()
            .filter(|r| r.stage == "rl" && r.metrics.contains_key("actor/pg_loss"))
            .flat_map(|r| {
                let keys = [
                    "actor/pg_loss",
                    "reward/add/mean",
                    "reward/rev/mean",
                    "adv/std",
                ];
                keys.map(|k| (r.step, k.to_string(), r.metrics[k]))
            })
            .collect()
    };
    assert_eq!(learned(&sink), learned(&plain));
}
