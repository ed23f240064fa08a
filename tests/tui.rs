//! The workbench without a terminal: state tests (messages in, state and effects out), render
//! snapshots of every view on ratatui's `TestBackend` (fixed clock, no ids or paths on screen), and
//! the loader reading a real store written by the binary.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use roll::metrics::Series;
use roll::store::series_since::{SeriesRead, SeriesUpdate};
use roll::store::{RunId, RunInfo, RunStatus};
use roll::tui::app::{App, Effect, Msg, View};
use roll::tui::loader::Loader;
use roll::tui::runs::RunRow;
use roll::tui::ui::render;

const TINY_RL: &str = r#"
name: tiny
seed: 3
sft: { steps: 2, batch_size: 8, optimizer: { lr: 0.01 } }
rl:
  steps: 2
  prompts_per_step: 4
  group_size: 4
  sampling: { temperature: 1.0, max_new_tokens: 6 }
  optimizer: { lr: 0.001 }
"#;

/// The clock of every snapshot: 2026-01-01T00:00:00Z.
const NOW: i64 = 1_767_225_600_000;

fn key(code: KeyCode) -> Msg {
    Msg::Key(KeyEvent::new(code, KeyModifiers::NONE))
}

fn ch(c: char) -> Msg {
    key(KeyCode::Char(c))
}

fn info(id: i64, name: &str, status: RunStatus, minutes_ago: i64) -> RunInfo {
    let json = serde_json::json!({
        "id": id, "name": name, "status": status.as_str(),
        "created_at": NOW - minutes_ago * 60_000, "updated_at": NOW, "heartbeat_at": NOW,
        "config_hash": "h", "git_revision": null, "seed": 1, "output_dir": "out", "notes": "",
        "tags": [], "last_stage": "rl", "last_step": id * 10, "error": null, "host": null,
        "pid": null,
    });
    serde_json::from_value(json).unwrap()
}

fn rows() -> Vec<RunRow> {
    let mut a = RunRow {
        info: info(1, "quickstart", RunStatus::Finished, 3 * 60),
        live: false,
        reward: Some(0.8125),
        accuracy: Some(0.75),
        sft_loss: Some(0.4321),
        process: None,
        paused: false,
        stage_steps: None,
        step_seconds: None,
    };
    a.info.tags = vec!["baseline".into()];
    let mut b = RunRow {
        info: info(2, "gae-critic", RunStatus::Failed, 90),
        live: false,
        reward: Some(0.25),
        accuracy: None,
        sft_loss: Some(1.5),
        process: None,
        paused: false,
        stage_steps: None,
        step_seconds: None,
    };
    b.info.error = Some("critic worker 0 died during 'train'\nmore detail".into());
    let c = RunRow {
        info: info(3, "async-a2", RunStatus::Running, 2),
        live: true,
        reward: None,
        accuracy: None,
        sft_loss: None,
        process: None,
        paused: false,
        stage_steps: None,
        step_seconds: None,
    };
    vec![a, b, c]
}

fn series(key: &str, f: impl Fn(f64) -> f64) -> Series {
    let n = 60;
    Series {
        stage: "rl".into(),
        key: key.into(),
        steps: (1..=n).collect(),
        wall_time: (0..n).map(|i| i as f64 * 1.5).collect(),
        values: (1..=n).map(|s| f(s as f64)).collect(),
    }
}

fn dashboard_series() -> Vec<Series> {
    vec![
        series("reward/add/mean", |s| 1.0 - (-s / 20.0).exp()),
        series("reward/rev/mean", |s| 0.5 - 0.5 * (-s / 10.0).exp()),
        series("actor/pg_loss", |s| (s * 0.7).sin() * 0.1),
        series("actor/entropy", |s| 2.0 - s / 40.0),
        series("response_length/mean", |s| 4.0 + (s / 7.0).cos()),
        series("time/step", |_| 0.06),
    ]
}

fn screen(app: &App, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|f| render(f, app, NOW)).unwrap();
    terminal.backend().to_string()
}

/// The dashboard of the oldest run (quickstart), its series loaded.
fn quickstart_dashboard() -> App {
    let mut app = loaded_app();
    app.update(ch('G'));
    app.update(key(KeyCode::Enter));
    app.update(Msg::SeriesLoaded {
        run: RunId(1),
        since: None,
        result: Ok(SeriesRead::whole(dashboard_series())),
    });
    app
}

fn loaded_app() -> App {
    let mut app = App::new();
    app.update(Msg::Resize {
        width: 100,
        height: 30,
    });
    app.update(Msg::RunsLoaded(Ok(rows())));
    app
}

#[test]
fn keys_drive_the_views_and_effects() {
    let mut app = App::new();
    assert_eq!(app.start(), vec![Effect::LoadRuns]);
    app.update(Msg::RunsLoaded(Ok(rows())));
    // Newest first: async-a2 is selected; j moves to gae-critic; Enter opens its dashboard.
    assert_eq!(app.runs.selected, Some(RunId(3)));
    app.update(ch('j'));
    assert_eq!(
        app.update(key(KeyCode::Enter)),
        vec![Effect::load_whole(RunId(2))]
    );
    assert_eq!(app.view, View::Dashboard);
    // An answer for another run (a dashboard closed since) changes nothing.
    app.update(Msg::SeriesLoaded {
        run: RunId(1),
        since: None,
        result: Ok(SeriesRead::whole(dashboard_series())),
    });
    assert!(!app.dashboard.as_ref().unwrap().loaded);
    app.update(Msg::SeriesLoaded {
        run: RunId(2),
        since: None,
        result: Ok(SeriesRead::whole(dashboard_series())),
    });
    assert!(app.dashboard.as_ref().unwrap().loaded);
    // A stored (not live) run is never polled; Ctrl-r reloads it.
    for _ in 0..8 {
        assert!(app.update(Msg::Tick).is_empty());
    }
    let reload = Msg::Key(KeyEvent::new(KeyCode::Char('r'), KeyModifiers::CONTROL));
    assert_eq!(app.update(reload), vec![Effect::load_whole(RunId(2))]);
    // Esc goes back; reopening the same run does not read it again.
    app.update(key(KeyCode::Esc));
    assert_eq!(app.view, View::Runs);
    assert!(app.update(key(KeyCode::Enter)).is_empty());
    app.update(ch('1'));
    // The run list polls while a live run is on it.
    let polls: Vec<Effect> = (0..4).flat_map(|_| app.update(Msg::Tick)).collect();
    assert_eq!(polls, vec![Effect::LoadRuns]);
    // Help is modal: q closes it instead of quitting.
    app.update(ch('?'));
    assert!(app.help);
    app.update(ch('q'));
    assert!(!app.help && !app.quit);
    app.update(ch('q'));
    assert!(app.quit);
}

#[test]
fn typing_a_filter_narrows_the_list_and_esc_clears_it() {
    let mut app = loaded_app();
    app.update(ch('/'));
    for c in "gae".chars() {
        app.update(ch(c));
    }
    assert_eq!(app.runs.visible().len(), 1);
    assert_eq!(app.runs.selected, Some(RunId(2)));
    // While typing, q is a letter, not quit.
    app.update(ch('q'));
    assert!(!app.quit);
    assert_eq!(app.runs.filter, "gaeq");
    app.update(key(KeyCode::Backspace));
    app.update(key(KeyCode::Enter));
    assert_eq!(app.input, None);
    assert_eq!(app.runs.filter, "gae");
    app.update(key(KeyCode::Esc));
    assert_eq!(app.runs.filter, "");
    assert_eq!(app.runs.visible().len(), 3);
    // Errors from the loader show in the status line.
    app.update(Msg::RunsLoaded(Err("database is locked".into())));
    assert!(screen(&app, 100, 30).contains("database is locked"));
}

#[test]
fn a_store_that_cannot_be_read_is_said_once_in_place_of_the_runs() {
    let mut app = App::new();
    app.update(Msg::Resize {
        width: 100,
        height: 24,
    });
    let error = "store 'x.db': an SQLite database of another application (it holds tables notes)";
    app.update(Msg::RunsLoaded(Err(error.into())));
    let shown = screen(&app, 100, 24);
    // Not an invitation to start a run above the real problem, and the problem said once.
    assert!(!shown.contains("No runs in this store yet"), "{shown}");
    assert!(shown.contains("Cannot read the store"), "{shown}");
    assert_eq!(shown.matches("another application").count(), 1, "{shown}");
}

#[test]
fn a_failed_run_says_why_in_the_runs_list_and_on_its_dashboard() {
    let mut app = loaded_app();
    let listed = screen(&app, 100, 24);
    let line = listed
        .lines()
        .find(|l| l.contains("gae-critic"))
        .unwrap_or_default();
    assert!(line.contains("critic worker 0 died"), "{listed}");
    app.update(ch('j')); // gae-critic
    app.update(key(KeyCode::Enter));
    let dash = screen(&app, 100, 30);
    let head = dash.lines().nth(1).unwrap_or_default();
    assert!(
        head.contains("failed: critic worker 0 died during 'train'"),
        "{dash}"
    );
    assert!(!dash.contains("more detail"), "only the first line: {dash}");
}

#[test]
fn the_runs_list_is_reread_now_and_then_with_nothing_live() {
    let mut app = App::new();
    let mut rows = rows();
    rows.retain(|r| !r.live);
    app.update(Msg::RunsLoaded(Ok(rows)));
    let polls: Vec<usize> = (1..=40)
        .filter(|_| app.update(Msg::Tick).contains(&Effect::LoadRuns))
        .collect();
    // Every 20 ticks (5 s), not every live poll (4 ticks): a run deleted elsewhere disappears
    // without Ctrl-r.
    assert_eq!(polls, [20, 40]);
}

#[test]
fn compared_runs_show_what_differs_in_their_configs() {
    let mut app = App::new();
    app.update(Msg::Resize {
        width: 100,
        height: 30,
    });
    let mut rows = rows();
    for (row, (seed, coef)) in rows.iter_mut().zip([(1, 0.01), (2, 0.05), (1, 0.01)]) {
        row.info.config_json = format!(
            r#"{{"name": "{}", "seed": {seed}, "rl": {{"kl": {{"coef": {coef}}}, "steps": 150}}}}"#,
            row.info.name
        );
    }
    app.update(Msg::RunsLoaded(Ok(rows)));
    app.update(ch(' ')); // async-a2 (seed 1)
    app.update(ch('j'));
    app.update(ch(' ')); // gae-critic (seed 2)
    app.update(ch('c'));
    let shown = screen(&app, 100, 30);
    let line = shown.lines().nth(2).unwrap_or_default();
    assert!(
        line.contains("config differs: rl.kl.coef 0.05 vs 0.01 · seed 2 vs 1"),
        "{shown}"
    );
}

#[test]
fn runs_view_snapshots() {
    let mut app = loaded_app();
    app.update(ch(' ')); // mark async-a2
    insta::assert_snapshot!("runs", screen(&app, 100, 24));
    app.update(ch('?'));
    insta::assert_snapshot!("runs_help", screen(&app, 100, 30));
    let mut loading = App::new();
    loading.update(Msg::Resize {
        width: 80,
        height: 24,
    });
    insta::assert_snapshot!("runs_loading", screen(&loading, 80, 24));
    loading.update(Msg::Resize {
        width: 60,
        height: 20,
    });
    insta::assert_snapshot!("too_small", screen(&loading, 60, 20));
}

#[test]
fn dashboard_snapshots() {
    let mut app = loaded_app();
    app.update(ch('G')); // the oldest run: quickstart
    app.update(key(KeyCode::Enter));
    insta::assert_snapshot!("dashboard_loading", screen(&app, 100, 30));
    app.update(Msg::SeriesLoaded {
        run: RunId(1),
        since: None,
        result: Ok(SeriesRead::whole(dashboard_series())),
    });
    insta::assert_snapshot!("dashboard", screen(&app, 100, 30));
    app.update(key(KeyCode::Tab));
    app.update(ch('e'));
    app.update(ch('+'));
    app.update(ch(']'));
    insta::assert_snapshot!("dashboard_expanded_zoomed", screen(&app, 100, 30));
}

#[test]
fn the_loader_reads_a_store_the_binary_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("runs.db");
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Before any run there is no store: a clear error, not a crash or a new file.
    let missing = rt.block_on(Loader::new(&store).load(Effect::LoadRuns));
    let Msg::RunsLoaded(Err(e)) = missing else {
        panic!("{missing:?}")
    };
    assert!(
        e.contains("no store at") && e.contains("start a run (n) to create it"),
        "{e}"
    );
    assert!(!store.exists());

    let tiny = common::run_quiet(dir.path(), "tiny", TINY_RL, &[]);
    let loader = Loader::new(&tiny);
    let Msg::RunsLoaded(Ok(rows)) = rt.block_on(loader.load(Effect::LoadRuns)) else {
        panic!("runs not loaded")
    };
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!((row.info.name.as_str(), row.live), ("tiny", false));
    assert_eq!(row.info.status, RunStatus::Finished);
    assert!(row.reward.is_some() && row.sft_loss.is_some(), "{row:?}");
    let Msg::SeriesLoaded {
        result:
            Ok(SeriesRead {
                update: SeriesUpdate::Whole(series),
                ..
            }),
        ..
    } = rt.block_on(loader.load(Effect::load_whole(row.info.id)))
    else {
        panic!("series not loaded")
    };
    assert!(
        series
            .iter()
            .any(|s| s.key == "actor/pg_loss" && !s.values.is_empty())
    );
    rt.block_on(loader.close());
}

/// Carry out every read `effects` asks for (and the reads their answers ask for) on `loader`.
fn settle(rt: &tokio::runtime::Runtime, loader: &Loader, app: &mut App, effects: Vec<Effect>) {
    let mut queue = effects;
    while let Some(effect) = queue.pop() {
        if effect.is_read() {
            let answer = rt.block_on(loader.load(effect));
            queue.extend(app.update(answer));
        }
    }
}

#[test]
fn live_runs_drawn_together_are_followed_by_reading_only_what_they_added() {
    use roll::store::liveness::ProcessIdentity;
    use roll::store::{EventKind, EventRecord, NewRun, OpenMode, Store};
    use roll::tui::replay::Timeline;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("roll.db");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt.block_on(Store::open(&path, OpenMode::Create)).unwrap();
    let me = ProcessIdentity::current(); // alive: both runs are live
    let mut ids = vec![];
    for name in ["a", "b"] {
        let new = NewRun {
            name: name.into(),
            config_json: "{}".into(),
            config_hash: "h".into(),
            git_revision: None,
            seed: 1,
            output_dir: "out".into(),
        };
        ids.push(rt.block_on(store.create_run(&new, false, &me)).unwrap());
    }
    let (writer, task) = {
        let _in_rt = rt.enter();
        store.spawn_writer()
    };
    let write = |run: RunId, steps: std::ops::RangeInclusive<u64>, keys: &[&str]| {
        for step in steps {
            let points = keys
                .iter()
                .map(|k| (k.to_string(), (step as f64).sin()))
                .collect();
            rt.block_on(writer.metrics(run, "rl", step, step as f64, points))
                .unwrap();
        }
        rt.block_on(writer.flush()).unwrap();
    };
    write(ids[0], 1..=40, &["reward/add/mean", "actor/kl"]);
    write(ids[1], 1..=25, &["reward/add/mean"]);

    let loader = Loader::new(&path);
    let mut app = App::new();
    let start = app.start();
    settle(&rt, &loader, &mut app, start);
    assert!(app.runs.rows.iter().all(|r| r.live), "{:?}", app.runs.rows);
    // Mark both and compare: both are drawn, both polled while they write.
    for k in [ch(' '), ch('j'), ch(' '), ch('c')] {
        let effects = app.update(k);
        settle(&rt, &loader, &mut app, effects);
    }
    let parts = app.dashboard.as_ref().unwrap().parts.clone();
    assert_eq!(parts.len(), 2);
    assert!(parts.iter().all(|p| p.live && p.loaded && p.mark.is_some()));

    write(
        ids[0],
        41..=70,
        &["reward/add/mean", "actor/kl", "actor/entropy"],
    );
    write(ids[1], 26..=30, &["reward/add/mean"]);
    let polls: Vec<Effect> = (0..4).flat_map(|_| app.update(Msg::Tick)).collect();
    let series_polls: Vec<_> = polls
        .iter()
        .filter_map(|e| match e {
            Effect::LoadSeries { run, since } => Some((*run, since.is_some())),
            _ => None,
        })
        .collect();
    assert_eq!(series_polls.len(), 2, "{polls:?}");
    assert!(series_polls.iter().all(|(_, incremental)| *incremental));
    settle(&rt, &loader, &mut app, polls);

    // What was followed piece by piece is what a whole read gives.
    let d = app.dashboard.as_ref().unwrap();
    let mut at = 0;
    for part in &d.parts {
        let whole = rt.block_on(store.load_series(part.run, None)).unwrap();
        assert_eq!(d.series[at..at + part.len], whole[..], "run {:?}", part.run);
        at += part.len;
    }
    let open = app.open.as_ref().unwrap();
    assert_eq!(
        app.timeline,
        Timeline::from_series(d.primary_series(), open.start_ms)
    );
    assert!(screen(&app, 100, 30).contains("entropy"));

    // The workers and events views read the run's events, then only the new ones.
    let open = app.open.clone().unwrap();
    let say = |text: &str| {
        let e = EventRecord::message(EventKind::Info, text);
        writer.event_blocking(Some(open.id), e).unwrap();
        writer.flush_blocking().unwrap();
    };
    say("first");
    let effects = app.update(ch('5'));
    assert_eq!(
        effects,
        [Effect::LoadEvents {
            run: open.id,
            after: None
        }]
    );
    settle(&rt, &loader, &mut app, effects);
    say("second");
    say("third");
    let polls: Vec<Effect> = (0..4).flat_map(|_| app.update(Msg::Tick)).collect();
    assert!(
        polls
            .iter()
            .any(|e| matches!(e, Effect::LoadEvents { after: Some(_), .. })),
        "{polls:?}"
    );
    settle(&rt, &loader, &mut app, polls);
    let stored = rt.block_on(store.events(open.id)).unwrap();
    assert_eq!(*app.run_events, stored);
    let shown = app.events.as_ref().unwrap().events();
    assert_eq!(shown.len(), stored.len());
    assert!(std::sync::Arc::ptr_eq(
        &app.run_events,
        &app.workers.as_ref().unwrap().events
    ));
    assert!(screen(&app, 100, 30).contains("third"));
    drop(writer);
    rt.block_on(task).unwrap();
    rt.block_on(loader.close());
}

#[test]
fn the_dashboard_at_80x24_names_every_series_with_its_value() {
    let app = quickstart_dashboard();
    let shown = screen(&app, 80, 24);
    // In each panel's title, so no legend box is hidden for want of room or covers a curve.
    for entry in [
        "● add 0.950",
        "● rev 0.499",
        "● actor/pg_loss -0.092",
        "● time/step 0.060",
    ] {
        assert!(shown.contains(entry), "{entry}:\n{shown}");
    }
    insta::assert_snapshot!("dashboard_80x24", shown);
}

#[test]
fn hiding_a_series_gives_the_others_the_whole_panel() {
    let mut app = quickstart_dashboard();
    let before = screen(&app, 80, 24);
    // The reward panel spans add's values (up to 0.950), rounded up to 1.
    assert!(before.contains("│  1│"), "{before}");
    app.update(ch('s')); // rev
    app.update(ch('s')); // round to add
    app.update(ch('x'));
    let shown = screen(&app, 80, 24);
    // add stays in the title, marked hidden; rev alone sets the y range: its values run from
    // 0.5 - 0.5·e^(-1/10) = 0.048 to 0.499 (0.5 - 0.5·e^-6): a quarter of that span is 0.113,
    // rounded up to a step of 0.2, so 0 to 0.6 in three steps.
    assert!(shown.contains("○ add 0.950") && shown.contains("● rev 0.499"));
    assert!(!shown.contains("│  1│"), "{shown}");
    assert!(
        shown.contains("│0.6│") && shown.contains("│0.3│"),
        "{shown}"
    );
    let d = app.dashboard.as_ref().unwrap();
    assert!(d.is_hidden(0) && !d.is_hidden(1));
    insta::assert_snapshot!("dashboard_hidden_series_80x24", shown);
    // `a` shows it again: the screen is as it was.
    app.update(ch('a'));
    assert_eq!(screen(&app, 80, 24), before);
}

/// At 100x30 a dozen panels would be boxes of one braille row each: they are paged instead,
/// the page holding the focused panel, and a line says which are shown.
#[test]
fn panels_too_short_to_read_are_paged_with_the_focus() {
    let mut app = loaded_app();
    app.update(ch('G'));
    app.update(key(KeyCode::Enter));
    let mut all = dashboard_series();
    all.extend([
        series("actor/grad_norm", |s| 1.0 / (1.0 + s)),
        series("actor/kl", |s| s / 1000.0),
        series("actor/clip_frac_low", |s| (s / 9.0).sin().abs() / 10.0),
        series("critic/value_loss", |s| 1.0 / (1.0 + s)),
        series("system/tokens_per_s", |s| 5000.0 + s),
        series("async/staleness_mean", |s| s % 3.0),
        series("reward/add/accuracy", |s| 1.0 - (-s / 30.0).exp()),
    ]);
    app.update(Msg::SeriesLoaded {
        run: RunId(1),
        since: None,
        result: Ok(SeriesRead::whole(all)),
    });
    let panels = app.dashboard.as_ref().unwrap().panels().len();
    assert!(panels > 8, "{panels}");
    let first = screen(&app, 100, 30);
    assert!(
        first.contains(&format!("panels 1–8 of {panels} · j/k move")),
        "{first}"
    );
    // Down to the last panel: the page with it.
    for _ in 0..panels {
        app.update(ch('j'));
    }
    let last = screen(&app, 100, 30);
    assert!(
        last.contains(&format!("panels 9–{panels} of {panels}")),
        "{last}"
    );
    // Tall enough for all of them at once: no pages.
    assert!(!screen(&app, 100, 80).contains("panels 1–"));
}
