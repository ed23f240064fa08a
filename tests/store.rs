//! The experiment store through its public API, on temporary databases with migrations applied:
//! round trips, a reader racing the writer, dead-run detection, resume truncation, and files that are
//! not ours (refused and left byte-for-byte unchanged).

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::path::Path;

use roll::metrics::{CheckpointRecord, SampleRecord};
use roll::store::liveness::ProcessIdentity;
use roll::store::reads::SampleFilter;
use roll::store::series::display_order;
use roll::store::series_since::SeriesUpdate;
use roll::store::{
    EventKind, EventRecord, NewRun, OpenMode, RunId, RunStatus, Store, StoreError,
    TrajectoryRecord, TurnRecord,
};

fn new_run(name: &str) -> NewRun {
    NewRun {
        name: name.into(),
        config_json: "{}".into(),
        config_hash: "h".into(),
        git_revision: None,
        seed: 1,
        output_dir: "runs/x".into(),
    }
}

fn sample(step: usize, domain: &str) -> SampleRecord {
    SampleRecord {
        stage: "rl".into(),
        step,
        domain: domain.into(),
        prompt: "1+2=".into(),
        response: "3".into(),
        ground_truth: "3".into(),
        reward: 1.0,
        correct: true,
        breakdown: [("correct".to_string(), 1.0)].into_iter().collect(),
        advantage: 0.5,
        prompt_tokens: 4,
        response_tokens: 2,
        finish_reason: "eos".into(),
        policy_version: step - 1,
        // One sample with an on-policy distillation trace, a missing log-prob among it.
        tokens: (domain == "rev").then(|| roll::metrics::TokenTrace {
            pieces: vec!["3".into(), "\n".into()],
            student: vec![Some(-0.125), Some(-2.5)],
            teachers: [("t".to_string(), vec![None, Some(-1.5)])].into(),
        }),
    }
}

/// Our pid with another start time: a process that cannot be alive (None without /proc).
fn not_alive(me: &ProcessIdentity) -> Option<ProcessIdentity> {
    let (ns, ticks) = me.token.as_deref()?.rsplit_once('/')?;
    let ticks: u64 = ticks.parse().ok()?;
    Some(ProcessIdentity {
        token: Some(format!("{ns}/{}", ticks + 1)),
        ..me.clone()
    })
}

async fn open(path: &Path) -> Store {
    Store::open(path, OpenMode::Create).await.unwrap()
}

/// A store in `dir` with run "r" owned by a process that is gone (so it can be resumed), and this
/// process's identity (to resume it with).
async fn run_of_a_gone_process(dir: &Path) -> (Store, RunId, ProcessIdentity) {
    let store = open(&dir.join("roll.db")).await;
    let me = ProcessIdentity::current();
    let dead = not_alive(&me).unwrap_or_else(|| me.clone());
    let run = store.create_run(&new_run("r"), false, &dead).await.unwrap();
    (store, run, me)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_then_read_everything_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("roll.db");
    let store = open(&path).await;
    let me = ProcessIdentity::current();
    let run = store.create_run(&new_run("a"), false, &me).await.unwrap();
    let (writer, task) = store.spawn_writer();
    // 1200 steps crosses two chunk boundaries (512 points per chunk).
    for step in 1..=1200u64 {
        let points = vec![
            ("reward/add/mean".to_string(), step as f64 * 0.5),
            ("actor/kl".to_string(), 1.0 / step as f64),
        ];
        writer
            .metrics(run, "rl", step, step as f64 * 0.1, points)
            .await
            .unwrap();
    }
    writer
        .metrics(run, "sft", 1, 0.0, vec![("actor/kl".into(), 7.0)])
        .await
        .unwrap();
    let w = writer.clone();
    tokio::task::spawn_blocking(move || {
        w.samples_blocking(run, vec![sample(1, "add"), sample(2, "rev")])
            .unwrap();
        w.checkpoint_blocking(
            run,
            CheckpointRecord {
                stage: "rl".into(),
                step: 2,
                path: "c/rl-step2".into(),
                bytes: 10,
            },
        )
        .unwrap();
        w.event_blocking(
            Some(run),
            EventRecord::message(EventKind::Warning, "careful"),
        )
        .unwrap();
        w.trajectory_blocking(
            run,
            TrajectoryRecord {
                stage: "rl".into(),
                step: 2,
                env: "frozen_lake".into(),
                env_seed: 9,
                policy_version: 1,
                success: true,
                group: 3,
                episode: 1,
                end_reason: "done".into(),
                turns: vec![
                    TurnRecord {
                        observation: "S.F".into(),
                        action_text: "<answer>right</answer>".into(),
                        parsed_action: Some("right".into()),
                        reward: 0.0,
                        done: false,
                        prompt_tokens: 10,
                        response_tokens: 4,
                        info: serde_json::json!({"state": 1, "action_is_valid": true})
                            .as_object()
                            .cloned()
                            .unwrap_or_default(),
                        tokens: Some(roll::metrics::TokenTrace {
                            pieces: vec!["<answer>".into(), "right".into()],
                            student: vec![Some(-0.5), None],
                            teachers: [("t".to_string(), vec![Some(-1.0), Some(-2.0)])].into(),
                        }),
                    },
                    TurnRecord {
                        observation: ".SF".into(),
                        action_text: "jump".into(),
                        parsed_action: None,
                        reward: 1.0,
                        done: true,
                        prompt_tokens: 12,
                        response_tokens: 1,
                        info: Default::default(),
                        tokens: None,
                    },
                ],
            },
        )
        .unwrap();
        w.status_blocking(run, RunStatus::Finished, None).unwrap();
        w.flush_blocking().unwrap();
    })
    .await
    .unwrap();
    drop(writer);
    task.await.unwrap();

    let series = store.load_series(run, None).await.unwrap();
    let keys: Vec<(&str, &str)> = series
        .iter()
        .map(|s| (s.stage.as_str(), s.key.as_str()))
        .collect();
    assert_eq!(
        keys,
        [
            ("sft", "actor/kl"),
            ("rl", "actor/kl"),
            ("rl", "reward/add/mean")
        ]
    );
    let reward = &series[2];
    assert_eq!(reward.steps, (1..=1200).collect::<Vec<u64>>());
    assert_eq!(reward.values[599], 300.0);
    assert_eq!(reward.wall_time[9].to_bits(), (10.0f64 * 0.1).to_bits());
    let glob = globset::Glob::new("reward/*").unwrap().compile_matcher();
    assert_eq!(store.load_series(run, Some(&glob)).await.unwrap().len(), 1);
    let info = store.list_series(run).await.unwrap();
    assert_eq!(info[2].points, 1200);
    assert_eq!(info[2].last_value, Some(600.0));

    let samples = store.samples(run, &SampleFilter::default()).await.unwrap();
    assert_eq!(samples, vec![sample(1, "add"), sample(2, "rev")]);
    let only = SampleFilter {
        domain: Some("rev".into()),
        ..Default::default()
    };
    assert_eq!(store.samples(run, &only).await.unwrap().len(), 1);
    let by_prompt = |p: &str| SampleFilter {
        prompt: Some(p.into()),
        ..Default::default()
    };
    assert_eq!(
        store.samples(run, &by_prompt("1+2=")).await.unwrap().len(),
        2
    );
    assert_eq!(
        store.samples(run, &by_prompt("1+2")).await.unwrap().len(),
        0
    );
    assert_eq!(store.sample_steps(run, "rl").await.unwrap(), vec![1, 2]);
    assert_eq!(
        store.sample_steps(run, "sft").await.unwrap(),
        Vec::<u64>::new()
    );
    let t = store.trajectories(run, Some(2)).await.unwrap();
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].turns[1].parsed_action, None);
    assert_eq!(t[0].turns[0].observation, "S.F");
    assert_eq!(
        (t[0].group, t[0].episode, t[0].end_reason.as_str()),
        (3, 1, "done")
    );
    assert_eq!(t[0].turns[0].info["state"], 1);
    let trace = t[0].turns[0].tokens.as_ref().expect("the turn's tokens");
    assert_eq!(trace.pieces, ["<answer>", "right"]);
    assert_eq!(trace.student, [Some(-0.5), None]);
    assert_eq!(trace.teachers["t"], [Some(-1.0), Some(-2.0)]);
    assert_eq!(t[0].turns[1].tokens, None);
    assert!(t[0].turns[1].info.is_empty());
    assert_eq!(store.checkpoints(run).await.unwrap()[0].step, 2);
    let events = store.events(run).await.unwrap();
    let kinds: Vec<EventKind> = events.iter().map(|e| e.event.kind).collect();
    assert_eq!(kinds, [EventKind::RunStarted, EventKind::Warning]);
    let info = store.find_run("a").await.unwrap();
    assert_eq!(info.status, RunStatus::Finished);
    assert_eq!(
        (info.last_stage.as_deref(), info.last_step),
        (Some("sft"), 1)
    );
    store.close().await;

    // Reopening keeps everything; the name is taken now.
    let store = Store::open(&path, OpenMode::Existing).await.unwrap();
    assert_eq!(store.load_series(run, None).await.unwrap(), series);
    let err = store
        .create_run(&new_run("a"), false, &me)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("run 'a' already exists") && err.contains("--overwrite"),
        "{err}"
    );
    // A finished run is not offered a resume; one that stopped part-way is, with its store.
    assert!(
        err.contains("(finished at sft step 1)") && !err.contains("resume"),
        "{err}"
    );
    if let Some(gone) = not_alive(&me) {
        store.create_run(&new_run("c"), false, &gone).await.unwrap();
        let err = store
            .create_run(&new_run("c"), false, &me)
            .await
            .unwrap_err()
            .to_string();
        let resume = format!("`roll-tui --store {} resume c`", path.display());
        assert!(err.contains(&resume), "{err}");
    }
    let err = store.find_run("b").await.unwrap_err().to_string();
    assert!(err.contains("no run 'b'"), "{err}");
}

/// The Samples view shows the stage that recorded samples last: a run's dpo stage, then its rl
/// stage once that records (whatever their step numbers), and nothing for a run without samples.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_latest_sample_stage_is_the_one_that_recorded_last() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(&dir.path().join("roll.db")).await;
    let me = ProcessIdentity::current();
    let run = store.create_run(&new_run("a"), false, &me).await.unwrap();
    let other = store.create_run(&new_run("b"), false, &me).await.unwrap();
    assert_eq!(store.latest_sample_stage(run).await.unwrap(), None);
    let (writer, task) = store.spawn_writer();
    let at = |stage: &str, step| SampleRecord {
        stage: stage.into(),
        ..sample(step, "add")
    };
    let write = |records: Vec<SampleRecord>, to: RunId| {
        let w = writer.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                w.samples_blocking(to, records).unwrap();
                w.flush_blocking().unwrap();
            })
            .await
            .unwrap()
        }
    };
    write(vec![at("dpo", 5), at("dpo", 9)], run).await;
    assert_eq!(
        store.latest_sample_stage(run).await.unwrap().as_deref(),
        Some("dpo")
    );
    write(vec![at("rl", 1)], run).await;
    // Another run's samples after it change nothing of this one.
    write(vec![at("dpo", 1)], other).await;
    assert_eq!(
        store.latest_sample_stage(run).await.unwrap().as_deref(),
        Some("rl")
    );
    assert_eq!(
        store.latest_sample_stage(other).await.unwrap().as_deref(),
        Some("dpo")
    );
    assert_eq!(store.sample_steps(run, "dpo").await.unwrap(), vec![5, 9]);
    drop(writer);
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_never_see_a_locked_database_while_the_writer_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("roll.db");
    let store = open(&path).await;
    let run = store
        .create_run(&new_run("busy"), false, &ProcessIdentity::current())
        .await
        .unwrap();
    let (writer, task) = store.spawn_writer();
    let producer = tokio::spawn(async move {
        for step in 1..=3000u64 {
            let points = (0..20).map(|k| (format!("k/{k}"), step as f64)).collect();
            writer.metrics(run, "rl", step, 0.0, points).await.unwrap();
        }
        writer.flush().await.unwrap();
    });
    // A second store handle (its own pool), as another process would open it.
    let reader = Store::open(&path, OpenMode::Existing).await.unwrap();
    let mut reads = 0;
    let mut last_len = 0;
    while !producer.is_finished() {
        let series = reader.load_series(run, None).await.unwrap();
        // Each read is a consistent snapshot: all series have the same length (one batch per commit).
        let lens: Vec<usize> = series.iter().map(|s| s.len()).collect();
        assert!(lens.windows(2).all(|w| w[0] == w[1]), "{lens:?}");
        let len = lens.first().copied().unwrap_or(0);
        assert!(len >= last_len);
        last_len = len;
        reader.list_runs().await.unwrap();
        reads += 1;
    }
    producer.await.unwrap();
    task.await.unwrap();
    let series = reader.load_series(run, None).await.unwrap();
    assert_eq!(series.len(), 20);
    assert!(series.iter().all(|s| s.len() == 3000));
    assert!(reads > 0);
}

#[tokio::test]
async fn a_run_whose_process_is_gone_is_marked_interrupted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("roll.db");
    let store = open(&path).await;
    let me = ProcessIdentity::current();
    // A process identity that cannot be alive: our pid with another start time.
    let Some(dead) = not_alive(&me) else {
        return; // no /proc: only the heartbeat can tell, which takes STALE_AFTER_MS
    };
    store
        .create_run(&new_run("dead"), false, &dead)
        .await
        .unwrap();
    store
        .create_run(&new_run("alive"), false, &me)
        .await
        .unwrap();
    store.close().await;
    let store = Store::open(&path, OpenMode::Existing).await.unwrap();
    let dead = store.find_run("dead").await.unwrap();
    assert_eq!(dead.status, RunStatus::Interrupted);
    assert!(dead.error.unwrap().contains("is gone"));
    assert_eq!(
        store.find_run("alive").await.unwrap().status,
        RunStatus::Running
    );
    let err = store
        .delete_run(store.find_run("alive").await.unwrap().id)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("refusing to delete"), "{err}");
}

#[tokio::test]
async fn resume_drops_what_came_after_the_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let (store, run, me) = run_of_a_gone_process(dir.path()).await;
    let (writer, task) = store.spawn_writer();
    for step in 1..=600u64 {
        writer
            .metrics(
                run,
                "sft",
                step,
                0.0,
                vec![("sft/loss".into(), step as f64)],
            )
            .await
            .unwrap();
    }
    for step in 1..=5u64 {
        writer
            .metrics(run, "rl", step, 0.0, vec![("actor/kl".into(), 1.0)])
            .await
            .unwrap();
    }
    writer.flush().await.unwrap();
    drop(writer);
    task.await.unwrap();
    let info = store.run(run).await.unwrap();
    let stale = info.clone();
    let dropped = store.begin_resume(&info, "sft", 550, &me).await.unwrap();
    assert_eq!(dropped, 50 + 5);
    let series = store.load_series(run, None).await.unwrap();
    assert_eq!(series.len(), 1);
    assert_eq!(series[0].steps.last(), Some(&550));
    assert_eq!(series[0].len(), 550);
    let listed = store.list_series(run).await.unwrap();
    assert_eq!((listed[0].points, listed[0].last_value), (550, Some(550.0)));
    let info = store.run(run).await.unwrap();
    assert_eq!(info.status, RunStatus::Running);
    let err = store
        .begin_resume(&info, "sft", 1, &me)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("still running"), "{err}");
    // A second resume that read the row before the first took it over must not take it too.
    let err = store
        .begin_resume(&stale, "sft", 1, &me)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("changed while this resume was getting ready"),
        "{err}"
    );
}

fn assert_refused_unchanged(path: &Path, needle: &str) {
    let before = std::fs::read(path).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    for mode in [OpenMode::Existing, OpenMode::Create] {
        let err = rt.block_on(Store::open(path, mode)).err().unwrap();
        let text = err.to_string();
        assert!(text.contains(needle), "{text}");
        assert!(text.contains(&path.display().to_string()), "{text}");
    }
    assert_eq!(
        std::fs::read(path).unwrap(),
        before,
        "the file was modified"
    );
    let wal = format!("{}-wal", path.display());
    assert!(!Path::new(&wal).exists() || std::fs::metadata(&wal).unwrap().len() == 0);
}

#[test]
fn foreign_and_corrupt_files_are_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "these are my notes, not a database\n").unwrap();
    assert_refused_unchanged(&text, "not an SQLite database");

    // Another application's SQLite database.
    let foreign = dir.path().join("other.db");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        use sqlx::ConnectOptions;
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&foreign)
            .create_if_missing(true)
            .connect()
            .await
            .unwrap();
        sqlx::query("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
            .execute(&mut conn)
            .await
            .unwrap();
        sqlx::query("INSERT INTO invoices (total) VALUES (12.5)")
            .execute(&mut conn)
            .await
            .unwrap();
    });
    assert_refused_unchanged(&foreign, "another application (it holds tables invoices)");

    // Another sqlx application that happens to have a `runs` table.
    let lookalike = dir.path().join("lookalike.db");
    rt.block_on(async {
        use sqlx::ConnectOptions;
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&lookalike)
            .create_if_missing(true)
            .connect()
            .await
            .unwrap();
        for sql in [
            "CREATE TABLE _sqlx_migrations (version BIGINT PRIMARY KEY, description TEXT, \
             installed_on TIMESTAMP, success BOOLEAN, checksum BLOB, execution_time BIGINT)",
            "INSERT INTO _sqlx_migrations VALUES (1, 'init', 0, 1, x'00ff', 5)",
            "CREATE TABLE runs (id INTEGER PRIMARY KEY, athlete TEXT, km REAL)",
        ] {
            sqlx::query(sql).execute(&mut conn).await.unwrap();
        }
    });
    assert_refused_unchanged(
        &lookalike,
        "another application (it holds tables _sqlx_migrations, runs)",
    );

    // One of ours, truncated (a copy cut short mid-file).
    let ours = dir.path().join("roll.db");
    rt.block_on(async {
        let store = open(&ours).await;
        let run = store
            .create_run(&new_run("x"), false, &ProcessIdentity::current())
            .await
            .unwrap();
        let (w, task) = store.spawn_writer();
        for step in 1..=2000u64 {
            w.metrics(run, "rl", step, 0.0, vec![("k".into(), 1.0)])
                .await
                .unwrap();
        }
        w.status(run, RunStatus::Finished).await.unwrap();
        drop(w);
        task.await.unwrap();
        store.close().await;
    });
    let bytes = std::fs::read(&ours).unwrap();
    let cut = dir.path().join("cut.db");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    assert_refused_unchanged(&cut, "is corrupt (truncated");

    // Garbage over every page after the first: the header is fine, the content is not.
    let mut mangled = bytes.clone();
    for b in &mut mangled[4096..] {
        *b = 0xA5;
    }
    let bad = dir.path().join("mangled.db");
    std::fs::write(&bad, &mangled).unwrap();
    let before = std::fs::read(&bad).unwrap();
    let err = rt
        .block_on(Store::open(&bad, OpenMode::Existing))
        .err()
        .unwrap();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert_eq!(std::fs::read(&bad).unwrap(), before);
}

/// `base` with `update` applied the way a reader following a live run applies it.
fn apply(base: &mut Vec<roll::metrics::Series>, update: SeriesUpdate) {
    match update {
        SeriesUpdate::Whole(all) => *base = all,
        SeriesUpdate::Appended(tails) => {
            for tail in tails {
                match base
                    .iter_mut()
                    .find(|s| s.stage == tail.stage && s.key == tail.key)
                {
                    Some(s) => {
                        s.steps.extend(tail.steps);
                        s.wall_time.extend(tail.wall_time);
                        s.values.extend(tail.values);
                    }
                    None => base.push(tail),
                }
            }
            base.sort_by(|a, b| {
                display_order(&a.stage, &a.key).cmp(&display_order(&b.stage, &b.key))
            });
        }
    }
}

#[tokio::test]
async fn a_live_reader_gets_only_what_came_after_its_mark() {
    let dir = tempfile::tempdir().unwrap();
    let (store, run, me) = run_of_a_gone_process(dir.path()).await;
    let (writer, task) = store.spawn_writer();
    let write = |from: u64, to: u64, keys: &'static [&'static str]| {
        let writer = writer.clone();
        async move {
            for step in from..=to {
                let points = keys
                    .iter()
                    .map(|k| (k.to_string(), step as f64 * 0.5))
                    .collect();
                writer
                    .metrics(run, "rl", step, step as f64, points)
                    .await
                    .unwrap();
            }
            writer.flush().await.unwrap();
        }
    };
    write(1, 500, &["actor/kl", "reward/mean"]).await;
    let first = store.series_since(run, None).await.unwrap();
    let SeriesUpdate::Whole(mut seen) = first.update else {
        panic!("a first read is whole: {:?}", first.update);
    };
    assert_eq!(seen, store.load_series(run, None).await.unwrap());
    assert_eq!(first.mark.len(), 2);

    // Nothing new: nothing sent.
    let idle = store.series_since(run, Some(&first.mark)).await.unwrap();
    assert_eq!(idle.update, SeriesUpdate::Appended(vec![]));
    assert_eq!(idle.mark, first.mark);

    // Across the 512-point chunk boundary, and a series that appears later.
    write(501, 530, &["actor/kl", "reward/mean", "actor/entropy"]).await;
    let next = store.series_since(run, Some(&idle.mark)).await.unwrap();
    let SeriesUpdate::Appended(tails) = &next.update else {
        panic!("expected only the news: {:?}", next.update);
    };
    let sizes: Vec<(&str, usize, Option<u64>)> = tails
        .iter()
        .map(|t| (t.key.as_str(), t.len(), t.steps.first().copied()))
        .collect();
    assert_eq!(
        sizes,
        [
            ("actor/entropy", 30, Some(501)),
            ("actor/kl", 30, Some(501)),
            ("reward/mean", 30, Some(501))
        ]
    );
    apply(&mut seen, next.update);
    assert_eq!(seen, store.load_series(run, None).await.unwrap());

    // A resume rewrites steps already read: the reader gets everything again.
    write(531, 540, &["actor/kl"]).await;
    drop(writer);
    task.await.unwrap();
    let info = store.run(run).await.unwrap();
    store.begin_resume(&info, "rl", 520, &me).await.unwrap();
    let (writer, task) = store.spawn_writer();
    for step in 521..=525u64 {
        writer
            .metrics(run, "rl", step, 1.0, vec![("actor/kl".into(), -1.0)])
            .await
            .unwrap();
    }
    writer.flush().await.unwrap();
    drop(writer);
    task.await.unwrap();
    let after_resume = store.series_since(run, Some(&next.mark)).await.unwrap();
    assert!(matches!(after_resume.update, SeriesUpdate::Whole(_)));
    apply(&mut seen, after_resume.update);
    let whole = store.load_series(run, None).await.unwrap();
    assert_eq!(seen, whole);
    assert_eq!(whole[1].values.last(), Some(&-1.0));
    assert_eq!(whole[1].steps.last(), Some(&525));
}

/// A store as roll-tui wrote it before typed events (migration 1 only): events with their facts
/// only in the text. Opening it applies migration 2, which keeps every event and recovers the
/// fields from that text.
#[tokio::test]
async fn a_store_from_before_typed_events_is_migrated_with_its_fields_recovered() {
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePool};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .create_if_missing(true);
    let pool = SqlitePool::connect_with(options).await.unwrap();
    let mut first = roll::store::migrations::migrator();
    first.migrations = std::borrow::Cow::Owned(first.migrations[..1].to_vec());
    first.run(&pool).await.unwrap();
    sqlx::query(
        "INSERT INTO runs (id, name, status, created_at, updated_at, heartbeat_at, config_json, \
         config_hash, seed, output_dir) VALUES (1, 'old', 'interrupted', 0, 0, 0, '{}', 'h', 1, 'o')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let old_events = [
        ("run_started", None, "run 'old' started"),
        ("worker_started", Some("actor_infer-0"), "started, pid 4242"),
        (
            "offload",
            Some("actor_train"),
            "offload actor_train 1024 bytes in 0.010 s (phase generate)",
        ),
        (
            "worker_failed",
            Some("reward-1"),
            "pid 77 died (killed by signal 9)",
        ),
        (
            "warning",
            Some("reward-1"),
            "replaced (reward worker 1 died during 'score')",
        ),
        ("info", Some("reward-1"), "stderr: hello pid 5"),
        ("run_ended", None, "run finished"),
        (
            "warning",
            None,
            "run marked interrupted: no heartbeat for 45 s",
        ),
        ("error", None, "run failed: out of memory"),
    ];
    for (i, (kind, worker, message)) in old_events.iter().enumerate() {
        sqlx::query(
            "INSERT INTO events (run_id, at, kind, worker, message) VALUES (1, ?, ?, ?, ?)",
        )
        .bind(i as i64)
        .bind(kind)
        .bind(worker)
        .bind(message)
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;

    let store = Store::open(&path, OpenMode::Existing).await.unwrap();
    let run = store.find_run("old").await.unwrap();
    let events = store.events(run.id).await.unwrap();
    let fields: Vec<_> = events
        .iter()
        .map(|e| {
            let r = &e.event;
            (
                r.kind.as_str(),
                r.role.as_deref(),
                r.worker_index,
                r.pid,
                r.phase.as_deref(),
                r.run_status.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        fields,
        [
            ("run_started", None, None, None, None, None),
            (
                "worker_started",
                Some("actor_infer"),
                Some(0),
                Some(4242),
                None,
                None
            ),
            (
                "offload",
                Some("actor_train"),
                None,
                None,
                Some("generate"),
                None
            ),
            (
                "worker_failed",
                Some("reward"),
                Some(1),
                Some(77),
                None,
                None
            ),
            ("warning", Some("reward"), Some(1), None, None, None),
            // A pid in a log line is the line's text, not the worker's pid.
            ("info", Some("reward"), Some(1), None, None, None),
            ("run_ended", None, None, None, None, Some("finished")),
            (
                "run_marked_interrupted",
                None,
                None,
                None,
                None,
                Some("interrupted")
            ),
            ("error", None, None, None, None, Some("failed")),
        ]
    );
    // Nothing else changed: every message and the order are as written.
    let messages: Vec<&str> = events.iter().map(|e| e.event.message.as_str()).collect();
    let written: Vec<&str> = old_events.iter().map(|(_, _, m)| *m).collect();
    assert_eq!(messages, written);
}
