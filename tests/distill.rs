//! Offline distillation end to end on the binary (`distill:`): a teacher trained by SFT, a
//! student that learns its top-k distributions (the KD term moves it to the teacher), the same
//! numbers with actor_train or the teacher in worker processes, `distill_loss_weight: 0`
//! reproducing an SFT stage to the bit, and a teacher of another tokenizer or a top-k wider than
//! the vocabulary refused before any step.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::path::Path;

use common::{refused, roll, run_quiet, write_config};

fn series(store: &Path, run: &str, stage: &str, key: &str) -> Vec<f64> {
    common::stage_series(store, run, stage, key)
}

fn distill(teacher: &Path, extra: &str) -> String {
    format!(
        "name: st\nseed: 4\ndistill: {{ teacher: {}, steps: 12, batch_size: 8, logits_topk: 8, \
         optimizer: {{ lr: 0.01 }}{extra} }}\n",
        teacher.display()
    )
}

#[test]
fn a_student_learns_the_teachers_top_k_and_w_0_is_sft() {
    let dir = tempfile::tempdir().unwrap();
    let teacher = common::sft_teacher(dir.path());
    assert!(
        teacher.join("config.json").is_file(),
        "{}",
        teacher.display()
    );

    let store = run_quiet(dir.path(), "st", &distill(&teacher, ""), &[]);
    let kd = series(&store, "st", "distill", "distill/kd");
    assert_eq!(kd.len(), 12);
    assert!(kd[11] < 0.7 * kd[0], "the KD term falls: {kd:?}");
    let agree = series(&store, "st", "distill", "distill/top1_agreement");
    assert!(agree[11] > agree[0], "{agree:?}");
    for key in ["distill/loss", "distill/ce"] {
        assert!(
            series(&store, "st", "distill", key)
                .iter()
                .all(|v| v.is_finite())
        );
    }
    // Per domain, token means over the domain's answers: the batch's KD lies between them.
    let (add, rev) = (
        series(&store, "st", "distill", "distill/add/kd"),
        series(&store, "st", "distill", "distill/rev/kd"),
    );
    for i in 0..12 {
        let (lo, hi) = (add[i].min(rev[i]), add[i].max(rev[i]));
        assert!(
            lo - 1e-6 <= kd[i] && kd[i] <= hi + 1e-6,
            "step {}: {kd:?} {add:?} {rev:?}",
            i + 1
        );
    }
    for key in ["distill/add/ce", "distill/rev/top1_agreement"] {
        assert_eq!(series(&store, "st", "distill", key).len(), 12, "{key}");
    }
    // actor_train in a worker process is handed the teacher's top k in its step file: the same
    // numbers.
    let there = run_quiet(
        dir.path(),
        "there",
        &distill(&teacher, ""),
        &["workers.actor_train.mode=process"],
    );
    common::assert_same_metrics(&store, &there, "st");
    // So is a teacher in a worker process of its own: what it sends is its top k, to the bit.
    let apart = run_quiet(
        dir.path(),
        "apart",
        &distill(&teacher, ""),
        &["workers.teacher.mode=process"],
    );
    common::assert_same_metrics(&store, &apart, "st");
    let events = common::run_events(&apart, "st");
    assert_eq!(
        common::of_kind(&events, "worker_started")
            .iter()
            .filter(|e| e["worker"]
                .as_str()
                .is_some_and(|w| w.starts_with("teacher")))
            .count(),
        1,
        "{events:#?}"
    );
    // Teacher and student share device 0, so they take turns on it: each step's `teach` phase
    // offloads actor_train (from the second step on, once it has been there) and each `train`
    // phase the teacher; a reload brings back the bytes its offload took. In its worker the
    // teacher moves the same bytes.
    for (store, how) in [(&store, "in process"), (&apart, "in its worker")] {
        let moves = common::transfers(&common::run_events(store, "st"));
        let count = |kind: &str, who: &str| {
            moves
                .iter()
                .filter(|(k, w, _)| k == kind && w.starts_with(who))
                .count()
        };
        assert_eq!(
            (count("offload", "teacher"), count("reload", "teacher")),
            (12, 11),
            "{how}: {moves:?}"
        );
        assert_eq!(
            (
                count("offload", "actor_train"),
                count("reload", "actor_train")
            ),
            (11, 11),
            "{how}: {moves:?}"
        );
        let bytes = |who: &str| -> Vec<u64> {
            let mut b: Vec<u64> = moves
                .iter()
                .filter(|(_, w, _)| w.starts_with(who))
                .map(|(_, _, b)| *b)
                .collect();
            b.dedup();
            b
        };
        assert_eq!(bytes("teacher").len(), 1, "{how}: {moves:?}");
        assert!(bytes("teacher")[0] > 0);
    }
    // On a device of its own the teacher never moves, nor does the student, and the numbers are
    // the same.
    let own = run_quiet(
        dir.path(),
        "own",
        &distill(&teacher, ""),
        &[
            "workers.devices.count=2",
            "workers.teacher.device_mapping=[1]",
        ],
    );
    common::assert_same_metrics(&store, &own, "st");
    assert_eq!(common::transfers(&common::run_events(&own, "st")), vec![]);
    // What crosses from the teacher: 8 ids and 8 log-probs a token.
    assert_eq!(
        series(&store, "st", "distill", "distill/topk_bytes_per_token")[0],
        64.0
    );

    // w = 0: the stage is SFT, batches, seeds and numbers alike.
    let zero = run_quiet(
        dir.path(),
        "zero",
        &distill(&teacher, ", distill_loss_weight: 0"),
        &[],
    );
    let sft = run_quiet(
        dir.path(),
        "sft",
        "name: st\nseed: 4\nsft: { steps: 12, batch_size: 8, optimizer: { lr: 0.01 } }\n",
        &[],
    );
    assert_eq!(
        series(&zero, "st", "distill", "distill/ce"),
        series(&sft, "st", "sft", "sft/loss")
    );
    assert_eq!(
        series(&zero, "st", "distill", "distill/loss"),
        series(&sft, "st", "sft", "sft/loss")
    );
    // The KD term is what moves the student to the teacher: without it (w = 0, the divergence
    // still measured) the student ends further from the teacher than with it.
    let kd_zero = series(&zero, "st", "distill", "distill/kd");
    assert_eq!(
        kd_zero[0], kd[0],
        "the same student and batch before any step"
    );
    assert!(kd[11] < 0.8 * kd_zero[11], "{kd:?} vs {kd_zero:?}");
}

#[test]
fn a_teacher_of_another_tokenizer_or_a_top_k_past_the_vocabulary_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let teacher = common::sft_teacher(dir.path());
    let cfg = write_config(dir.path(), "st", &distill(&teacher, ""));
    let store = dir.path().join("bad.db");
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--quiet", cfg.to_str().unwrap()];
        args.extend_from_slice(extra);
        refused(roll(&store, &args))
    };
    // The student's characters in another order: same size, other ids.
    let e = run(&["model.init.chars=\"9876543210+=abc>\""]);
    assert!(e.contains("distill.teacher"), "{e}");
    assert!(e.contains("tokenizer differs from the student's"), "{e}");
    let e = run(&["model.init.chars=\"0123456789+=abc>xyz\""]);
    assert!(e.contains("distillation needs one tokenizer"), "{e}");
    let e = run(&["distill.logits_topk=1000"]);
    assert!(
        e.contains("distill.logits_topk 1000 is larger than the vocabulary"),
        "{e}"
    );
    let e = run(&["distill.teacher=/nonexistent"]);
    assert!(e.contains("/nonexistent"), "{e}");
    // A LoRA run's checkpoint holds an adapter, not a model: merge it first.
    let adapter = dir.path().join("adapter");
    std::fs::create_dir_all(&adapter).unwrap();
    std::fs::write(adapter.join("adapter_config.json"), "{}").unwrap();
    let at = format!("distill.teacher={}", adapter.display());
    let e = run(&[at.as_str()]);
    assert!(e.contains("a LoRA adapter without its base"), "{e}");
    assert!(e.contains("roll-tui model merge"), "{e}");
}

/// A teacher worker killed with SIGKILL is replaced and asked again (it is frozen: the fresh one
/// loads what the lost one held), and the run ends with the numbers of an undisturbed one.
#[test]
fn a_teacher_worker_killed_9_is_replaced_and_the_numbers_stay() {
    let dir = tempfile::tempdir().unwrap();
    let teacher = common::sft_teacher(dir.path());
    let rest = distill(&teacher, "").replace("steps: 12", "steps: 40");
    let calm = run_quiet(dir.path(), "calm", &rest, &["workers.teacher.mode=process"]);

    let store = dir.path().join("killed.db");
    let cfg = write_config(dir.path(), "killed", &rest);
    let args = ["run", cfg.to_str().unwrap(), "workers.teacher.mode=process"];
    let (mut child, lines) = common::spawn_until(&store, args, "distill    3/");
    let pid = common::kill_9_worker(child.id(), "teacher");
    let rest_of_output: Vec<String> = lines.map(|l| l.unwrap()).collect();
    assert!(child.wait().unwrap().success(), "{rest_of_output:?}");

    common::assert_same_metrics(&calm, &store, "st");
    let events = common::run_events(&store, "st");
    let failed = common::of_kind(&events, "worker_failed");
    assert_eq!(failed.len(), 1, "{events:#?}");
    assert_eq!(
        failed[0]["message"].as_str().unwrap(),
        format!("pid {pid} died (killed by signal 9)")
    );
}

/// `distill.cache`: a rerun that sees the same batches takes the teacher's top k from disk, to the
/// same numbers; a cache of another teacher (here the same directory trained again: its weights
/// rewritten) is refused, naming both.
#[test]
fn a_cached_top_k_serves_a_rerun_and_another_teachers_cache_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let teacher = common::sft_teacher(dir.path());
    let cache = dir.path().join("topk");
    let rest = distill(&teacher, &format!(", cache: {}", cache.display()));
    let first = run_quiet(dir.path(), "first", &rest, &[]);
    let again = run_quiet(dir.path(), "again", &rest, &[]);
    let cached = |store: &Path| series(store, "st", "distill", "distill/cached_batches");
    assert_eq!(cached(&first).last(), Some(&0.0));
    assert_eq!(cached(&again).last(), Some(&12.0));
    for key in ["distill/kd", "distill/loss", "distill/top1_agreement"] {
        assert_eq!(
            series(&first, "st", "distill", key),
            series(&again, "st", "distill", key),
            "{key}"
        );
    }
    // The teacher trained again in place: its weights written at another time.
    let weights = teacher.join("model.safetensors");
    std::fs::File::options()
        .write(true)
        .open(&weights)
        .unwrap()
        .set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(86_400))
        .unwrap();
    let cfg = write_config(dir.path(), "stale", &rest);
    let e = refused(roll(
        &dir.path().join("stale.db"),
        &["run", "--quiet", cfg.to_str().unwrap()],
    ));
    assert!(e.contains("it holds the top k of another teacher"), "{e}");
}
