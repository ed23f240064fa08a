//! Workbench benchmarks (`cargo bench --bench tui`), printed as figures:
//! - frame: time to draw the run dashboard with 8 series of 1,000,000 points each into a 200×50
//!   `TestBackend` (every frame decimates the visible window again: no cache), median of 15, for the
//!   whole range, a 1/64 zoom and the panel expanded;
//! - open: time from an empty workbench to the Runs view's rows for a store with 100 runs (each
//!   with 40 series of 50 steps), median of 5 fresh loaders;
//! - live: one poll of a live run whose 8 series hold 1,000,000 points each, taken in whole (as
//!   before polls were incremental) and as one new point per series (median of 9), with the
//!   timeline; and the store's side for 8 series of 100,000 points: reading them whole against
//!   reading only what the last step added (median of 9).

use std::time::Instant;

use ratatui::Terminal;
use ratatui::backend::TestBackend;
use roll::metrics::Series;
use roll::store::liveness::ProcessIdentity;
use roll::store::series_since::{SeriesMark, SeriesRead, SeriesUpdate};
use roll::store::{NewRun, OpenMode, RunId, Store};
use roll::tui::action::Action;
use roll::tui::app::{App, Effect, Msg, OpenRun, View};
use roll::tui::loader::Loader;
use roll::tui::ui::render;

const POINTS: usize = 1_000_000;

fn series(key: &str, phase: f64) -> Series {
    let steps: Vec<u64> = (1..=POINTS as u64).collect();
    Series {
        stage: "rl".into(),
        key: key.into(),
        wall_time: steps.iter().map(|&s| s as f64 * 0.05).collect(),
        values: steps
            .iter()
            .map(|&s| ((s as f64) * 1e-4 + phase).sin() + ((s * 7919) % 1000) as f64 * 1e-4)
            .collect(),
        steps,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn frame_ms(app: &App, terminal: &mut Terminal<TestBackend>) -> f64 {
    let times: Vec<f64> = (0..15)
        .map(|_| {
            let t0 = Instant::now();
            terminal.draw(|f| render(f, app, 0)).expect("draw");
            t0.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    median(times)
}

/// Eight series on four panels: two reward domains, two losses, KL, entropy, two lengths.
const KEYS: [&str; 8] = [
    "reward/add/mean",
    "reward/rev/mean",
    "actor/pg_loss",
    "critic/value_loss",
    "actor/kl",
    "actor/entropy",
    "response_length/mean",
    "response_length/max",
];

fn frames() {
    let keys = KEYS;
    let mut app = App::new();
    app.update(Msg::Resize {
        width: 200,
        height: 50,
    });
    app.update(Msg::RunsLoaded(Ok(vec![])));
    let t0 = Instant::now();
    let data: Vec<Series> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| series(k, i as f64))
        .collect();
    let build = t0.elapsed().as_secs_f64();
    app.dashboard = Some(roll::tui::dashboard::Dashboard::new(
        RunId(1),
        "bench".into(),
        false,
    ));
    app.view = roll::tui::app::View::Dashboard;
    let t1 = Instant::now();
    app.update(Msg::SeriesLoaded {
        run: RunId(1),
        since: None,
        result: Ok(SeriesRead::whole(data)),
    });
    let ingest = t1.elapsed().as_secs_f64();
    let mut terminal = Terminal::new(TestBackend::new(200, 50)).expect("terminal");
    let all = frame_ms(&app, &mut terminal);
    for _ in 0..6 {
        app.act(Action::ZoomIn);
    }
    let zoomed = frame_ms(&app, &mut terminal);
    app.act(Action::ZoomReset);
    app.act(Action::Expand);
    let expanded = frame_ms(&app, &mut terminal);
    println!(
        "frame: 8 series x {POINTS} points, 200x50: whole range {all:.1} ms, zoom 1/64 {zoomed:.1} ms, \
         one panel expanded {expanded:.1} ms (median of 15; generating the series {build:.2} s, \
         taking them in with EMA {ingest:.2} s)"
    );
}

fn new_run(i: usize) -> NewRun {
    NewRun {
        name: format!("run-{i:03}"),
        config_json: "{}".into(),
        config_hash: "bench".into(),
        git_revision: None,
        seed: 0,
        output_dir: format!("runs/{i}"),
    }
}

/// The workbench's runtime: two workers, as `roll-tui` builds it.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn open_store() {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("runs.db");
    let store = rt
        .block_on(Store::open(&path, OpenMode::Create))
        .expect("open store");
    let (writer, task) = {
        let _guard = rt.enter();
        store.spawn_writer()
    };
    for i in 0..100 {
        let run = rt
            .block_on(store.create_run(&new_run(i), false, &ProcessIdentity::current()))
            .expect("create run");
        for step in 1..=50u64 {
            let points = (0..40)
                .map(|k| (format!("reward/d{k}/mean"), (step as f64).ln() * k as f64))
                .collect();
            writer
                .metrics_blocking(run, "rl", step, step as f64, points)
                .expect("metrics");
        }
    }
    writer.flush_blocking().expect("flush");
    drop(writer);
    rt.block_on(task).expect("writer");
    rt.block_on(store.close());
    let times: Vec<f64> = (0..5)
        .map(|_| {
            let loader = Loader::new(&path);
            let t0 = Instant::now();
            let msg = rt.block_on(loader.load(Effect::LoadRuns));
            let secs = t0.elapsed().as_secs_f64();
            let Msg::RunsLoaded(Ok(rows)) = msg else {
                panic!("loading runs failed: {msg:?}")
            };
            assert_eq!(rows.len(), 100);
            rt.block_on(loader.close());
            secs * 1e3
        })
        .collect();
    println!(
        "open: a store of 100 runs x 40 series x 50 steps to the Runs view's rows: {:.1} ms \
         (median of 5 fresh loaders)",
        median(times)
    );
}

fn ms_since(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

/// The workbench's side of a live poll: the dashboard and timeline of the open run.
fn live_app() {
    let mut app = App::new();
    app.update(Msg::RunsLoaded(Ok(vec![])));
    app.open = Some(OpenRun {
        id: RunId(1),
        name: "bench".into(),
        live: true,
        start_ms: 0,
    });
    app.dashboard = Some(roll::tui::dashboard::Dashboard::new(
        RunId(1),
        "bench".into(),
        true,
    ));
    app.view = View::Dashboard;
    let data: Vec<Series> = KEYS
        .iter()
        .enumerate()
        .map(|(i, k)| series(k, i as f64))
        .collect();
    let loaded = |series: Vec<Series>, update: fn(Vec<Series>) -> SeriesUpdate| Msg::SeriesLoaded {
        run: RunId(1),
        since: Some(SeriesMark::default()),
        result: Ok(SeriesRead {
            update: update(series),
            mark: SeriesMark::default(),
        }),
    };
    let t0 = Instant::now();
    app.update(loaded(data, SeriesUpdate::Whole));
    let whole = ms_since(t0);
    let appended: Vec<f64> = (1..=9u64)
        .map(|k| {
            let step = POINTS as u64 + k;
            let tails = KEYS
                .iter()
                .map(|key| Series {
                    stage: "rl".into(),
                    key: key.to_string(),
                    steps: vec![step],
                    wall_time: vec![step as f64 * 0.05],
                    values: vec![0.5],
                })
                .collect();
            let t0 = Instant::now();
            app.update(loaded(tails, SeriesUpdate::Appended));
            ms_since(t0)
        })
        .collect();
    assert_eq!(app.timeline.len(), POINTS + 9);
    println!(
        "live (workbench): 8 series x {POINTS} points: taking a poll in whole {whole:.0} ms; \
         one new point per series {:.3} ms (median of 9; EMA, pyramids and timeline included)",
        median(appended)
    );
}

/// The store's side of a live poll.
fn live_store() {
    const STEPS: u64 = 100_000;
    let rt = runtime();
    let dir = tempfile::tempdir().expect("temp dir");
    let store = rt
        .block_on(Store::open(&dir.path().join("runs.db"), OpenMode::Create))
        .expect("open store");
    let run = rt
        .block_on(store.create_run(&new_run(0), false, &ProcessIdentity::current()))
        .expect("create run");
    let (writer, task) = {
        let _guard = rt.enter();
        store.spawn_writer()
    };
    let step_points = |step: u64| KEYS.iter().map(|k| (k.to_string(), step as f64)).collect();
    for step in 1..=STEPS {
        writer
            .metrics_blocking(run, "rl", step, step as f64, step_points(step))
            .expect("metrics");
    }
    writer.flush_blocking().expect("flush");
    let mut whole = vec![];
    let mut news = vec![];
    for k in 1..=9 {
        let t0 = Instant::now();
        let read = rt.block_on(store.series_since(run, None)).expect("whole");
        whole.push(ms_since(t0));
        writer
            .metrics_blocking(run, "rl", STEPS + k, 0.0, step_points(STEPS + k))
            .expect("metrics");
        writer.flush_blocking().expect("flush");
        let t0 = Instant::now();
        let next = rt
            .block_on(store.series_since(run, Some(&read.mark)))
            .expect("since");
        news.push(ms_since(t0));
        let SeriesUpdate::Appended(tails) = next.update else {
            panic!("expected only the news")
        };
        assert!(tails.iter().all(|t| t.len() == 1));
    }
    drop(writer);
    rt.block_on(task).expect("writer");
    rt.block_on(store.close());
    println!(
        "live (store): 8 series x {STEPS} points: reading them whole {:.1} ms; reading what the \
         last step added {:.2} ms (median of 9)",
        median(whole),
        median(news)
    );
}

fn main() {
    frames();
    open_store();
    live_app();
    live_store();
}
