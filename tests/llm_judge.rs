//! The judge reward end to end on a tiny judge model: batched yes/no verdicts equal the same
//! probabilities computed one prompt at a time, a judge that writes garbage gives an unformatted
//! outcome that quotes it, a worker's call batches its judging, and the CLI scores with a judge.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::path::Path;

use common::{bin, ok, refused};
use roll::model::{Arch, InitOptions, init_model_dir, load_model_dir};
use roll::reward::llm_judge::{Params, Verdict, judge_batch};
use roll::reward::{Reward, RewardFn};
use roll::role::reward::{ScoreItem, score_all};

/// Every character of the default template and the test texts, one token each.
const CHARS: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ?:.+=\n";

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
