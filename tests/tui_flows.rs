//! The workbench's flows as state tests (keys and answers in, state and effects out): starting a
//! run from the form, stopping, pausing and resuming runs, quitting while a run started here is
//! live, comparing runs, the palette, mouse clicks, replay across the views; snapshots of the
//! modal screens; and replay of a real stored run against what `roll-tui metrics` prints.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::path::PathBuf;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use roll::metrics::Series;
use roll::store::liveness::ProcessIdentity;
use roll::store::series_since::SeriesRead;
use roll::store::{RunId, RunInfo, RunStatus};
use roll::tui::app::{App, Effect, Msg, View};
use roll::tui::commands::{RunSignal, Started};
use roll::tui::control::Confirm;
use roll::tui::loader::Loader;
use roll::tui::runs::RunRow;
use roll::tui::samples::SampleSteps;
use roll::tui::ui::render;

/// The clock of every snapshot: 2026-01-01T00:00:00Z.
const NOW: i64 = 1_767_225_600_000;

fn key(code: KeyCode) -> Msg {
    Msg::Key(KeyEvent::new(code, KeyModifiers::NONE))
}

fn ch(c: char) -> Msg {
    key(KeyCode::Char(c))
}

fn row(id: i64, name: &str, status: RunStatus, live: bool, pid: Option<u32>) -> RunRow {
    let json = serde_json::json!({
        "id": id, "name": name, "status": status.as_str(),
        "created_at": NOW - id * 60_000, "updated_at": NOW, "heartbeat_at": NOW,
        "config_hash": "h", "git_revision": null, "seed": 1, "output_dir": "out", "notes": "",
        "tags": [], "last_stage": "rl", "last_step": 5, "error": null, "host": null, "pid": pid,
    });
    let info: RunInfo = serde_json::from_value(json).unwrap();
    RunRow {
        info,
        live,
        reward: None,
        accuracy: None,
        sft_loss: None,
        process: pid.map(proc),
        paused: false,
        stage_steps: None,
        step_seconds: None,
    }
}

/// A process as the run list reports it (no start time: never refused as "reused").
fn proc(pid: u32) -> ProcessIdentity {
    ProcessIdentity {
        host: "test-host".into(),
        pid,
        token: None,
    }
}

fn started_msg(started: Started) -> Msg {
    Msg::Started {
        run: started.run.clone(),
        result: Ok(started),
    }
}

fn screen(app: &App, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|f| render(f, app, NOW)).unwrap();
    terminal.backend().to_string()
}

fn app_with(rows: Vec<RunRow>) -> App {
    let mut app = App::new();
    app.update(Msg::Resize {
        width: 100,
        height: 30,
    });
    app.update(Msg::RunsLoaded(Ok(rows)));
    app
}

fn series(stage: &str, key: &str, steps: std::ops::RangeInclusive<u64>) -> Series {
    let steps: Vec<u64> = steps.collect();
    Series {
        stage: stage.into(),
        key: key.into(),
        wall_time: steps.iter().map(|&s| s as f64).collect(),
        values: steps.iter().map(|&s| s as f64 / 10.0).collect(),
        steps,
    }
}

#[test]
fn a_run_started_from_the_form_opens_when_it_shows_up_and_quitting_asks_about_it() {
    // The repository's own quickstart, by the relative path the form finds it at.
    let config = PathBuf::from("experiments/quickstart.yaml");
    let mut app = app_with(vec![row(1, "quickstart", RunStatus::Finished, false, None)]);
    assert_eq!(app.update(ch('n')), vec![Effect::FindConfigs]);
    app.update(Msg::ConfigsFound(vec![config.clone()]));
    // "quickstart" is taken: the form proposes a free name.
    assert_eq!(app.form.as_ref().unwrap().overrides, "name=quickstart-2");
    insta::assert_snapshot!("new_run_form", screen(&app, 100, 30));
    for c in " seed=4".chars() {
        app.update(ch(c));
    }
    let effects = app.update(key(KeyCode::Enter));
    assert_eq!(
        effects,
        vec![Effect::Launch {
            config,
            overrides: vec!["name=quickstart-2".into(), "seed=4".into()],
            name: "quickstart-2".into(),
        }]
    );
    assert!(app.form.is_none());
    let started = Started {
        process: proc(4242),
        run: "quickstart-2".into(),
        log: "roll-logs/tiny.log".into(),
        what: "run experiments/quickstart.yaml name=quickstart-2 seed=4 --quiet".into(),
    };
    app.update(started_msg(started.clone()));
    // Until it shows up, the list is polled.
    let polls: Vec<Effect> = (0..4).flat_map(|_| app.update(Msg::Tick)).collect();
    assert_eq!(polls, vec![Effect::LoadRuns]);
    let effects = app.update(Msg::RunsLoaded(Ok(vec![
        row(1, "quickstart", RunStatus::Finished, false, None),
        row(2, "quickstart-2", RunStatus::Running, true, Some(4242)),
    ])));
    assert_eq!(effects, vec![Effect::load_whole(RunId(2))]);
    assert_eq!(
        (app.view, app.open.as_ref().unwrap().live),
        (View::Dashboard, true)
    );
    // Quitting asks; Esc stays, s stops the run and quits.
    app.update(ch('q'));
    assert!(matches!(app.confirm, Some(Confirm::Quit { .. })) && !app.quit);
    insta::assert_snapshot!("quit_confirm", screen(&app, 100, 30));
    app.update(key(KeyCode::Esc));
    assert!(app.confirm.is_none() && !app.quit);
    app.update(ch('q'));
    assert_eq!(
        app.update(ch('s')),
        vec![Effect::Signal {
            process: proc(4242),
            signal: RunSignal::Stop
        }]
    );
    assert!(app.quit);
    // Or c: the run keeps going headless, nothing is signalled.
    let mut app2 = app_with(vec![]);
    app2.update(started_msg(started));
    app2.update(ch('q'));
    assert!(app2.update(ch('c')).is_empty());
    assert!(app2.quit);
}

#[test]
fn a_failed_start_says_why_with_the_log_tail() {
    let mut app = app_with(vec![]);
    let started = Started {
        process: proc(7),
        run: "x".into(),
        log: "roll-logs/x.log".into(),
        what: "run x.yaml --quiet".into(),
    };
    app.update(started_msg(started));
    app.update(Msg::Exited {
        pid: 7,
        code: Some(1),
        tail: "error: data file 'missing.jsonl' not found".into(),
    });
    let status = app.status.clone().unwrap();
    assert!(
        status.contains("exited with 1")
            && status.contains("missing.jsonl")
            && status.contains("x.log"),
        "{status}"
    );
    assert!(app.started.is_empty());
    // With nothing live started here, q quits at once.
    app.update(ch('q'));
    assert!(app.quit);
}

#[test]
fn stop_pause_and_resume_act_on_the_selected_run_and_refuse_clearly() {
    let mut app = app_with(vec![
        row(1, "live", RunStatus::Running, true, Some(99)),
        row(2, "elsewhere", RunStatus::Running, true, None),
        row(3, "broken", RunStatus::Interrupted, false, None),
        row(4, "done", RunStatus::Finished, false, None),
    ]);
    assert_eq!(app.runs.selected, Some(RunId(1)));
    // X asks first; any key but y keeps it running.
    assert!(app.update(ch('X')).is_empty());
    assert_eq!(
        app.confirm,
        Some(Confirm::Stop {
            process: proc(99),
            name: "live".into()
        })
    );
    assert!(app.update(ch('n')).is_empty());
    app.update(ch('X'));
    assert_eq!(
        app.update(ch('y')),
        vec![Effect::Signal {
            process: proc(99),
            signal: RunSignal::Stop
        }]
    );
    // A second stop is not sent: a second SIGINT would end the run without its checkpoint.
    assert!(app.update(ch('X')).is_empty());
    assert!(app.confirm.is_none());
    assert!(app.notice.as_deref().unwrap().contains("already stopping"));
    assert_eq!(
        app.update(ch('p')),
        vec![
            Effect::Signal {
                process: proc(99),
                signal: RunSignal::Pause
            },
            Effect::LoadRuns
        ]
    );
    // Shown paused at once, so p again continues (before the next read says so).
    assert_eq!(
        app.update(ch('p'))[0],
        Effect::Signal {
            process: proc(99),
            signal: RunSignal::Continue
        }
    );
    app.update(ch('p'));
    // Quitting lets a run paused from here go: it is never left stopped.
    let mut quitting = app_with(vec![row(1, "live", RunStatus::Running, true, Some(99))]);
    quitting.update(ch('p'));
    assert_eq!(
        quitting.update(ch('q')),
        vec![Effect::Signal {
            process: proc(99),
            signal: RunSignal::Continue
        }]
    );
    assert!(quitting.quit);
    // A paused run continues.
    let mut paused = row(1, "live", RunStatus::Running, true, Some(99));
    paused.paused = true;
    app.update(Msg::RunsLoaded(Ok(vec![paused])));
    assert!(screen(&app, 100, 30).contains("paused"));
    assert_eq!(
        app.update(ch('p'))[0],
        Effect::Signal {
            process: proc(99),
            signal: RunSignal::Continue
        }
    );
    let mut app = app_with(vec![
        row(2, "elsewhere", RunStatus::Running, true, None),
        row(3, "broken", RunStatus::Interrupted, false, None),
        row(4, "done", RunStatus::Finished, false, None),
    ]);
    // A live run of another machine cannot be signalled from here.
    assert!(app.update(ch('X')).is_empty());
    assert!(
        app.status
            .as_deref()
            .unwrap()
            .contains("not on this machine")
    );
    app.update(ch('j'));
    // Resuming starts training again: asked first; any key but y leaves it.
    assert!(app.update(ch('r')).is_empty());
    let asked = screen(&app, 100, 30);
    assert!(asked.contains("Resume 'broken'"), "{asked}");
    assert!(app.update(ch('n')).is_empty());
    assert!(app.confirm.is_none());
    app.update(ch('r'));
    assert_eq!(
        app.update(ch('y')),
        vec![Effect::Resume {
            run: "broken".into()
        }]
    );
    app.update(ch('j'));
    assert!(app.update(ch('r')).is_empty());
    assert!(app.status.as_deref().unwrap().contains("finished"));
    assert!(app.update(ch('p')).is_empty());
    assert!(app.status.as_deref().unwrap().contains("not running"));
}

#[test]
fn marked_runs_open_overlaid_and_the_palette_and_clicks_drive_the_same_actions() {
    let mut app = app_with(vec![
        row(1, "a", RunStatus::Finished, false, None),
        row(2, "b", RunStatus::Finished, false, None),
    ]);
    app.update(ch('c'));
    assert!(app.status.as_deref().unwrap().contains("mark two"));
    app.update(ch(' '));
    app.update(ch('j'));
    app.update(ch(' '));
    let effects = app.update(ch('c'));
    assert_eq!(
        effects,
        vec![Effect::load_whole(RunId(2)), Effect::load_whole(RunId(1))]
    );
    for (id, n) in [(2, 10), (1, 20)] {
        app.update(Msg::SeriesLoaded {
            run: RunId(id),
            since: None,
            result: Ok(SeriesRead::whole(vec![series(
                "rl",
                "reward/add/mean",
                1..=n,
            )])),
        });
    }
    let d = app.dashboard.as_ref().unwrap();
    assert!(d.loaded);
    assert_eq!(d.panels()[0].lines, [0, 1]);
    let text = screen(&app, 100, 30);
    assert!(
        text.contains("b vs a") && d.part_of(1).name == "a",
        "{text}"
    );
    // The palette finds "expand" and runs it.
    app.update(ch(':'));
    for c in "expand".chars() {
        app.update(ch(c));
    }
    insta::assert_snapshot!("palette", screen(&app, 100, 30));
    app.update(key(KeyCode::Enter));
    assert!(app.palette.is_none() && app.dashboard.as_ref().unwrap().expanded);
    // A click on the first tab goes back to the runs; a click on a row selects, a second opens.
    app.update(Msg::Click { column: 2, row: 0 });
    assert_eq!(app.view, View::Runs);
    app.update(Msg::Click { column: 10, row: 3 });
    assert_eq!(app.runs.selected, Some(RunId(1)));
    assert_eq!(
        app.update(Msg::Click { column: 10, row: 3 }),
        vec![Effect::load_whole(RunId(1))]
    );
    assert_eq!(app.view, View::Dashboard);
}

#[test]
fn replay_moves_every_view_to_the_selected_step_and_plays() {
    let mut app = app_with(vec![row(1, "r", RunStatus::Finished, false, None)]);
    app.update(key(KeyCode::Enter));
    app.update(Msg::SeriesLoaded {
        run: RunId(1),
        since: None,
        result: Ok(SeriesRead::whole(vec![
            series("sft", "sft/loss", 1..=3),
            // RL steps come after SFT in wall time.
            Series {
                wall_time: (1..=5).map(|s| 10.0 + s as f64).collect(),
                ..series("rl", "reward/add/mean", 1..=5)
            },
        ])),
    });
    assert_eq!(app.timeline.len(), 8);
    app.update(ch('r'));
    assert_eq!(app.cursor().unwrap().step, 5);
    app.update(ch(','));
    app.update(ch(','));
    let d = app.dashboard.as_ref().unwrap();
    assert_eq!(
        d.as_of.as_ref().map(|t| (&*t.stage, t.step)),
        Some(("rl", 3))
    );
    assert_eq!(d.value_now(1), Some((3, 0.3)));
    assert_eq!(
        d.value_now(0),
        Some((3, 0.3)),
        "SFT ended before: its last point"
    );
    insta::assert_snapshot!("dashboard_replay", screen(&app, 100, 30));
    // The samples view opens at the replayed step.
    let effects = app.update(key(KeyCode::Enter));
    assert_eq!(effects, vec![Effect::LoadSampleSteps(RunId(1))]);
    let effects = app.update(Msg::SampleStepsLoaded {
        run: RunId(1),
        result: Ok(SampleSteps {
            stage: Some("rl".into()),
            steps: vec![1, 2, 3, 4, 5],
        }),
    });
    assert_eq!(
        effects,
        vec![Effect::LoadSamples {
            run: RunId(1),
            stage: "rl".into(),
            step: 3
        }]
    );
    // Stepping back into SFT leaves the samples where they were (SFT has none).
    app.update(ch('<'));
    assert_eq!(app.cursor().unwrap().step, 1);
    // Space plays: at 1 step/s four ticks move one step.
    app.update(ch(' '));
    let mut moved = vec![];
    for _ in 0..4 {
        moved.extend(app.update(Msg::Tick));
    }
    assert_eq!(app.replay.as_ref().unwrap().index, 1);
    assert!(
        moved
            .iter()
            .all(|e| *e == Effect::LoadRuns || matches!(e, Effect::LoadSamples { .. }))
    );
    // r leaves replay: the dashboard draws everything again.
    app.update(ch('r'));
    assert!(app.replay.is_none() && app.dashboard.as_ref().unwrap().as_of.is_none());
}

/// Carries out `effects` with the real loader, and the effects their answers cause, until none
/// is left.
fn settle(rt: &tokio::runtime::Runtime, loader: &Loader, app: &mut App, effects: Vec<Effect>) {
    let mut queue = effects;
    while let Some(e) = queue.pop() {
        let msg = rt.block_on(loader.load(e));
        queue.extend(app.update(msg));
    }
}

/// `roll-tui metrics RUN --csv` as (stage, key, step) → value.
fn metrics_csv(store: &std::path::Path) -> Vec<(String, String, u64, f64)> {
    let out = common::ok(common::roll(store, &["metrics", "tiny", "--csv"]));
    out.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (
                f[0].into(),
                f[1].into(),
                f[2].parse().unwrap(),
                f[4].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn replay_of_a_stored_run_shows_the_values_metrics_prints_at_that_step() {
    let dir = tempfile::tempdir().unwrap();
    let rl = "name: tiny\nseed: 3\nsft: { steps: 2, batch_size: 8, optimizer: { lr: 0.01 } }\nrl:\n  steps: 5\n  prompts_per_step: 4\n  group_size: 4\n  sampling: { temperature: 1.0, max_new_tokens: 6 }\n  optimizer: { lr: 0.001 }\n";
    let store = common::run_quiet(dir.path(), "tiny", rl, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let loader = Loader::new(&store);
    let mut app = App::new();
    app.update(Msg::Resize {
        width: 400,
        height: 60,
    });
    let mut pending = vec![Effect::LoadRuns];
    let run = |app: &mut App, effects: Vec<Effect>| settle(&rt, &loader, app, effects);
    run(&mut app, std::mem::take(&mut pending));
    let effects = app.update(key(KeyCode::Enter));
    run(&mut app, effects);
    let effects = app.update(ch('r'));
    run(&mut app, effects);
    // Back from step 5 to RL step 3.
    for _ in 0..2 {
        let effects = app.update(ch(','));
        run(&mut app, effects);
    }
    assert_eq!(app.cursor().unwrap().step, 3);
    let csv = metrics_csv(&store);
    let mut checked = 0;
    let panels = app.dashboard.as_ref().unwrap().panels().len();
    for _ in 0..panels {
        let text = screen(&app, 400, 60);
        let readout = text
            .lines()
            .find(|l| l.contains(" rl step 3 "))
            .unwrap()
            .to_string();
        let d = app.dashboard.as_ref().unwrap();
        for &i in &d.panels()[d.focus].lines {
            let s = &d.series[i];
            let Some(&(_, _, _, v)) = csv
                .iter()
                .find(|(st, k, step, _)| *st == s.stage && *k == s.key && *step == 3)
            else {
                continue;
            };
            if s.stage != "rl" || !v.is_finite() {
                continue;
            }
            let shown = format!(" {} {v:.6}", s.key);
            assert!(readout.contains(&shown), "{shown} not in {readout}");
            checked += 1;
        }
        app.update(key(KeyCode::Tab));
    }
    assert!(checked >= 10, "only {checked} values compared");
    // The samples view shows that step too.
    let effects = app.update(ch('3'));
    run(&mut app, effects);
    assert_eq!(app.samples.as_ref().unwrap().step(), Some(3));
    assert!(screen(&app, 400, 60).contains("step 3 of 5"));
}

#[test]
fn quitting_while_a_start_is_on_its_way_waits_for_it_and_a_failed_start_spares_the_others() {
    let mut app = app_with(vec![]);
    let form_launch = |app: &mut App, name: &str| {
        app.update(Msg::ConfigsFound(vec![
            "experiments/quickstart.yaml".into(),
        ]));
        let form = app.form.as_mut().unwrap();
        form.overrides = format!("name={name}");
        app.update(key(KeyCode::Enter))
    };
    assert!(matches!(
        form_launch(&mut app, "one").as_slice(),
        [Effect::Launch { name, .. }] if name == "one"
    ));
    form_launch(&mut app, "two");
    assert_eq!(app.pending_open, ["one", "two"]);
    // q before either process is reported: nothing is lost, the question comes once they are.
    assert!(app.update(ch('q')).is_empty());
    assert!(!app.quit && app.confirm.is_none());
    assert!(app.notice.as_deref().unwrap().contains("starting"));
    // The first cannot start: only its own auto-open is dropped.
    app.update(Msg::Started {
        run: "one".into(),
        result: Err("starting 'roll-tui': no such file".into()),
    });
    assert_eq!(app.pending_open, ["two"]);
    assert!(!app.quit && app.confirm.is_none());
    let two = Started {
        process: proc(31),
        run: "two".into(),
        log: "roll-logs/two.log".into(),
        what: "run experiments/quickstart.yaml name=two --quiet".into(),
    };
    app.update(started_msg(two));
    assert!(matches!(app.confirm, Some(Confirm::Quit { ref runs }) if runs.len() == 1));
    app.update(key(KeyCode::Esc));
    // The second still opens when the store lists it live.
    let effects = app.update(Msg::RunsLoaded(Ok(vec![row(
        5,
        "two",
        RunStatus::Running,
        true,
        Some(31),
    )])));
    assert_eq!(effects, vec![Effect::load_whole(RunId(5))]);
    assert_eq!(app.open.as_ref().unwrap().name, "two");
    assert!(app.pending_open.is_empty());
}

#[test]
fn events_read_after_a_mark_are_merged_in_time_order_and_a_stale_answer_is_asked_again() {
    use roll::store::reads::{EventsRead, StoredEvent};
    use roll::store::{EventKind, EventRecord};
    let ev = |at: i64, text: &str| StoredEvent {
        at,
        event: EventRecord::message(EventKind::Info, text),
    };
    let mut app = app_with(vec![row(1, "live", RunStatus::Running, true, Some(9))]);
    app.update(key(KeyCode::Enter));
    assert_eq!(
        app.update(ch('5')),
        [Effect::LoadEvents {
            run: RunId(1),
            after: None
        }]
    );
    let info = Box::new(app.runs.rows[0].info.clone());
    let answer = |after: Option<i64>, events: Vec<StoredEvent>, last: i64| Msg::EventsLoaded {
        run: RunId(1),
        after,
        result: Ok((
            info.clone(),
            EventsRead {
                events,
                last: Some(last),
            },
        )),
    };
    app.update(answer(None, vec![ev(10, "a"), ev(20, "b"), ev(30, "c")], 3));
    assert_eq!(app.events_mark, Some(3));
    // One stamped earlier than the last (another process's clock) goes in its place.
    app.update(answer(Some(3), vec![ev(15, "d"), ev(40, "e")], 5));
    let order: Vec<&str> = app
        .run_events
        .iter()
        .map(|e| e.event.message.as_str())
        .collect();
    assert_eq!(order, ["a", "d", "b", "c", "e"]);
    assert_eq!(app.events.as_ref().unwrap().events().len(), 5);
    // Moved off the tail, the selection stays on its event while events arrive.
    app.update(key(KeyCode::Up));
    app.update(key(KeyCode::Up));
    let picked = |app: &App| {
        let view = app.events.as_ref().unwrap();
        view.selected_event(None).map(|e| e.event.message.clone())
    };
    assert_eq!(picked(&app).as_deref(), Some("b"));
    app.update(answer(Some(5), vec![ev(45, "f")], 6));
    assert_eq!(picked(&app).as_deref(), Some("b"));
    assert_eq!(app.events_mark, Some(6));
    // An answer to a read from another mark is not merged: the read is asked again.
    assert_eq!(
        app.update(answer(Some(2), vec![ev(50, "x")], 7)),
        [Effect::LoadEvents {
            run: RunId(1),
            after: Some(6)
        }]
    );
    assert_eq!(app.run_events.len(), 6);
    // The text filter sees the merged events.
    app.update(ch('/'));
    app.update(ch('d'));
    app.update(key(KeyCode::Enter));
    let shown = app.events.as_ref().unwrap();
    assert_eq!(shown.visible(None).len(), 1);
}

#[test]
fn news_for_series_a_reopened_dashboard_no_longer_holds_are_not_added_but_asked_again() {
    use roll::store::series_since::{SeriesMark, SeriesUpdate};
    let mut app = app_with(vec![row(1, "live", RunStatus::Running, true, Some(9))]);
    assert_eq!(
        app.update(key(KeyCode::Enter)),
        [Effect::load_whole(RunId(1))]
    );
    // The answer to a poll asked before the dashboard was (re)opened: from a mark it is not at.
    let stale = Msg::SeriesLoaded {
        run: RunId(1),
        since: Some(SeriesMark::default()),
        result: Ok(SeriesRead {
            update: SeriesUpdate::Appended(vec![series("rl", "actor/kl", 5..=6)]),
            mark: SeriesMark::default(),
        }),
    };
    assert_eq!(app.update(stale), [Effect::load_whole(RunId(1))]);
    let d = app.dashboard.as_ref().unwrap();
    assert!(d.series.is_empty() && !d.loaded);
    // A read held while another was under way is asked again from where the dashboard is.
    app.update(Msg::SeriesLoaded {
        run: RunId(1),
        since: None,
        result: Ok(SeriesRead::whole(vec![series("rl", "actor/kl", 1..=6)])),
    });
    assert_eq!(
        app.reread(&Effect::load_whole(RunId(1))),
        Some(Effect::LoadSeries {
            run: RunId(1),
            since: Some(SeriesMark::default())
        })
    );
    assert_eq!(app.reread(&Effect::load_whole(RunId(2))), None);
    assert_eq!(app.dashboard.as_ref().unwrap().series[0].len(), 6);
}

#[test]
fn the_episodes_view_shows_a_stored_agentic_run_step_by_step_and_follows_replay() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("lake.yaml");
    std::fs::write(
        &cfg,
        format!(
            "name: lake\nseed: 3\noutput_dir: {}\n\
             model: {{ init: {{ arch: qwen2, hidden: 16, layers: 1, heads: 2, kv_heads: 1, intermediate: 32, chars: \"SFGPWXLeftRighDowUp\\n\", max_positions: 128 }} }}\n\
             rl:\n  steps: 3\n  prompts_per_step: 2\n  group_size: 2\n  sampling: {{ max_new_tokens: 4 }}\n\
             \x20 env: {{ name: frozen_lake, tag: tiny, params: {{ map: SFG, legend: false }}, max_turns: 3, action_pattern: '(\\w+)' }}\n",
            dir.path().join("out").display()
        ),
    )
    .unwrap();
    let store = dir.path().join("s.db");
    common::ok(common::roll(
        &store,
        &["run", "--quiet", cfg.to_str().unwrap()],
    ));
    let stored: Vec<serde_json::Value> = common::ok(common::roll(
        &store,
        &["trajectories", "lake", "--step", "2", "--json"],
    ))
    .lines()
    .map(|l| serde_json::from_str(l).unwrap())
    .collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let loader = Loader::new(&store);
    let mut app = App::new();
    app.update(Msg::Resize {
        width: 120,
        height: 40,
    });
    let run = |app: &mut App, effects: Vec<Effect>| settle(&rt, &loader, app, effects);
    run(&mut app, vec![Effect::LoadRuns]);
    let effects = app.update(key(KeyCode::Enter));
    run(&mut app, effects);
    let effects = app.update(ch('6'));
    run(&mut app, effects);
    assert_eq!(app.view, View::Episodes);
    let view = app.episodes.as_ref().unwrap();
    assert_eq!(view.steps(), [1, 2, 3]);
    assert_eq!(view.step(), Some(3), "the newest step first");
    assert_eq!(view.episodes().len(), 4);
    // h: step 2, as `roll-tui trajectories --step 2` prints it.
    let effects = app.update(ch('h'));
    run(&mut app, effects);
    let view = app.episodes.as_ref().unwrap();
    assert_eq!(view.step(), Some(2));
    assert_eq!(view.episodes().len(), stored.len());
    for (shown, printed) in view.episodes().iter().zip(&stored) {
        assert_eq!(shown.env_seed, printed["env_seed"].as_u64().unwrap());
        assert_eq!(
            shown.turns.len(),
            printed["turns"].as_array().unwrap().len()
        );
        assert_eq!(
            shown.turns[0].observation,
            printed["turns"][0]["observation"]
        );
    }
    let text = screen(&app, 120, 40);
    assert!(
        text.contains("training step 2 (2/3) · tiny · 4 episodes"),
        "{text}"
    );
    assert!(
        text.contains("PFG"),
        "the first observation is drawn:\n{text}"
    );
    // Replay from the newest step, one step back: the view follows the cursor to step 2, then
    // to step 1.
    let effects = app.update(ch('l'));
    run(&mut app, effects);
    let effects = app.update(ch('r'));
    run(&mut app, effects);
    for want in [2, 1] {
        let effects = app.update(ch(','));
        run(&mut app, effects);
        assert_eq!(app.episodes.as_ref().unwrap().step(), Some(want));
        assert_eq!(
            app.episodes.as_ref().unwrap().episodes()[0].step,
            want as usize
        );
    }
}

fn sample_record(
    domain: &str,
    prompt: &str,
    response: &str,
    reward: f32,
) -> roll::metrics::SampleRecord {
    roll::metrics::SampleRecord {
        stage: "rl".into(),
        step: 1,
        domain: domain.into(),
        prompt: prompt.into(),
        response: response.into(),
        ground_truth: "5".into(),
        reward,
        correct: reward > 0.5,
        breakdown: Default::default(),
        advantage: 0.0,
        prompt_tokens: 3,
        response_tokens: 3,
        finish_reason: "stop".into(),
        policy_version: 0,
        tokens: None,
    }
}

#[test]
fn esc_closes_the_innermost_thing_first_in_every_view() {
    let mut app = app_with(vec![row(1, "r", RunStatus::Finished, false, None)]);
    app.update(key(KeyCode::Enter));
    assert_eq!(app.view, View::Dashboard);
    // Dashboard: a committed filter, then the view.
    app.update(ch('/'));
    app.update(ch('k'));
    app.update(key(KeyCode::Enter));
    app.update(key(KeyCode::Esc));
    assert_eq!(
        app.view,
        View::Dashboard,
        "Esc clears the panel filter first"
    );
    app.update(key(KeyCode::Esc));
    assert_eq!(app.view, View::Runs);

    // Samples: a whole response, then the committed search, then the view.
    app.update(key(KeyCode::Enter));
    app.update(ch('3'));
    assert_eq!(app.view, View::Samples);
    app.update(Msg::SampleStepsLoaded {
        run: RunId(1),
        result: Ok(SampleSteps {
            stage: Some("rl".into()),
            steps: vec![1],
        }),
    });
    app.update(Msg::SamplesLoaded {
        run: RunId(1),
        stage: "rl".into(),
        step: 1,
        result: Ok(vec![
            sample_record("add", "2+3=", "5", 1.0),
            sample_record("add", "2+3=", "6", 0.0),
        ]),
    });
    app.update(ch('/'));
    app.update(ch('5'));
    app.update(key(KeyCode::Enter));
    assert_eq!(app.samples.as_ref().unwrap().filter(), "5");
    app.update(key(KeyCode::Enter));
    assert!(app.samples.as_ref().unwrap().showing_whole());
    app.update(key(KeyCode::Esc));
    let s = app.samples.as_ref().unwrap();
    assert!(
        !s.showing_whole() && s.filter() == "5" && app.view == View::Samples,
        "whole response first"
    );
    app.update(key(KeyCode::Esc));
    assert!(
        app.samples.as_ref().unwrap().filter().is_empty() && app.view == View::Samples,
        "then the search"
    );
    app.update(key(KeyCode::Esc));
    assert_eq!(app.view, View::Dashboard, "then the view");
}

#[test]
fn runs_are_deleted_from_the_workbench_after_a_confirmation() {
    let dir = tempfile::tempdir().unwrap();
    let rl = "name: gone\nseed: 3\nrl:\n  steps: 1\n  prompts_per_step: 2\n  group_size: 2\n  sampling: { temperature: 1.0, max_new_tokens: 4 }\n";
    let store = common::run_quiet(dir.path(), "gone", rl, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let loader = Loader::new(&store);
    let mut app = App::new();
    let run = |app: &mut App, effects: Vec<Effect>| settle(&rt, &loader, app, effects);
    run(&mut app, vec![Effect::LoadRuns]);
    assert_eq!(app.runs.rows.len(), 1);
    // Any key but y keeps it.
    assert!(app.update(ch('D')).is_empty());
    assert!(matches!(app.confirm, Some(Confirm::Delete { .. })));
    assert!(app.update(ch('n')).is_empty());
    assert!(app.confirm.is_none());
    // y deletes it, and the list is read again without it.
    app.update(ch('D'));
    let effects = app.update(ch('y'));
    assert!(matches!(&effects[..], [Effect::DeleteRun { name, .. }] if name == "gone"));
    run(&mut app, effects);
    assert!(app.runs.rows.is_empty());
    assert!(
        app.notice
            .as_deref()
            .unwrap()
            .contains("deleted run 'gone'")
    );
    let listed = common::ok(common::roll(&store, &["runs", "--json"]));
    assert_eq!(listed.trim(), "[]");

    // A live run is not deleted: the list says why.
    let mut app = app_with(vec![row(1, "live", RunStatus::Running, true, Some(42))]);
    assert!(app.update(ch('D')).is_empty());
    assert!(app.confirm.is_none());
    assert!(
        app.status
            .as_deref()
            .unwrap()
            .contains("cannot delete 'live': it is running")
    );
}

/// The stop question is whole however long the run's name: its box grows with the wrapped text,
/// and the keys' line is never cut off.
#[test]
fn the_stop_question_is_whole_with_a_long_name() {
    let long = "a-run-with-a-name-long-enough-to-wrap-the-question-line";
    let mut app = app_with(vec![row(1, long, RunStatus::Running, true, Some(12182))]);
    app.update(ch('X'));
    let shown = screen(&app, 100, 30);
    assert!(
        shown.contains("It finishes its step and writes a"),
        "{shown}"
    );
    assert!(shown.contains("resumes it later"), "{shown}");
    assert!(
        shown.contains("y stop · any other key keep it running"),
        "{shown}"
    );
}
