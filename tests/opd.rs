//! On-policy distillation end to end on the binary (`rl.opd`): with `pure: true` the advantage is
//! minus the teachers' weighted KL on every sampled token (and the student's KL to the teacher
//! falls); mixed, the KL is subtracted from the RL advantage; teachers score only the rows of
//! their tags; and pure OPD beside another KL is refused.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::path::Path;

use common::{ok, refused, roll, run_quiet, write_config};
use serde_json::Value;

fn series(store: &Path, key: &str) -> Vec<f64> {
    common::stage_series(store, "st", "rl", key)
}

fn rl(opd: &str) -> String {
    format!(
        "name: st\nseed: 4\n\
         rl: {{ steps: 10, prompts_per_step: 4, group_size: 4, sampling: {{ temperature: 1.0, max_new_tokens: 6 }}, \
         kl: {{ mode: none }}, optimizer: {{ lr: 0.01 }}, opd: {opd} }}\n"
    )
}

#[test]
fn pure_opd_makes_the_advantage_minus_the_teachers_kl_and_the_kl_falls() {
    let dir = tempfile::tempdir().unwrap();
    let t = common::sft_teacher(dir.path());
    let opd = format!(
        "{{ pure: true, teachers: [ {{ name: tiny, path: {}, coef: 2.0 }} ] }}",
        t.display()
    );
    let store = run_quiet(dir.path(), "st", &rl(&opd), &[]);
    let kl = series(&store, "opd/kl/tiny");
    assert_eq!(kl.len(), 10);
    // No reward is learned from, so groups of equal rewards are no missing signal: the health
    // rule's series is not recorded, and no all-equal-rewards alarm can fire.
    let all: Vec<Value> =
        serde_json::from_str(&ok(roll(&store, &["metrics", "st", "--json"]))).unwrap();
    assert!(all.iter().all(|s| s["key"] != "group/frac_zero_std"));
    assert!(all.iter().any(|s| s["key"] == "opd/kl/tiny"));
    // k1 over the student's own samples: a Monte Carlo KL(student || teacher), noisy per step.
    let (first, last) = (kl[..3].iter().sum::<f64>(), kl[7..].iter().sum::<f64>());
    assert!(last < first, "the student moves to the teacher: {kl:?}");
    // Every sample carries its tokens with the student's and the teacher's log-probs, and the
    // metric is their k1 (student − teacher) averaged over the step's tokens: recomputed here
    // from the stored samples, it is `opd/kl/tiny` of each step.
    let out = ok(roll(
        &store,
        &["samples", "st", "--json", "--limit", "10000"],
    ));
    let samples: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(samples.len(), 10 * 16);
    for (step, want) in kl.iter().enumerate() {
        let (mut sum, mut count) = (0f64, 0usize);
        for s in samples.iter().filter(|s| s["step"] == step as u64 + 1) {
            let t = &s["tokens"];
            let pieces = t["pieces"].as_array().unwrap();
            assert_eq!(pieces.len() as u64, s["response_tokens"].as_u64().unwrap());
            let student = t["student"].as_array().unwrap();
            let teacher = t["teachers"]["tiny"].as_array().unwrap();
            assert_eq!((student.len(), teacher.len()), (pieces.len(), pieces.len()));
            for (a, b) in student.iter().zip(teacher) {
                sum += a.as_f64().unwrap() - b.as_f64().unwrap();
                count += 1;
            }
        }
        let got = sum / count as f64;
        assert!(
            (got - want).abs() < 1e-4,
            "step {}: {got} vs {want}",
            step + 1
        );
    }
    // The advantage of every sampled token is -coef · KL (no whitening, no clip, one teacher
    // scoring every row), so its mean is -2 times the mean KL.
    let adv = series(&store, "adv/mean");
    for (a, k) in adv.iter().zip(&kl) {
        assert!(
            (a + 2.0 * k).abs() < 1e-5 * (1.0 + k.abs()),
            "{adv:?} vs {kl:?}"
        );
    }
}

#[test]
fn mixed_opd_routes_rows_by_tag_and_joins_the_rl_advantage() {
    let dir = tempfile::tempdir().unwrap();
    let t = common::sft_teacher(dir.path());
    let opd = format!(
        "{{ teachers: [ {{ name: adds, path: {p}, tags: [add] }}, {{ name: revs, path: {p}, coef: 0.5, tags: [rev] }} ] }}",
        p = t.display()
    );
    let store = run_quiet(dir.path(), "st", &rl(&opd), &[]);
    // Each teacher scored its own domain's rows: the same teacher, so the KLs differ only by the
    // rows they saw.
    let (adds, revs) = (series(&store, "opd/kl/adds"), series(&store, "opd/kl/revs"));
    assert_eq!((adds.len(), revs.len()), (10, 10));
    assert!(
        adds.iter().zip(&revs).any(|(a, r)| a != r),
        "{adds:?} {revs:?}"
    );
    // The two teachers are the run's teacher role: resident while training, where they score,
    // and offloaded together for generation on their shared device (from the second step on:
    // each step generates, then trains). Their reload brings back what their offload took.
    let moves: Vec<(String, u64)> = common::transfers(&common::run_events(&store, "st"))
        .into_iter()
        .filter(|(_, w, _)| w.starts_with("teacher"))
        .map(|(k, _, b)| (k, b))
        .collect();
    let offloads: Vec<u64> = moves
        .iter()
        .filter(|(k, _)| k == "offload")
        .map(|m| m.1)
        .collect();
    let reloads: Vec<u64> = moves
        .iter()
        .filter(|(k, _)| k == "reload")
        .map(|m| m.1)
        .collect();
    assert_eq!((offloads.len(), reloads.len()), (9, 9), "{moves:?}");
    assert!(offloads.iter().chain(&reloads).all(|b| *b == offloads[0]));
    // A sample's tokens carry the log-probs of the teacher of its domain only.
    let out = ok(roll(
        &store,
        &["samples", "st", "--json", "--limit", "10000"],
    ));
    let samples: Vec<Value> = serde_json::from_str(&out).unwrap();
    for s in &samples {
        let teachers = s["tokens"]["teachers"].as_object().unwrap();
        let want = if s["domain"] == "add" { "adds" } else { "revs" };
        assert_eq!(teachers.keys().collect::<Vec<_>>(), [want], "{s}");
    }
    // Without teachers the same run's advantages are the rewards' alone.
    let plain = run_quiet(dir.path(), "plain", &rl("null"), &[]);
    let out = ok(roll(&plain, &["samples", "st", "--json", "--limit", "10"]));
    let samples: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert!(
        samples.iter().all(|s| s.get("tokens").is_none()),
        "only OPD records tokens"
    );
    let (with, without) = (series(&store, "adv/mean"), series(&plain, "adv/mean"));
    // Step 1 samples the same tokens in both (the same policy and seeds): its advantages differ
    // by the teachers' weighted KL alone.
    assert!(
        (with[0] - without[0]).abs() > 1e-6,
        "{with:?} vs {without:?}"
    );
}

#[test]
fn pure_opd_beside_another_kl_or_a_critic_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let opd = "{ pure: true, teachers: [ { name: t, path: /nowhere } ] }";
    let cfg = write_config(dir.path(), "st", &rl(opd));
    let store = dir.path().join("bad.db");
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--quiet", cfg.to_str().unwrap()];
        args.extend_from_slice(extra);
        refused(roll(&store, &args))
    };
    let e = run(&["rl.kl.mode=in_loss"]);
    assert!(
        e.contains("rl.opd.pure: the teachers' KL is the whole advantage"),
        "{e}"
    );
    let e = run(&["rl.opd.teachers=[]"]);
    assert!(
        e.contains("rl.opd.teachers must list at least one teacher"),
        "{e}"
    );
    let e = run(&[]);
    assert!(e.contains("rl.opd.teachers[0] ('t') '/nowhere'"), "{e}");
}

/// In an agentic stage the rows carry the environment's tag: a teacher of that tag scores every
/// episode (its KL recorded), one of another tag none of them.
#[test]
fn an_agentic_stage_routes_episodes_by_the_environments_tag() {
    let dir = tempfile::tempdir().unwrap();
    let chars = "SFGPWXLeftRighDowUp\n";
    let teacher = dir.path().join("lake-teacher");
    ok(common::bin()
        .args([
            "model", "init", "--arch", "qwen2", "--hidden", "16", "--layers", "1",
        ])
        .args(["--heads", "2", "--kv-heads", "1", "--intermediate", "32"])
        .args(["--max-positions", "128", "--seed", "9", "--chars", chars])
        .arg("--out")
        .arg(&teacher)
        .output()
        .unwrap());
    let cfg = dir.path().join("lake.yaml");
    std::fs::write(
        &cfg,
        format!(
            "name: st\nseed: 5\n\
             model: {{ init: {{ arch: qwen2, hidden: 16, layers: 1, heads: 2, kv_heads: 1, intermediate: 32, chars: \"SFGPWXLeftRighDowUp\\n\", max_positions: 128 }} }}\n\
             rl:\n  steps: 3\n  prompts_per_step: 2\n  group_size: 4\n  sampling: {{ max_new_tokens: 4 }}\n\
             \x20 optimizer: {{ lr: 0.01 }}\n\
             \x20 env: {{ name: frozen_lake, params: {{ map: SFG, legend: false }}, max_turns: 3, action_pattern: '(\\w+)' }}\n\
             \x20 opd: {{ teachers: [ {{ name: lake, path: {t}, tags: [frozen_lake] }}, {{ name: other, path: {t}, tags: [sokoban] }} ] }}\n\
             output_dir: {}\n",
            dir.path().join("out").display(),
            t = teacher.display()
        ),
    )
    .unwrap();
    let store = dir.path().join("lake.db");
    ok(roll(&store, &["run", "--quiet", cfg.to_str().unwrap()]));
    let kl = series(&store, "opd/kl/lake");
    assert_eq!(kl.len(), 3);
    assert!(kl.iter().all(|k| k.is_finite() && *k != 0.0), "{kl:?}");
    let all: Vec<Value> =
        serde_json::from_str(&ok(roll(&store, &["metrics", "st", "--json"]))).unwrap();
    assert!(
        all.iter().all(|s| s["key"] != "opd/kl/other"),
        "the sokoban teacher scored no frozen_lake episode"
    );
    assert!(all.iter().any(|s| s["key"] == "opd/kl/lake"));
    // Each episode's record carries its trained tokens — the actions, not the observations —
    // with the student's and the frozen_lake teacher's log-probs: as many as its turns generated
    // (the stored episodes' turns say how many).
    let samples: Vec<Value> =
        serde_json::from_str(&ok(roll(&store, &["samples", "st", "--json"]))).unwrap();
    let episodes: Vec<Value> = ok(roll(&store, &["trajectories", "st", "--json"]))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(samples.len(), episodes.len());
    for (s, e) in samples.iter().zip(&episodes) {
        assert_eq!(
            (&s["step"], &s["ground_truth"]),
            (
                &e["step"],
                &format!("episode seed {}", e["env_seed"]).into()
            )
        );
        let generated: u64 = e["turns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["response_tokens"].as_u64().unwrap())
            .sum();
        let t = &s["tokens"];
        let n = t["pieces"].as_array().unwrap().len();
        assert_eq!(n as u64, generated, "{s}");
        assert!(
            n < s["response_tokens"].as_u64().unwrap() as usize,
            "observations are not trained"
        );
        assert_eq!(t["student"].as_array().unwrap().len(), n);
        assert_eq!(t["teachers"]["lake"].as_array().unwrap().len(), n);
        assert!(t["teachers"].get("other").is_none());
        // Each stored turn holds its own part of the episode's trace, in order.
        let mut joined = vec![];
        for turn in e["turns"].as_array().unwrap() {
            let mine = turn["tokens"]["pieces"].as_array().unwrap();
            assert_eq!(mine.len() as u64, turn["response_tokens"].as_u64().unwrap());
            joined.extend(mine.iter().cloned());
        }
        assert_eq!(&joined, t["pieces"].as_array().unwrap());
    }
}
