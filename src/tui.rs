//! The interactive workbench (`roll-tui` with no arguments): a front-end only. It reads runs and
//! their series from the store and never owns training logic; only the `cli` module imports it.
//!
//! Shape (TEA, docs/STYLE.md §The workbench (TUI)): [`app::App`] holds all state and changes only in `update(Msg)`,
//! which returns the reads ([`app::Effect`]) to run; [`loader`] runs them on the async runtime and
//! answers with messages; [`ui::render`] draws the state. Keys become [`action::Action`]s through
//! one keymap, which is also what the help screen lists. The terminal is restored on exit, on
//! panic and on SIGTERM.

pub mod action;
pub mod app;
pub mod commands;
pub mod config_diff;
pub mod control;
pub mod dashboard;
pub mod debugger;
pub mod decimate;
pub mod episodes;
pub mod events;
pub mod keyconfig;
pub mod launch;
pub mod loader;
pub mod palette;
pub mod reads;
pub mod replay;
pub mod runs;
pub mod samples;
pub mod sync;
pub mod theme;
pub mod ui;
pub mod workers;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crossterm::event::{
    DisableMouseCapture, EnableMouseCapture, Event, EventStream, KeyEventKind, MouseButton,
    MouseEventKind,
};
use crossterm::execute;
use futures_util::StreamExt;
use ratatui::DefaultTerminal;
use tokio::sync::mpsc;

use app::{App, Effect, Msg};
use loader::Loader;

/// How often the app ticks (spinners, live polling).
const TICK: Duration = Duration::from_millis(250);

/// Open the workbench on the store at `store_path` until the user quits.
pub fn run(store_path: &Path) -> anyhow::Result<()> {
    run_with(store_path, |_| vec![])
}

/// Open the workbench on its Env view with `view` (`roll-tui env debug`); `jobs` are the view's
/// first work (reading a stored episode, loading a model).
pub fn run_debugger(
    store_path: &Path,
    view: debugger::DebugView,
    jobs: Vec<debugger::DebugJob>,
) -> anyhow::Result<()> {
    run_with(store_path, move |app| {
        app.debugger = Some(view);
        app.view = app::View::Debugger;
        jobs.into_iter()
            .map(|j| Effect::Debug(Box::new(j)))
            .collect()
    })
}

/// The workbench, with `setup` shaping the app before the first frame (its effects run first).
fn run_with(store_path: &Path, setup: impl FnOnce(&mut App) -> Vec<Effect>) -> anyhow::Result<()> {
    // A broken config file is an error before the terminal is taken over.
    let config = keyconfig::config_path();
    let required = std::env::var_os("ROLL_TUI_CONFIG").is_some();
    let (keys, theme) = keyconfig::load(config.as_deref(), required).map_err(anyhow::Error::msg)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("roll-tui")
        .enable_all()
        .build()?;
    // ratatui::init restores the terminal from a panic hook before the panic message prints.
    let mut terminal = ratatui::init();
    let _ = execute!(std::io::stdout(), EnableMouseCapture);
    // ratatui's hook restores raw mode and the screen; mouse reporting must be turned off too.
    let restore = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let _ = execute!(std::io::stdout(), DisableMouseCapture);
        restore(info);
    }));
    let mut app = App::with_config(keys, theme);
    let first = setup(&mut app);
    let result = rt.block_on(event_loop(&mut terminal, store_path, app, first));
    let _ = execute!(std::io::stdout(), DisableMouseCapture);
    ratatui::restore();
    result
}

fn to_msg(event: Event) -> Option<Msg> {
    match event {
        Event::Key(k) if k.kind != KeyEventKind::Release => Some(Msg::Key(k)),
        Event::Resize(width, height) => Some(Msg::Resize { width, height }),
        Event::Mouse(m) => match m.kind {
            MouseEventKind::ScrollUp => Some(Msg::Scroll { up: true }),
            MouseEventKind::ScrollDown => Some(Msg::Scroll { up: false }),
            MouseEventKind::Down(MouseButton::Left) => Some(Msg::Click {
                column: m.column,
                row: m.row,
            }),
            _ => None,
        },
        _ => None,
    }
}

/// The read a message answers, so the same read can be asked again.
fn answered(msg: &Msg) -> Option<Effect> {
    Some(match msg {
        Msg::RunsLoaded(_) => Effect::LoadRuns,
        Msg::SeriesLoaded { run, .. } => Effect::load_whole(*run),
        Msg::SampleStepsLoaded { run, .. } => Effect::LoadSampleSteps(*run),
        Msg::SamplesLoaded {
            run, stage, step, ..
        } => Effect::LoadSamples {
            run: *run,
            stage: stage.clone(),
            step: *step,
        },
        Msg::PromptLoaded {
            run, stage, prompt, ..
        } => Effect::LoadPrompt {
            run: *run,
            stage: stage.clone(),
            prompt: prompt.clone(),
        },
        Msg::EventsLoaded { run, .. } => Effect::LoadEvents {
            run: *run,
            after: None,
        },
        _ => return None,
    })
}

async fn event_loop(
    terminal: &mut DefaultTerminal,
    store_path: &Path,
    mut app: App,
    first: Vec<Effect>,
) -> anyhow::Result<()> {
    let loader = Arc::new(Loader::new(store_path));
    let (tx, mut answers) = mpsc::unbounded_channel::<Msg>();
    let size = terminal.size()?;
    app.update(Msg::Resize {
        width: size.width,
        height: size.height,
    });
    let mut reads = reads::Reads::default();
    let run_effects = |effects: Vec<Effect>, reads: &mut reads::Reads| {
        for effect in effects {
            // Signals are sent at once: one asked for on the way out must leave before we do.
            if let Effect::Signal { process, signal } = &effect {
                let _ = tx.send(loader::signalled(process, *signal));
                continue;
            }
            if effect.is_read() && !reads.admit(&effect) {
                continue;
            }
            let (loader, tx) = (loader.clone(), tx.clone());
            tokio::spawn(async move { loader.carry_out(effect, &tx).await });
        }
    };
    run_effects(app.start(), &mut reads);
    run_effects(first, &mut reads);
    let mut events = EventStream::new();
    let mut ticks = tokio::time::interval(TICK);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    while !app.quit {
        terminal.draw(|f| ui::render(f, &app, crate::store::now_ms()))?;
        let msg = tokio::select! {
            event = events.next() => match event {
                Some(Ok(e)) => to_msg(e),
                Some(Err(e)) => return Err(e.into()),
                None => break,
            },
            _ = ticks.tick() => Some(Msg::Tick),
            Some(answer) = answers.recv() => {
                // Taken in first, then the read held for after it is asked from where the
                // state now is.
                let held = answered(&answer).and_then(|done| reads.answered(&done));
                let mut effects = app.update(answer);
                effects.extend(held.and_then(|e| app.reread(&e)));
                run_effects(effects, &mut reads);
                None
            }
            _ = term.recv() => break,
        };
        if let Some(msg) = msg {
            let effects = app.update(msg);
            run_effects(effects, &mut reads);
        }
    }
    loader.close().await;
    Ok(())
}
