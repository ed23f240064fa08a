//! LoRA training end to end on the binary (`model.lora`): SFT, DPO and RL train only the adapter
//! (RL's actor_infer generating with it merged),
//! checkpoints hold the adapter in PEFT's format (no base weights), a killed run resumes to the
//! uninterrupted numbers, `model merge` turns a checkpoint into a model, and what is not supported
//! yet is refused by the config check.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::path::Path;

use candle_core::Device;
use common::{
    assert_same_metrics, bin, killed_and_resumed, ok, refused, roll, run_quiet, write_config,
};
use serde_json::Value;

const LORA: [&str; 2] = ["model.lora.rank=4", "model.lora.alpha=8"];

fn rest(dir: &Path) -> String {
    let pairs: String = [
        ("1+2=", "3", "1"),
        ("4+4=", "8", "0"),
        ("abc>", "cba", "abc"),
    ]
    .iter()
    .map(|(p, c, r)| {
        format!("{{\"prompt\": \"{p}\", \"chosen\": \"{c}\", \"rejected\": \"{r}\"}}\n")
    })
    .collect();
    std::fs::write(dir.join("pairs.jsonl"), pairs).unwrap();
    format!(
        "name: lo\nseed: 3\nsft: {{ steps: 8, batch_size: 8, optimizer: {{ lr: 0.01 }} }}\n\
         dpo: {{ data: {}, steps: 4, batch_size: 3, optimizer: {{ lr: 0.01 }} }}\n\
         checkpoint: {{ every: 3 }}\n",
        dir.join("pairs.jsonl").display()
    )
}

fn series(store: &Path, stage: &str, key: &str) -> Vec<f64> {
    common::stage_series(store, "lo", stage, key)
}

#[test]
fn sft_and_dpo_train_the_adapter_and_checkpoint_only_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = run_quiet(dir.path(), "lo", &rest(dir.path()), &LORA);
    let sft = series(&store, "sft", "sft/loss");
    assert!(sft[7] < sft[0], "{sft:?}");
    // DPO's reference is the policy as the stage starts (base and adapter): a tie, ln 2.
    let dpo = series(&store, "dpo", "loss");
    assert!((dpo[0] - std::f64::consts::LN_2).abs() < 1e-5, "{dpo:?}");
    let ckpt = dir.path().join("lo/checkpoints/dpo-step4");
    for f in [
        "adapter_config.json",
        "adapter_model.safetensors",
        "optimizer.safetensors",
    ] {
        assert!(ckpt.join(f).is_file(), "{f} in {}", ckpt.display());
    }
    assert!(
        !ckpt.join("model.safetensors").exists(),
        "no base weights in a LoRA checkpoint"
    );
    // The optimizer holds the adapter's moments only: 2 matrices x 7 modules x 1 layer, m and v.
    let moments =
        candle_core::safetensors::load(ckpt.join("optimizer.safetensors"), &Device::Cpu).unwrap();
    let names: Vec<&String> = moments.keys().filter(|k| k.contains("lora_")).collect();
    assert_eq!(
        names.len(),
        2 * 7 * 2,
        "{:?}",
        moments.keys().collect::<Vec<_>>()
    );
    assert!(
        moments
            .keys()
            .all(|k| k.contains("lora_") || !k.contains("weight")),
        "{:?}",
        moments.keys().collect::<Vec<_>>()
    );

    // actor_train in a worker process: SFT and DPO train the adapter there, to the same numbers,
    // and its checkpoints hold the same adapter and moments.
    let mut process = LORA.to_vec();
    process.push("workers.actor_train.mode=process");
    let there = run_quiet(dir.path(), "there", &rest(dir.path()), &process);
    assert_same_metrics(&store, &there, "lo");
    let theirs = dir.path().join("there/checkpoints/dpo-step4");
    for f in ["adapter_model.safetensors", "optimizer.safetensors"] {
        let (a, b) = (
            candle_core::safetensors::load(ckpt.join(f), &Device::Cpu).unwrap(),
            candle_core::safetensors::load(theirs.join(f), &Device::Cpu).unwrap(),
        );
        assert_eq!(a.len(), b.len(), "{f}");
        for (name, t) in &a {
            let bits = |t: &candle_core::Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(bits(t), bits(&b[name]), "{f}: {name}");
        }
    }
}

#[test]
fn rl_trains_the_adapter_and_actor_infer_generates_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let rl = "rl={steps: 4, prompts_per_step: 4, group_size: 4, kl: {mode: in_loss, coef: 0.05}, entropy_coef: 0.5, \
              sampling: {temperature: 1.0, max_new_tokens: 6}, optimizer: {lr: 0.05}}";
    let mut overrides = vec![rl, "dpo=null"];
    overrides.extend(LORA);
    let store = run_quiet(dir.path(), "lo", &rest(dir.path()), &overrides);
    // actor_infer generates with the adapter merged into its replica, re-merged after every
    // step: the log-probs it sampled with are the ones training computes with the adapter.
    // A replica left at the base (or a stale adapter) would be off by what each step moved.
    let diff = series(&store, "rl", "train_infer/logprob_abs_diff");
    assert_eq!(diff.len(), 4);
    assert!(diff.iter().all(|d| *d < 1e-4), "{diff:?}");
    let kl = series(&store, "rl", "actor/kl");
    assert!(
        kl[3] > 0.0,
        "the adapter moved the policy from its reference: {kl:?}"
    );
    let ckpt = dir.path().join("lo/checkpoints/rl-step4");
    assert!(ckpt.join("adapter_model.safetensors").is_file());
    assert!(!ckpt.join("model.safetensors").exists());
    // Weight sync hands actor_infer the adapter alone: rank 4 over the 7 linear layers of the
    // one-layer model (hidden 32, 2 heads of 16 with 1 KV head, intermediate 64), r (in + out)
    // f32s each — q, o 4·64, k, v 4·48, gate, up, down 4·96: 2,048 f32s, 8,192 bytes (the whole
    // model is ~30 KB).
    let sent = series(&store, "rl", "weight_sync/bytes");
    assert_eq!(sent, [8192.0; 4]);

    // A worker-process actor_infer is sent the adapter and merges it into the base it keeps:
    // it generates exactly what the in-process replica does, step after step.
    // actor_train in a worker process trains the adapter over the base it was sent once and
    // returns only the adapter each step: the same numbers again.
    let mut process = overrides.clone();
    process.extend([
        "workers.actor_infer.mode=process",
        "workers.actor_train.mode=process",
    ]);
    let there = run_quiet(dir.path(), "there", &rest(dir.path()), &process);
    assert_same_metrics(&store, &there, "lo");
}

/// actor_train in a worker process, killed inside the DPO stage: the resumed worker is sent the
/// checkpoint's adapter and its moments (under their PEFT names, as an in-process trainer saves
/// them) and the run ends with the numbers of an uninterrupted in-process one.
#[test]
fn a_lora_run_with_actor_train_in_a_worker_resumes_to_the_in_process_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let rest = rest(dir.path());
    let mut overrides = vec!["dpo.steps=8"];
    overrides.extend(LORA);
    let whole = run_quiet(dir.path(), "lo", &rest, &overrides);
    overrides.push("workers.actor_train.mode=process");
    let (store, resumed) = killed_and_resumed(dir.path(), "lo", &rest, &overrides, "dpo     5/");
    assert!(resumed.contains("resumed run 'lo' from "), "{resumed}");
    assert_same_metrics(&whole, &store, "lo");
}

/// `model.lora.dropout`: each training forward drops the adapter's inputs by masks drawn from
/// the step's seed — training changes (and still learns), and actor_train in a worker process
/// draws the same masks, to the same numbers.
#[test]
fn lora_dropout_changes_training_and_a_worker_draws_the_same_masks() {
    let dir = tempfile::tempdir().unwrap();
    let rest = rest(dir.path());
    let plain = run_quiet(dir.path(), "plain", &rest, &LORA);
    let mut dropped = LORA.to_vec();
    dropped.push("model.lora.dropout=0.3");
    let here = run_quiet(dir.path(), "here", &rest, &dropped);
    let (a, b) = (
        series(&plain, "sft", "sft/loss"),
        series(&here, "sft", "sft/loss"),
    );
    // Step 1: B is zero, so the masks change nothing the loss sees; from step 2 on they do.
    assert_eq!(a[0], b[0]);
    assert!(
        a[1..].iter().zip(&b[1..]).all(|(x, y)| x != y),
        "{a:?} vs {b:?}"
    );
    assert!(b[7] < b[0], "{b:?}");
    let mut process = dropped.clone();
    process.push("workers.actor_train.mode=process");
    let there = run_quiet(dir.path(), "there", &rest, &process);
    assert_same_metrics(&here, &there, "lo");
}

/// `rl.kl.refresh_every` under LoRA: the reference (the policy's frozen base with its own copy of
/// the adapter) takes the policy's adapter every 2 steps, and a checkpoint holds that copy, so a
/// run killed after a refresh resumes with the reference it had.
#[test]
fn the_reference_adapter_is_refreshed_every_n_steps_and_resumes_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let rl = "rl={steps: 8, prompts_per_step: 4, group_size: 4, kl: {mode: in_loss, coef: 0.05, refresh_every: 2}, \
              entropy_coef: 0.5, sampling: {temperature: 1.0, max_new_tokens: 6}, optimizer: {lr: 0.05}}";
    let mut overrides = vec![rl, "dpo=null", "sft.steps=2"];
    overrides.extend(LORA);
    let rest = rest(dir.path());
    let whole = run_quiet(dir.path(), "lo", &rest, &overrides);
    assert_eq!(
        series(&whole, "rl", "actor/reference_version"),
        [0.0, 2.0, 2.0, 4.0, 4.0, 6.0, 6.0, 8.0]
    );
    // One PPO epoch measures KL before its update: right after a refresh the reference is the
    // policy itself (0 up to f32 rounding, as without LoRA); a step later the entropy bonus has
    // moved the adapter away from it.
    let kl = series(&whole, "rl", "actor/kl");
    for (i, k) in kl.iter().enumerate() {
        match i % 2 {
            0 => assert!(k.abs() < 1e-7, "step {}: {kl:?}", i + 1),
            _ => assert!(*k > 1e-6, "step {}: {kl:?}", i + 1),
        }
    }
    // Killed after step 4, resumed from the step-3 checkpoint, whose reference is version 2's
    // (or under load from step 6's, whose reference is version 6's: tiny steps are quick).
    let (store, resumed) = killed_and_resumed(dir.path(), "lo", &rest, &overrides, "rl      4/");
    assert!(
        [
            "resumed run 'lo' from rl step 3",
            "resumed run 'lo' from rl step 6"
        ]
        .iter()
        .any(|r| resumed.contains(r)),
        "{resumed}"
    );
    assert_same_metrics(&whole, &store, "lo");
}

/// α = 1 hands actor_infer a snapshot of the adapter each step, which it takes between episodes
/// (agentic RL plays ahead on a schedule that does not depend on timing): in a worker process
/// exactly as in this one, and never the adapter the trainer goes on changing.
#[test]
fn an_asynchronous_lora_run_hands_actor_infer_the_adapter_in_and_out_of_process() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("lake.yaml");
    std::fs::write(
        &cfg,
        "name: lake\nseed: 5\n\
         model: { init: { arch: qwen2, hidden: 16, layers: 1, heads: 2, kv_heads: 1, intermediate: 32, chars: \"SFGPWXLeftRighDowUp\\n\", max_positions: 128 } }\n\
         rl:\n  steps: 4\n  prompts_per_step: 2\n  group_size: 4\n  async_generation_ratio: 1\n  sampling: { max_new_tokens: 4 }\n\
         \x20 entropy_coef: 0.5\n\
         \x20 optimizer: { lr: 0.05 }\n\
         \x20 env: { name: frozen_lake, params: { map: SFG, legend: false }, max_turns: 3, action_pattern: '(\\w+)' }\n\
         workers: { devices: { count: 2 }, actor_infer: { device_mapping: [1] } }\n",
    )
    .unwrap();
    let run = |name: &str, extra: &[&str]| {
        let store = dir.path().join(format!("{name}.db"));
        let out = format!("output_dir={}", dir.path().join(name).display());
        let mut args = vec!["run", "--quiet", cfg.to_str().unwrap(), out.as_str()];
        args.extend(LORA);
        args.extend_from_slice(extra);
        ok(roll(&store, &args));
        store
    };
    let here = run("here", &[]);
    let there = run("there", &["workers.actor_infer.mode=process"]);
    assert_same_metrics(&here, &there, "lake");
    let all: Vec<Value> = serde_json::from_str(&ok(roll(
        &here,
        &["metrics", "lake", "--key", "async/staleness_max", "--json"],
    )))
    .unwrap();
    assert_eq!(all[0]["values"], serde_json::json!([0.0, 1.0, 1.0, 1.0]));
}

#[test]
fn a_killed_lora_run_resumes_to_the_uninterrupted_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let rest = rest(dir.path());
    let whole = run_quiet(dir.path(), "lo", &rest, &LORA);
    let (store, resumed) = killed_and_resumed(dir.path(), "lo", &rest, &LORA, "sft     5/");
    assert!(
        // Step 3's checkpoint, or under load a later one: tiny steps take milliseconds.
        resumed.contains("resumed run 'lo' from sft step "),
        "{resumed}"
    );
    assert_same_metrics(&whole, &store, "lo");
}

/// Killed inside the DPO stage: the resumed stage's reference is the policy's own frozen base
/// with the SFT stage's final adapter (`setup::stage_start_reference`), as the uninterrupted
/// stage's was, so every number comes out the same.
#[test]
fn a_lora_run_killed_in_its_dpo_stage_resumes_to_the_uninterrupted_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let rest = rest(dir.path());
    let mut overrides = vec!["dpo.steps=8"];
    overrides.extend(LORA);
    let whole = run_quiet(dir.path(), "lo", &rest, &overrides);
    let (store, resumed) = killed_and_resumed(dir.path(), "lo", &rest, &overrides, "dpo     5/");
    assert!(
        resumed.contains("resumed run 'lo' from dpo step "),
        "{resumed}"
    );
    assert_same_metrics(&whole, &store, "lo");
}

#[test]
fn a_checkpoints_adapter_merges_into_the_base_it_trained_on() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base");
    ok(bin()
        .args([
            "model", "init", "--arch", "qwen2", "--hidden", "32", "--layers", "1",
        ])
        .args(["--heads", "2", "--kv-heads", "1", "--intermediate", "64"])
        .args(["--chars", "0123456789+=abc>", "--out"])
        .arg(&base)
        .output()
        .unwrap());
    let path = format!("model.path={}", base.display());
    let mut overrides = vec!["model.init=null", path.as_str(), "dpo.steps=2"];
    overrides.extend(LORA);
    run_quiet(dir.path(), "lo", &rest(dir.path()), &overrides);
    let adapter = dir.path().join("lo/checkpoints/dpo-step2");
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(adapter.join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        config["base_model_name_or_path"],
        base.display().to_string()
    );
    assert_eq!(
        (&config["r"], &config["lora_alpha"]),
        (&Value::from(4), &Value::from(8.0))
    );
    let merged = dir.path().join("merged");
    ok(bin()
        .args(["model", "merge"])
        .arg(&base)
        .arg("--adapter")
        .arg(&adapter)
        .arg("--out")
        .arg(&merged)
        .output()
        .unwrap());
    let score = |d: &Path| {
        ok(bin()
            .args(["model", "score"])
            .arg(d)
            .args(["--prompt", "1+2=", "--completion", "3", "--json"])
            .output()
            .unwrap())
    };
    assert_ne!(
        score(&base),
        score(&merged),
        "the trained adapter changes the model"
    );
}

#[test]
fn what_lora_does_not_support_yet_is_refused_by_the_config_check() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "lo", &rest(dir.path()));
    let store = dir.path().join("bad.db");
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--quiet", cfg.to_str().unwrap()];
        args.extend(LORA);
        args.extend_from_slice(extra);
        refused(roll(&store, &args))
    };
    let e = run(&["model.lora.target_modules=[q_proj, qkv]"]);
    assert!(e.contains("'qkv' matches no module"), "{e}");
    let e = run(&["model.lora.dropout=0.1", "workers.devices.kind=cuda"]);
    assert!(e.contains("on CUDA set model.lora.dropout to 0"), "{e}");
    let e = run(&["model.lora.dropout=1.0"]);
    assert!(
        e.contains("model.lora.dropout must be at least 0 and below 1, got 1"),
        "{e}"
    );
    let e = run(&["workers.reference.mode=process"]);
    assert!(
        e.contains("workers.reference.mode 'process' would hold a second copy of the base"),
        "{e}"
    );
}
