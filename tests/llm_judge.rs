//! The judge reward end to end on a tiny judge model: batched yes/no verdicts equal the same
//! probabilities computed one prompt at a time, a judge that writes garbage gives an unformatted
//! outcome that quotes it, a worker's call batches its judging, and the CLI scores with a judge.
//! The reward role hosting judges is placed and time-shared like every model role: offloaded (its
//! weights really dropped, in this process or in each worker of a pool) and reloaded to the same
//! verdicts, moved around every phase of a run when it shares device 0 with training, never when
//! it has its own device, and refused when it does not fit.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::path::Path;

use common::{bin, ok, refused};
use roll::config::{PlacementMode, RolePlacement};
use roll::model::{Arch, InitOptions, LoadedModel, init_model_dir, load_model_dir};
use roll::reward::llm_judge::{Params, Verdict, judge_batch, judges};
use roll::reward::{Reward, RewardFn, RewardOutcome};
use roll::role::reward::{RewardScorer, ScoreItem, SharedScorer, score_all};
use roll::role::{HostCopy, ResidentRole};
use roll::scheduler::host_copy::HostArea;

/// Every character of the default template and the test texts, one token each.
const CHARS: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ?:.+=>\n";

fn tiny_judge(dir: &Path) {
    init_model_dir(
        dir,
        &InitOptions {
            arch: Arch::Qwen2,
            hidden: 32,
            layers: 2,
            heads: 2,
            kv_heads: 1,
            intermediate: 64,
            head_dim: None,
            tie_embeddings: true,
            max_positions: 256,
            rope_theta: 10_000.0,
            chars: CHARS.into(),
            dtype: "float32".into(),
            seed: 9,
        },
    )
    .unwrap();
}

fn params(dir: &Path) -> Params {
    Params {
        yes: "Y".into(),
        no: "N".into(),
        ..Params::new(dir.to_path_buf())
    }
}

const ITEMS: [(&str, &str, &str); 3] = [
    ("What is 2+2?", "4", "4"),
    (
        "Name a colour.",
        "A very long answer about blue and green and red",
        "blue",
    ),
    ("Say hi.", "hi", "hello"),
];

#[test]
fn batched_yes_no_verdicts_equal_one_prompt_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    tiny_judge(dir.path());
    let p = params(dir.path());
    let batched = judge_batch(&p, &ITEMS);
    // Independently: log P(Y | prompt) and log P(N | prompt) for each prompt alone (no padding),
    // then P(Y) / (P(Y) + P(N)).
    let model = load_model_dir(dir.path(), None, &candle_core::Device::Cpu).unwrap();
    let tok = &model.tokenizer.tokenizer;
    let id = |s: &str| tok.encode(s, false).unwrap().get_ids().to_vec();
    for (item, got) in ITEMS.iter().zip(&batched) {
        let text = format!(
            "Question: {}\nReference answer: {}\nResponse: {}\nIs the response correct? Answer Yes or No.\nAnswer: ",
            item.0, item.2, item.1
        );
        let prompt = id(&text);
        let lp = |t: &str| {
            roll::train::batch::score_pair(&model.transformer, &prompt, &id(t), model.pad_id)
                .unwrap()[0]
        };
        let expected = 1.0 / (1.0 + f64::from(lp("N") - lp("Y")).exp());
        assert!(got.error.is_none(), "{got:?}");
        assert!(
            (f64::from(got.score) - expected).abs() < 1e-5,
            "batched {} vs alone {expected}",
            got.score
        );
        assert_eq!(got.correct, expected > 0.5);
    }
    // Different prompts get different verdicts (the batch did not mix rows up).
    assert_ne!(batched[0].score, batched[1].score);
}

#[test]
fn a_judge_that_writes_garbage_is_unformatted_and_quoted() {
    let dir = tempfile::tempdir().unwrap();
    tiny_judge(dir.path());
    let p = Params {
        verdict: Verdict::Score,
        max_new_tokens: 6,
        template: "Rate {{ response }} from 1 to 10: ".into(),
        ..params(dir.path())
    };
    for out in judge_batch(&p, &ITEMS) {
        // A random judge writes random characters; whatever it wrote is either a 1-10 score
        // (scored n/10) or quoted in the error.
        match &out.error {
            Some(e) => {
                assert!(e.contains("no 1-10 score in the judge's output"), "{e}");
                assert!(!out.format_ok && out.score == 0.0);
            }
            None => assert!(out.format_ok && out.score > 0.0 && out.score <= 1.0),
        }
    }
    // A yes/no token that is not one token of the vocabulary is an error naming it.
    let bad = Params {
        yes: "Yes".into(),
        ..params(dir.path())
    };
    let out = judge_batch(&bad, &ITEMS[..1]);
    assert!(
        out[0]
            .error
            .as_deref()
            .unwrap()
            .contains("'Yes' must be one token of the judge's vocabulary, it is 3"),
        "{out:?}"
    );
}

#[test]
fn a_reward_call_batches_its_judging_and_matches_the_single_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    tiny_judge(dir.path());
    let p = params(dir.path());
    let items: Vec<ScoreItem> = ITEMS
        .iter()
        .map(|(prompt, response, truth)| ScoreItem {
            reward: Reward::Weighted(vec![
                (RewardFn::LlmJudge(p.clone()), 0.5),
                (RewardFn::ExactMatch { ignore_case: false }, 0.5),
            ]),
            domain: "d".into(),
            prompt: (*prompt).into(),
            response: (*response).into(),
            ground_truth: (*truth).into(),
            metadata: None,
        })
        .collect();
    let scored = score_all(&items);
    let alone = judge_batch(&p, &ITEMS);
    for ((out, judged), item) in scored.iter().zip(&alone).zip(&items) {
        let exact = if item.response == item.ground_truth {
            1.0
        } else {
            0.0
        };
        // 0.5 · P(Y) + 0.5 · exact match, the judge's term in the breakdown.
        assert!(
            (out.score - (0.5 * judged.score + 0.5 * exact)).abs() < 1e-5,
            "{out:?}"
        );
        assert_eq!(out.components[0].0, "llm_judge");
        assert!((out.components[0].1 - judged.score).abs() < 1e-5);
    }
}

#[test]
fn the_cli_scores_with_a_judge_and_refuses_a_missing_model() {
    let dir = tempfile::tempdir().unwrap();
    tiny_judge(dir.path());
    let cli_params = format!(
        r#"{{"model": "{}", "yes": "Y", "no": "N"}}"#,
        dir.path().display()
    );
    let out = ok(bin()
        .args([
            "reward",
            "score",
            "--kind",
            "llm_judge",
            "--params",
            &cli_params,
            "--json",
        ])
        .args([
            "--prompt",
            "What is 2+2?",
            "--response",
            "4",
            "--truth",
            "4",
        ])
        .output()
        .unwrap());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let expected = judge_batch(&params(dir.path()), &ITEMS[..1])[0].score;
    assert!(
        (v["score"].as_f64().unwrap() - f64::from(expected)).abs() < 1e-5,
        "{v}"
    );
    let err = refused(
        bin()
            .args([
                "reward",
                "score",
                "--kind",
                "llm_judge",
                "--response",
                "4",
                "--truth",
                "4",
            ])
            .output()
            .unwrap(),
    );
    assert!(err.contains("llm_judge needs 'model'"), "{err}");
}

fn judged_items(p: &Params) -> Vec<ScoreItem> {
    ITEMS
        .iter()
        .map(|(prompt, response, truth)| ScoreItem {
            reward: Reward::One(RewardFn::LlmJudge(p.clone())),
            domain: "d".into(),
            prompt: (*prompt).into(),
            response: (*response).into(),
            ground_truth: (*truth).into(),
            metadata: None,
        })
        .collect()
}

/// Bytes of a judge's weights as the role holds them (f32), counted from the model itself.
fn weight_bytes(model: &LoadedModel) -> u64 {
    model.transformer.params().num_params() as u64 * 4
}

/// Offload, score while offloaded, reload, score again, through the role's time-sharing handle;
/// returns the bytes of the offload and checks everything else.
fn offload_and_reload(placement: &RolePlacement, dir: &Path) -> u64 {
    let p = params(dir);
    let workers = roll::config::WorkersConfig {
        reward: placement.clone(),
        ..Default::default()
    };
    let scorer = RewardScorer::start(&workers, &[dir.to_path_buf()]).unwrap();
    let mut role = SharedScorer::new(scorer);
    let before = role.lock().score(judged_items(&p)).unwrap();
    assert!(before.iter().all(|o| o.error.is_none()), "{before:?}");
    let area = HostArea::new().unwrap();
    let policy = load_model_dir(dir, None, &candle_core::Device::Cpu).unwrap();
    let host = HostCopy {
        area: &area,
        policy: &policy,
    };
    let off = role.offload(&host).unwrap();
    // Off its devices the judge cannot score: a time-sharing bug would show as these errors
    // rather than as a silent reload.
    let during = role.lock().score(judged_items(&p)).unwrap();
    for o in &during {
        let e = o.error.as_deref().unwrap_or_default();
        assert!(e.contains("is offloaded"), "{o:?}");
    }
    let on = role.reload(&host).unwrap();
    assert_eq!(on, off);
    let after: Vec<RewardOutcome> = role.lock().score(judged_items(&p)).unwrap();
    assert_eq!(after, before, "the reloaded judge gives other verdicts");
    // A second round moves the same bytes (the frozen host copy is reused).
    assert_eq!(role.offload(&host).unwrap(), off);
    assert_eq!(role.reload(&host).unwrap(), off);
    role.lock().shutdown();
    off
}

#[test]
fn an_in_process_reward_role_offloads_its_judge_and_reloads_the_same_verdicts() {
    let dir = tempfile::tempdir().unwrap();
    tiny_judge(dir.path());
    let bytes = offload_and_reload(&RolePlacement::default(), dir.path());
    let judge = load_model_dir(dir.path(), None, &candle_core::Device::Cpu).unwrap();
    assert_eq!(bytes, weight_bytes(&judge));
    // Shut down, the role let go of its judge: the process holds no copy of it any more.
    assert!(!judges().contains_key(dir.path()));
}

#[test]
fn each_worker_of_a_reward_pool_offloads_and_reloads_its_judge() {
    roll::worker::process::set_worker_program(env!("CARGO_BIN_EXE_roll-tui"));
    let dir = tempfile::tempdir().unwrap();
    tiny_judge(dir.path());
    let pool = RolePlacement {
        mode: PlacementMode::Process,
        num_workers: 2,
        ..RolePlacement::default()
    };
    let bytes = offload_and_reload(&pool, dir.path());
    let judge = load_model_dir(dir.path(), None, &candle_core::Device::Cpu).unwrap();
    assert_eq!(bytes, 2 * weight_bytes(&judge));
    // The judges lived in the workers, never in this process.
    assert!(!judges().contains_key(dir.path()));
}

#[test]
fn a_reward_role_with_a_missing_judge_fails_at_setup_naming_it() {
    for placement in [
        RolePlacement::default(),
        RolePlacement {
            mode: PlacementMode::Process,
            ..RolePlacement::default()
        },
    ] {
        roll::worker::process::set_worker_program(env!("CARGO_BIN_EXE_roll-tui"));
        let workers = roll::config::WorkersConfig {
            reward: placement,
            ..Default::default()
        };
        let err = RewardScorer::start(&workers, &["/nonexistent/judge".into()])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("/nonexistent/judge"), "{err}");
    }
}

/// A run whose one domain is rewarded by the tiny judge in `judge`.
fn judged_run(
    dir: &Path,
    out: &str,
    judge: &Path,
    verdict: &str,
    workers: &str,
) -> std::path::PathBuf {
    let path = dir.join(format!("{out}.yaml"));
    let text = format!(
        r#"
name: judged
seed: 4
model:
  init: {{ arch: qwen2, hidden: 32, layers: 1, heads: 2, kv_heads: 1, intermediate: 64, chars: "0123456789+=abc>" }}
data:
  domains:
    - name: add
      synthetic: {{ task: addition, count: 40, digits: 1, demo_noise: 0.5 }}
      reward: {{ kind: llm_judge, model: "{judge}", yes: "Y", no: "N", verdict: {verdict}, max_new_tokens: 4 }}
rl:
  steps: 3
  prompts_per_step: 2
  group_size: 4
  sampling: {{ temperature: 1.0, max_new_tokens: 4 }}
  optimizer: {{ lr: 0.001 }}
{workers}
output_dir: {out}
"#,
        judge = judge.display(),
        out = dir.join(out).display(),
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn events(store: &Path) -> Vec<serde_json::Value> {
    let out = ok(bin()
        .arg("--store")
        .arg(store)
        .args(["runs", "show", "judged", "--json"])
        .output()
        .unwrap());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["events"].as_array().unwrap().clone()
}

/// (kind, worker, bytes) of the run's offload and reload events.
fn moves(store: &Path) -> Vec<(String, String, u64)> {
    common::transfers(&events(store))
}

/// `roll-tui --store STORE run --quiet CFG`, which must succeed.
fn run_ok(store: &Path, cfg: &Path) {
    ok(common::roll(
        store,
        &["run", "--quiet", cfg.to_str().unwrap()],
    ));
}

#[test]
fn a_run_time_shares_device_0_between_the_judge_and_training() {
    let dir = tempfile::tempdir().unwrap();
    let judge = dir.path().join("judge");
    tiny_judge(&judge);
    let bytes = weight_bytes(&load_model_dir(&judge, None, &candle_core::Device::Cpu).unwrap());
    let store = dir.path().join("roll.db");
    let cfg = judged_run(dir.path(), "shared", &judge, "yes_no", "");
    run_ok(&store, &cfg);
    // Step by step: the judge leaves device 0 for training and comes back to score the next
    // step's samples (3 steps: 3 offloads, 2 reloads), with exactly its weights' bytes.
    let judged: Vec<_> = moves(&store)
        .into_iter()
        .filter(|(_, w, _)| w == "reward")
        .collect();
    let kinds: Vec<&str> = judged.iter().map(|(k, _, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        ["offload", "reload", "offload", "reload", "offload"],
        "{judged:?}"
    );
    assert!(judged.iter().all(|(_, _, b)| *b == bytes), "{judged:?}");

    // A judge on its own device never moves; with a pool of two workers scoring garbage
    // (a random judge writing instead of answering Y or N) the run still finishes.
    let store = dir.path().join("separate.db");
    let cfg = judged_run(
        dir.path(),
        "separate",
        &judge,
        "score",
        "workers: { devices: { count: 2 }, reward: { mode: process, num_workers: 2, device_mapping: [1] } }",
    );
    run_ok(&store, &cfg);
    let moved = moves(&store);
    assert!(moved.iter().all(|(_, w, _)| w != "reward"), "{moved:?}");
    assert!(
        !moved.is_empty(),
        "training and generation still share device 0"
    );
    // The judge's garbage is reported once, quoting it, and scored 0.
    let said: Vec<_> = events(&store)
        .into_iter()
        .filter(|e| {
            e["kind"] == "warning"
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("no 1-10 score in the judge's output"))
        })
        .collect();
    assert_eq!(said.len(), 1, "{said:?}");

    // A device too small is refused before anything runs, the judge's weights counted in the
    // phase that scores.
    let cfg = judged_run(
        dir.path(),
        "small",
        &judge,
        "yes_no",
        "workers: { devices: { memory_mb: 0.01 } }",
    );
    let err = refused(
        bin()
            .arg("--store")
            .arg(dir.path().join("small.db"))
            .args(["run", "--quiet"])
            .arg(&cfg)
            .output()
            .unwrap(),
    );
    assert!(
        err.contains("phase 'generate'") && err.contains("reward 0."),
        "{err}"
    );
    assert!(err.contains(&format!("({bytes} bytes)")), "{err}");
}
