//! The DPO stage end to end on the binary: it starts at the loss of a tie (the policy is its own
//! reference), learns to prefer the chosen completions on training and held-out pairs, its options
//! change what they should, it computes the same in worker processes and with a precomputed
//! reference, a killed run resumes to the uninterrupted numbers, and bad pairs and settings are
//! refused with their file, line or key.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::path::Path;

use common::{
    assert_same_metrics, deterministic_metrics, killed_and_resumed, ok, refused, roll, run_quiet,
    write_config,
};
use serde_json::Value;

/// Eight pairs over the tiny model's characters, sums preferred to differences and reversals to
/// copies: a batch of 8 sees them all each step, so even the tiny model learns them. The held-out
/// file has the four sums with chosen and rejected swapped: as the preference is learnt, their
/// accuracy stays at 0 — an evaluation that read the training pairs would rise instead.
fn write_pairs(dir: &Path) {
    let mut train = String::new();
    let mut held = String::new();
    let pair = |p: &str, c: &str, r: &str, d: &str| {
        format!(
            "{{\"prompt\": \"{p}\", \"chosen\": \"{c}\", \"rejected\": \"{r}\", \"domain\": \"{d}\"}}\n"
        )
    };
    for (a, b) in [(3, 5), (7, 2), (4, 4), (9, 6)] {
        let (p, sum, diff) = (
            format!("{a}+{b}="),
            (a + b).to_string(),
            a.max(b) - a.min(b),
        );
        train.push_str(&pair(&p, &sum, &diff.to_string(), "add"));
        held.push_str(&pair(&p, &diff.to_string(), &sum, "add"));
    }
    for w in ["abc", "bca", "cab", "aab"] {
        let rev: String = w.chars().rev().collect();
        train.push_str(&pair(&format!("{w}>"), &rev, w, "rev"));
    }
    std::fs::write(dir.join("pairs.jsonl"), train).unwrap();
    std::fs::write(dir.join("held.jsonl"), held).unwrap();
}

fn rest(dir: &Path) -> String {
    write_pairs(dir);
    format!(
        r#"
name: pref
seed: 4
sft: {{ steps: 4, batch_size: 8, optimizer: {{ lr: 0.01 }} }}
dpo:
  data: {}
  eval: {{ data: {}, every: 3 }}
  steps: 8
  batch_size: 8
  micro_batch_size: 4
  optimizer: {{ lr: 0.01 }}
checkpoint: {{ every: 3 }}
"#,
        dir.join("pairs.jsonl").display(),
        dir.join("held.jsonl").display()
    )
}

/// `key` of the DPO stage: (steps, values).
fn dpo_series(store: &Path, key: &str) -> (Vec<u64>, Vec<f64>) {
    let all: Vec<Value> = serde_json::from_str(&ok(roll(
        store,
        &["metrics", "pref", "--key", key, "--json"],
    )))
    .unwrap();
    let s = all
        .iter()
        .find(|s| s["stage"] == "dpo")
        .unwrap_or_else(|| panic!("no dpo series '{key}' in {all:?}"));
    let nums = |k: &str| -> Vec<Value> { s[k].as_array().unwrap().clone() };
    (
        nums("steps").iter().map(|v| v.as_u64().unwrap()).collect(),
        nums("values").iter().map(|v| v.as_f64().unwrap()).collect(),
    )
}

#[test]
fn dpo_starts_at_a_tie_and_learns_to_prefer_the_chosen_completions() {
    let dir = tempfile::tempdir().unwrap();
    let store = run_quiet(dir.path(), "pref", &rest(dir.path()), &[]);
    let (_, loss) = dpo_series(&store, "loss");
    // The reference is the policy as the stage starts: every pair ties, -log σ(0) = ln 2.
    assert!((loss[0] - std::f64::consts::LN_2).abs() < 1e-5, "{loss:?}");
    assert!(loss[7] < loss[0] - 0.1, "{loss:?}");
    let (_, margins) = dpo_series(&store, "rewards/margins");
    assert!(margins[0].abs() < 1e-5 && margins[7] > 0.2, "{margins:?}");
    let (_, acc) = dpo_series(&store, "rewards/accuracies");
    assert!(acc[7] >= 0.875, "{acc:?}");
    // Per domain (the pairs carry `domain` tags): four pairs each, so their means average to the
    // batch's.
    let (_, add) = dpo_series(&store, "rewards/add/accuracies");
    let (_, rev) = dpo_series(&store, "rewards/rev/accuracies");
    for step in 0..8 {
        assert!(
            ((add[step] + rev[step]) / 2.0 - acc[step]).abs() < 1e-9,
            "step {}: add {add:?} rev {rev:?} all {acc:?}",
            step + 1
        );
    }
    // The held-out (swapped) pairs after steps 1, 3, 6 and the last: the policy prefers what
    // they reject, more and more.
    let (steps, held) = dpo_series(&store, "eval/rewards/accuracies");
    assert_eq!(steps, [1, 3, 6, 8]);
    assert!(held.iter().all(|&a| a <= 0.25), "{held:?}");
    // Every held-out pair is a sum: its one domain is the whole set.
    assert_eq!(dpo_series(&store, "eval/rewards/add/accuracies").1, held);
    let (_, held_loss) = dpo_series(&store, "eval/loss");
    assert!(held_loss[3] > held_loss[0] + 0.1, "{held_loss:?}");

    // The step's pairs as samples (the Samples view's): chosen then rejected under their
    // prompt, each with its implicit reward 0.1 (logp - ref_logp). With the whole batch in one
    // mini-batch every row is read before the update, so their means are the step's metrics
    // (f32 sums against f64 means: 1e-5).
    let all: Vec<Value> = serde_json::from_str(&ok(roll(
        &store,
        &["samples", "pref", "--json", "--limit", "10000"],
    )))
    .unwrap();
    let dpo: Vec<&Value> = all.iter().filter(|s| s["stage"] == "dpo").collect();
    assert_eq!(dpo.len(), 8 * 8 * 2, "two records per pair and step");
    let (_, chosen_m) = dpo_series(&store, "rewards/chosen");
    let (_, rejected_m) = dpo_series(&store, "rewards/rejected");
    let f = |v: &Value| v.as_f64().unwrap();
    for step in 1..=8u64 {
        let at: Vec<&&Value> = dpo.iter().filter(|s| s["step"] == step).collect();
        assert_eq!(at.len(), 16, "step {step}");
        let (mut chosen, mut rejected, mut right) = (0.0, 0.0, 0.0);
        for pair in at.chunks(2) {
            let (c, r) = (pair[0], pair[1]);
            assert_eq!(
                (&c["finish_reason"], &r["finish_reason"]),
                (&"chosen".into(), &"rejected".into())
            );
            assert_eq!(c["prompt"], r["prompt"]);
            for s in [c, r] {
                let b = &s["breakdown"];
                let want = 0.1 * (f(&b["logp"]) - f(&b["ref_logp"]));
                assert!((f(&s["reward"]) - want).abs() < 1e-5, "{s}");
            }
            let margin = f(&c["reward"]) - f(&r["reward"]);
            assert!((f(&c["breakdown"]["margin"]) - margin).abs() < 1e-5, "{c}");
            assert_eq!(c["correct"], Value::Bool(margin > 0.0), "{c}");
            assert_eq!(c["correct"], r["correct"]);
            chosen += f(&c["reward"]) / 8.0;
            rejected += f(&r["reward"]) / 8.0;
            right += f64::from(u8::from(margin > 0.0)) / 8.0;
        }
        let i = step as usize - 1;
        assert!(
            (chosen - chosen_m[i]).abs() < 1e-5,
            "step {step}: {chosen} vs {chosen_m:?}"
        );
        assert!(
            (rejected - rejected_m[i]).abs() < 1e-5,
            "step {step}: {rejected} vs {rejected_m:?}"
        );
        assert!(
            (right - acc[i]).abs() < 1e-9,
            "step {step}: {right} vs {acc:?}"
        );
    }
}

#[test]
fn the_loss_options_change_the_loss_as_they_should() {
    let dir = tempfile::tempdir().unwrap();
    let rest = rest(dir.path());
    let sigmoid = run_quiet(dir.path(), "s", &rest, &["dpo.steps=3"]);
    let ipo = run_quiet(
        dir.path(),
        "i",
        &rest,
        &["dpo.steps=3", "dpo.loss_type=ipo"],
    );
    let cdpo = run_quiet(
        dir.path(),
        "c",
        &rest,
        &["dpo.steps=3", "dpo.label_smoothing=0.3"],
    );
    let beta = run_quiet(dir.path(), "b", &rest, &["dpo.steps=3", "dpo.beta=0.5"]);
    let (_, s) = dpo_series(&sigmoid, "loss");
    let (_, i) = dpo_series(&ipo, "loss");
    let (_, c) = dpo_series(&cdpo, "loss");
    let (_, b) = dpo_series(&beta, "loss");
    // IPO at a tie: (0 - 1/(2 * 0.1))^2 = 25.
    assert!((i[0] - 25.0).abs() < 1e-3, "{i:?}");
    // cDPO at a tie: -(0.7 + 0.3) log σ(0) = ln 2 as well; once the margins grow, the smoothed
    // loss is higher (it also charges the pairs for being right).
    assert!((c[0] - std::f64::consts::LN_2).abs() < 1e-5, "{c:?}");
    assert!(c[2] > s[2] + 1e-3, "cdpo {c:?} vs dpo {s:?}");
    // A larger β scales the same margins up: the loss falls faster.
    assert!(b[2] < s[2] - 1e-3, "beta 0.5 {b:?} vs 0.1 {s:?}");
    let (_, s_margin) = dpo_series(&sigmoid, "rewards/margins");
    let (_, b_margin) = dpo_series(&beta, "rewards/margins");
    assert!(b_margin[1] > s_margin[1], "{b_margin:?} vs {s_margin:?}");

    // TRL's list form: DPO plus half the chosen completions' negative log-likelihood (RPO). At
    // the tie the loss is ln 2 + 0.5 (-8 logps/chosen) / 25: 8 pairs whose chosen completions
    // have 17 characters (1 + 1 + 1 + 2 digits, 4 x 3 letters) and 8 end-of-sequence tokens.
    let rpo = run_quiet(
        dir.path(),
        "p",
        &rest,
        &[
            "dpo.steps=3",
            "dpo.loss_type=[sigmoid, sft]",
            "dpo.loss_weights=[1.0, 0.5]",
        ],
    );
    let (_, p) = dpo_series(&rpo, "loss");
    let (_, p_chosen) = dpo_series(&rpo, "logps/chosen");
    let want = std::f64::consts::LN_2 + 0.5 * (-8.0 * p_chosen[0]) / 25.0;
    assert!((p[0] - want).abs() < 1e-5, "{p:?} vs {want}");
    // The likelihood term holds the chosen completions up: their log-probs end higher than
    // under DPO alone, which lowers both sides.
    let (_, s_chosen) = dpo_series(&sigmoid, "logps/chosen");
    assert_eq!(p_chosen[0], s_chosen[0]);
    assert!(
        p_chosen[2] > s_chosen[2] + 1e-3,
        "{p_chosen:?} vs {s_chosen:?}"
    );
}

#[test]
fn workers_and_a_precomputed_reference_compute_what_the_trainer_does() {
    let dir = tempfile::tempdir().unwrap();
    let rest = rest(dir.path());
    let here = run_quiet(dir.path(), "here", &rest, &[]);
    let there = run_quiet(
        dir.path(),
        "there",
        &rest,
        &[
            "workers.actor_train.mode=process",
            "workers.reference.mode=process",
        ],
    );
    assert_same_metrics(&here, &there, "pref");
    // The pairs' samples too: a worker's reply carries the rows' log-probs bit for bit.
    let samples = |store: &Path| {
        ok(roll(
            store,
            &["samples", "pref", "--json", "--limit", "10000"],
        ))
    };
    let (a, b) = (samples(&here), samples(&there));
    assert!(
        a.contains("\"stage\":\"dpo\"") || a.contains("\"stage\": \"dpo\""),
        "{a}"
    );
    assert_eq!(a, b);
    // The precomputed pass batches the rows differently (every pair in file order), so the
    // reference's log-probs may differ in their last bits; the training cannot.
    let pre = run_quiet(dir.path(), "pre", &rest, &["dpo.precompute_ref=true"]);
    let (a, b) = (
        deterministic_metrics(&here, "pref"),
        deterministic_metrics(&pre, "pref"),
    );
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x["key"], y["key"]);
        for (u, v) in x["values"]
            .as_array()
            .unwrap()
            .iter()
            .zip(y["values"].as_array().unwrap())
        {
            let (u, v) = (u.as_f64().unwrap(), v.as_f64().unwrap());
            assert!(
                (u - v).abs() <= 1e-4 * (1.0 + u.abs()),
                "{}: {u} vs {v}",
                x["key"]
            );
        }
    }
}

#[test]
fn a_killed_dpo_stage_resumes_to_the_uninterrupted_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let rest = rest(dir.path());
    let whole = run_quiet(dir.path(), "whole", &rest, &[]);
    let (store, resumed) = killed_and_resumed(dir.path(), "pref", &rest, &[], "dpo     5/");
    assert!(
        resumed.contains("resumed run 'pref' from dpo step 3"),
        "{resumed}"
    );
    assert_same_metrics(&whole, &store, "pref");
}

#[test]
fn bad_pairs_and_settings_are_refused_with_where_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let rest = rest(dir.path());
    let cfg = write_config(dir.path(), "bad", &rest);
    let store = dir.path().join("bad.db");
    let run = |overrides: &[&str]| {
        let mut args = vec!["run", "--quiet", cfg.to_str().unwrap(), "--overwrite"];
        args.extend_from_slice(overrides);
        refused(roll(&store, &args))
    };
    let pairs = dir.path().join("pairs.jsonl");
    let good = std::fs::read_to_string(&pairs).unwrap();
    std::fs::write(
        &pairs,
        format!("{good}{{\"prompt\": \"1+1=\", \"chosen\": \"2\", \"rejected\": \"2\"}}\n"),
    )
    .unwrap();
    let e = run(&[]);
    let line = good.lines().count() + 1;
    assert!(
        e.contains(&format!(
            "pairs.jsonl' line {line}: 'chosen' and 'rejected' are the same"
        )),
        "{e}"
    );
    // A character the tokenizer does not know names the pair and the field.
    std::fs::write(
        &pairs,
        format!("{{\"prompt\": \"1+1=\", \"chosen\": \"two\", \"rejected\": \"3\"}}\n{good}"),
    )
    .unwrap();
    let e = run(&[]);
    assert!(
        e.contains("pairs.jsonl' line 1: chosen 'two' contains 't'"),
        "{e}"
    );
    std::fs::write(&pairs, good).unwrap();
    let e = run(&["dpo.beta=0", "dpo.label_smoothing=0.5"]);
    assert!(e.contains("dpo.beta must be above 0, got 0"), "{e}");
    assert!(
        e.contains("dpo.label_smoothing must be in [0, 0.5), got 0.5"),
        "{e}"
    );
    let e = run(&["dpo.loss_type=ipo", "dpo.label_smoothing=0.1"]);
    assert!(e.contains("not 'ipo'"), "{e}");
    let e = run(&["dpo.loss_type=[sigmoid, kto]"]);
    assert!(e.contains("unknown loss type 'kto'"), "{e}");
    let e = run(&[
        "dpo.loss_type=[sigmoid, ipo, sigmoid]",
        "dpo.loss_weights=[1.0]",
    ]);
    assert!(e.contains("lists 'sigmoid' twice"), "{e}");
    assert!(e.contains("both 'sigmoid' and 'ipo'"), "{e}");
    assert!(
        e.contains("dpo.loss_weights has 1 weights for the 3 loss types"),
        "{e}"
    );
    let e = run(&["dpo.data=missing.jsonl"]);
    assert!(e.contains("missing.jsonl': cannot read"), "{e}");
    // Nothing bad reached the store as a run that trained.
    let runs: Value = serde_json::from_str(&ok(roll(&store, &["runs", "--json"]))).unwrap();
    assert!(
        runs.as_array()
            .unwrap()
            .iter()
            .all(|r| r["status"] != "finished"),
        "{runs}"
    );
}
