//! The workbench's state and its one update function (TEA): [`App::update`] takes a [`Msg`] (a key,
//! a tick, data the loader read, a process that started or ended) and returns the [`Effect`]s the
//! runtime must carry out (reads, starting and signalling runs, exports). No IO and no drawing
//! here, so every behaviour is testable by feeding messages.

use std::path::PathBuf;
use std::sync::Arc;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::action::{Action, Binding, DEFAULT_KEYS, Scope, action_for};
use super::commands::{RunSignal, Started};
use super::control::Confirm;
use super::dashboard::Dashboard;
use super::debugger::{DebugJob, DebugMsg, DebugView};
use super::episodes::EpisodesView;
use super::events::EventsView;
use super::launch::LaunchForm;
use super::palette::{Palette, PaletteOutcome};
use super::replay::{Replay, Timeline};
use super::runs::{RunRow, RunsView};
use super::samples::{SampleSteps, SamplesView};
use super::theme::Theme;
use super::workers::WorkersView;
use crate::metrics::SampleRecord;
use crate::store::liveness::ProcessIdentity;
use crate::store::reads::{EventsRead, StoredEvent};
use crate::store::series_since::{SeriesMark, SeriesRead};
use crate::store::{RunId, RunInfo, RunStatus};

/// Below this the views do not fit; the screen says so instead.
pub const MIN_WIDTH: u16 = 80;
pub const MIN_HEIGHT: u16 = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    Runs,
    Dashboard,
    Samples,
    Workers,
    Events,
    Episodes,
    Debugger,
}

impl View {
    pub const ALL: [View; 7] = [
        View::Runs,
        View::Dashboard,
        View::Samples,
        View::Workers,
        View::Events,
        View::Episodes,
        View::Debugger,
    ];

    pub fn scope(self) -> Scope {
        match self {
            View::Runs => Scope::Runs,
            View::Dashboard => Scope::Dashboard,
            View::Samples => Scope::Samples,
            View::Workers => Scope::Workers,
            View::Events => Scope::Events,
            View::Episodes => Scope::Episodes,
            View::Debugger => Scope::Debugger,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            View::Runs => "Runs",
            View::Dashboard => "Dashboard",
            View::Samples => "Samples",
            View::Workers => "Workers",
            View::Events => "Events",
            View::Episodes => "Episodes",
            View::Debugger => "Env debugger",
        }
    }
}

#[derive(Debug)]
pub enum Msg {
    Key(KeyEvent),
    /// Mouse wheel: up or down one line.
    Scroll {
        up: bool,
    },
    /// A left click at a cell of the screen.
    Click {
        column: u16,
        row: u16,
    },
    Resize {
        width: u16,
        height: u16,
    },
    /// Time passes (a quarter second): spinners turn, replay plays, live data is polled.
    Tick,
    RunsLoaded(Result<Vec<RunRow>, String>),
    /// `run`'s series since the mark `since` (whole without one).
    SeriesLoaded {
        run: RunId,
        since: Option<SeriesMark>,
        result: Result<SeriesRead, String>,
    },
    SampleStepsLoaded {
        run: RunId,
        result: Result<SampleSteps, String>,
    },
    SamplesLoaded {
        run: RunId,
        stage: String,
        step: u64,
        result: Result<Vec<SampleRecord>, String>,
    },
    EpisodeStepsLoaded {
        run: RunId,
        /// (step, evaluation episodes) pairs.
        result: Result<Vec<(u64, bool)>, String>,
    },
    EpisodesLoaded {
        run: RunId,
        step: u64,
        result: Result<Vec<crate::metrics::TrajectoryRecord>, String>,
    },
    PromptLoaded {
        run: RunId,
        stage: String,
        prompt: String,
        result: Result<Vec<SampleRecord>, String>,
    },
    /// The run's record and its events after the event `after` (all without it).
    EventsLoaded {
        run: RunId,
        after: Option<i64>,
        result: Result<(Box<RunInfo>, EventsRead), String>,
    },
    ConfigsFound(Vec<PathBuf>),
    /// A `roll-tui run`/`resume` for `run`, started from here, is running (or could not start).
    Started {
        run: String,
        result: Result<Started, String>,
    },
    /// A process started from here ended; `tail` is the end of its log.
    Exited {
        pid: u32,
        code: Option<i32>,
        tail: String,
    },
    /// The outcome of a signal, export or other command, for the status line.
    Done(Result<String, String>),
    /// A run was deleted (or could not be).
    RunDeleted {
        run: RunId,
        name: String,
        result: Result<(), String>,
    },
    /// The outcome of the debugger's work.
    Debug(Box<DebugMsg>),
}

/// What the runtime must do for the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    LoadRuns,
    /// A run's series: only what came after `since` (every point without it).
    LoadSeries {
        run: RunId,
        since: Option<SeriesMark>,
    },
    LoadSampleSteps(RunId),
    LoadSamples {
        run: RunId,
        stage: String,
        step: u64,
    },
    LoadPrompt {
        run: RunId,
        stage: String,
        prompt: String,
    },
    /// The steps of the run that recorded agentic episodes.
    LoadEpisodeSteps(RunId),
    LoadEpisodes {
        run: RunId,
        step: u64,
    },
    /// The run's record and its events after the event `after` (workers and events views).
    LoadEvents {
        run: RunId,
        after: Option<i64>,
    },
    FindConfigs,
    /// Start `roll-tui run CONFIG OVERRIDES… --quiet` detached; the run will be called `name`.
    Launch {
        config: PathBuf,
        overrides: Vec<String>,
        name: String,
    },
    /// Start `roll-tui resume RUN --quiet` detached.
    Resume {
        run: String,
    },
    /// Signal a process (checked to be the same process first).
    Signal {
        process: ProcessIdentity,
        signal: RunSignal,
    },
    /// Delete a run's records (after the user confirmed).
    DeleteRun {
        run: RunId,
        name: String,
    },
    /// Write the run's plots and CSV (only the series `keys`, when given) to `out`.
    Export {
        run: RunId,
        name: String,
        keys: Option<Vec<(String, String)>>,
        out: PathBuf,
    },
    /// The debugger's work: loading a model, drawing, saving, reading a stored episode.
    Debug(Box<DebugJob>),
}

impl Effect {
    /// Reads that may be repeated while the last is still answering are skipped by the runtime.
    pub fn is_read(&self) -> bool {
        matches!(
            self,
            Effect::LoadRuns
                | Effect::LoadSeries { .. }
                | Effect::LoadSampleSteps(_)
                | Effect::LoadSamples { .. }
                | Effect::LoadPrompt { .. }
                | Effect::LoadEpisodeSteps(_)
                | Effect::LoadEpisodes { .. }
                | Effect::LoadEvents { .. }
        )
    }

    /// The same read as `other`, as far as repeating it goes: one series read per run at a time,
    /// whatever mark it asks from.
    pub fn same_read(&self, other: &Effect) -> bool {
        match (self, other) {
            (Effect::LoadSeries { run: a, .. }, Effect::LoadSeries { run: b, .. }) => a == b,
            (Effect::LoadEvents { run: a, .. }, Effect::LoadEvents { run: b, .. }) => a == b,
            _ => self == other,
        }
    }

    /// Every point of `run`'s series.
    pub fn load_whole(run: RunId) -> Effect {
        Effect::LoadSeries { run, since: None }
    }
}

/// Ticks between polls of the store for live data (a tick is 250 ms).
pub const POLL_TICKS: u64 = 4;
/// Ticks between reads of the runs list when none of its runs is live (5 s).
pub const IDLE_POLL_TICKS: u64 = 20;
/// Seconds a tick stands for.
pub const TICK_SECONDS: f64 = 0.25;

/// The run whose views are open.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenRun {
    pub id: RunId,
    pub name: String,
    pub live: bool,
    pub start_ms: i64,
}

pub struct App {
    pub view: View,
    pub help: bool,
    /// A filter being typed after `/`.
    pub input: Option<String>,
    pub runs: RunsView,
    pub open: Option<OpenRun>,
    pub dashboard: Option<Dashboard>,
    pub samples: Option<SamplesView>,
    pub episodes: Option<EpisodesView>,
    pub workers: Option<WorkersView>,
    pub events: Option<EventsView>,
    /// The env debugger: it needs no open run, and stays when another run is opened.
    pub debugger: Option<DebugView>,
    /// `D` was pressed once on this episode and turn while the debugger held unsaved work.
    replace_debugged: Option<(RunId, usize, usize, usize, usize)>,
    /// The view `D` opened the debugger from (Episodes), where Esc returns; none when it was
    /// reached by its number.
    debugger_from: Option<View>,
    /// The open run's steps in time order, from its series.
    pub timeline: Timeline,
    /// The open run's events as read so far (shared with the workers and events views), and the
    /// last one's id: polls read only what came after it.
    pub run_events: Arc<Vec<StoredEvent>>,
    pub events_mark: Option<i64>,
    pub replay: Option<Replay>,
    pub form: Option<LaunchForm>,
    pub palette: Option<Palette>,
    pub confirm: Option<Confirm>,
    /// Processes started from this workbench that have not ended.
    pub started: Vec<Started>,
    /// Run pids already asked to stop: a second SIGINT would end them without a checkpoint.
    pub stopping: Vec<u32>,
    /// Run processes this workbench paused: they are let go (SIGCONT) when it quits.
    pub paused_here: Vec<ProcessIdentity>,
    /// Runs started from here, each opened as soon as the store lists it live.
    pub pending_open: Vec<String>,
    /// Starts asked for whose process has not been reported yet.
    pub launching: usize,
    /// `q` was pressed while a start was on its way: ask (or quit) once it has been reported.
    pub quit_when_started: bool,
    /// The last error, shown in the status line.
    pub status: Option<String>,
    /// Why the run list could not be read (e.g. no store yet); gone once it can.
    pub load_error: Option<String>,
    /// The last notice (not an error), shown in the status line.
    pub notice: Option<String>,
    pub ticks: u64,
    pub size: (u16, u16),
    pub quit: bool,
    pub theme: Theme,
    pub(super) keys: Vec<Binding>,
}

impl Default for App {
    fn default() -> Self {
        App::new()
    }
}

impl App {
    pub fn new() -> App {
        App::with_config(DEFAULT_KEYS.to_vec(), Theme::default())
    }

    pub fn with_config(keys: Vec<Binding>, theme: Theme) -> App {
        App {
            view: View::Runs,
            help: false,
            input: None,
            runs: RunsView::default(),
            open: None,
            dashboard: None,
            samples: None,
            episodes: None,
            workers: None,
            events: None,
            debugger: None,
            replace_debugged: None,
            debugger_from: None,
            timeline: Timeline::default(),
            run_events: Arc::default(),
            events_mark: None,
            replay: None,
            form: None,
            palette: None,
            confirm: None,
            started: vec![],
            stopping: vec![],
            paused_here: vec![],
            pending_open: vec![],
            launching: 0,
            quit_when_started: false,
            status: None,
            load_error: None,
            notice: None,
            ticks: 0,
            size: (MIN_WIDTH, MIN_HEIGHT),
            quit: false,
            theme,
            keys,
        }
    }

    pub fn keys(&self) -> &[Binding] {
        &self.keys
    }

    /// The effects to run when the workbench opens.
    pub fn start(&self) -> Vec<Effect> {
        vec![Effect::LoadRuns]
    }

    pub fn update(&mut self, msg: Msg) -> Vec<Effect> {
        match msg {
            Msg::Key(key) => self.key(key),
            Msg::Scroll { up } => self.act(if up { Action::Up } else { Action::Down }),
            Msg::Click { column, row } => self.click(column, row),
            Msg::Resize { width, height } => {
                self.size = (width, height);
                vec![]
            }
            Msg::Tick => self.tick(),
            Msg::RunsLoaded(Ok(rows)) => {
                self.load_error = None;
                self.runs.set_rows(rows);
                self.open_pending()
            }
            Msg::RunsLoaded(Err(e)) => {
                self.runs.loaded = true;
                self.load_error = Some(e);
                vec![]
            }
            other => self.loaded(other),
        }
    }

    fn tick(&mut self) -> Vec<Effect> {
        self.ticks += 1;
        let mut effects = vec![];
        if let Some(r) = self.replay.as_mut()
            && r.advance(&self.timeline, TICK_SECONDS)
        {
            effects.extend(self.cursor_moved());
        }
        if !self.ticks.is_multiple_of(POLL_TICKS) {
            return effects;
        }
        // Live data: the run list while it shows a live run, while a run started here is on its
        // way, and while a drawn run is live (to see it end); what the drawn live runs added;
        // the open run's view.
        let starting = !self.pending_open.is_empty() || !self.started.is_empty();
        let live_parts = self
            .dashboard
            .as_ref()
            .map(|d| d.live_parts())
            .unwrap_or_default();
        let list_live = self.view == View::Runs && self.runs.rows.iter().any(|r| r.live);
        // With nothing live the list is still read now and then, so that runs started or
        // deleted elsewhere (another terminal, `roll-tui runs rm`) show without Ctrl-r.
        let list_idle = self.view == View::Runs && self.ticks.is_multiple_of(IDLE_POLL_TICKS);
        if list_live || list_idle || starting || !live_parts.is_empty() {
            effects.push(Effect::LoadRuns);
        }
        if !self.dashboard.as_ref().is_some_and(|d| d.frozen) {
            effects.extend(
                live_parts
                    .into_iter()
                    .map(|(run, since)| Effect::LoadSeries { run, since }),
            );
        }
        if let Some(open) = self.open.as_ref().filter(|o| o.live) {
            match self.view {
                View::Samples if self.replay.is_none() => {
                    effects.push(Effect::LoadSampleSteps(open.id))
                }
                View::Workers | View::Events => effects.push(self.load_events(open.id)),
                View::Episodes if self.replay.is_none() => {
                    effects.push(Effect::LoadEpisodeSteps(open.id))
                }
                _ => {}
            }
        }
        effects
    }

    fn key(&mut self, key: KeyEvent) -> Vec<Effect> {
        // A message stays until the next key, as in an editor's message line.
        self.status = None;
        self.notice = None;
        if self.help {
            // The help screen is modal: it closes on ?, Esc or q; everything else is ignored.
            if matches!(
                action_for(&self.keys, self.view.scope(), &key),
                Some(Action::ToggleHelp | Action::Back | Action::Quit)
            ) {
                self.help = false;
            }
            return vec![];
        }
        if self.confirm.is_some() {
            return self.confirm_key(key);
        }
        if let Some(p) = self.palette.as_mut() {
            return match p.key(key) {
                PaletteOutcome::Stay => vec![],
                PaletteOutcome::Close => {
                    self.palette = None;
                    vec![]
                }
                PaletteOutcome::Run(action) => {
                    self.palette = None;
                    self.act(action)
                }
            };
        }
        if self.form.is_some() {
            return self.form_key(key);
        }
        if self.view == View::Debugger
            && let Some(d) = self.debugger.as_mut().filter(|d| d.input.is_some())
        {
            return debug_effects(d.input_key(key));
        }
        if let Some(text) = self.input.as_mut() {
            match key.code {
                KeyCode::Enter => self.input = None,
                KeyCode::Esc => {
                    self.input = None;
                    self.set_filter(String::new());
                }
                KeyCode::Backspace => {
                    text.pop();
                    let f = text.clone();
                    self.set_filter(f);
                }
                KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => {
                    return self.act(Action::Quit);
                }
                KeyCode::Char(c) => {
                    text.push(c);
                    let f = text.clone();
                    self.set_filter(f);
                }
                _ => {}
            }
            return vec![];
        }
        match action_for(&self.keys, self.view.scope(), &key) {
            Some(action) if action.applies_in(self.view.scope()) => self.act(action),
            _ => vec![],
        }
    }

    fn filter(&self) -> String {
        match self.view {
            View::Runs => Some(self.runs.filter.clone()),
            View::Dashboard => self.dashboard.as_ref().map(|d| d.filter.clone()),
            View::Samples => self.samples.as_ref().map(|s| s.filter().to_string()),
            View::Workers | View::Episodes | View::Debugger => None,
            View::Events => self.events.as_ref().map(|e| e.filter().to_string()),
        }
        .unwrap_or_default()
    }

    fn set_filter(&mut self, filter: String) {
        match self.view {
            View::Runs => self.runs.set_filter(filter),
            View::Dashboard => {
                if let Some(d) = self.dashboard.as_mut() {
                    d.set_filter(filter);
                }
            }
            View::Samples => {
                if let Some(s) = self.samples.as_mut() {
                    s.set_filter(filter);
                }
            }
            View::Workers | View::Episodes | View::Debugger => {}
            View::Events => {
                if let Some(e) = self.events.as_mut() {
                    e.set_filter(filter);
                }
            }
        }
    }

    /// Carry out one action.
    pub fn act(&mut self, action: Action) -> Vec<Effect> {
        match action {
            Action::Quit => return self.ask_quit(),
            Action::ToggleHelp => self.help = true,
            Action::Palette => self.palette = Some(Palette::new(&self.keys, self.view.scope())),
            Action::Filter
                if !matches!(self.view, View::Workers | View::Episodes | View::Debugger) =>
            {
                self.input = Some(self.filter())
            }
            Action::Refresh => return self.refresh(),
            Action::View(n) => return self.go_to_view(n),
            Action::Back
                if self.view == View::Debugger
                    && self.debugger.as_mut().is_some_and(|d| d.back()) => {}
            Action::Back => self.back(),
            Action::DebugEpisode if self.view == View::Episodes => return self.debug_episode(),
            Action::NewRun => return vec![Effect::FindConfigs],
            Action::StopRun => self.ask_stop(),
            Action::DeleteRun => self.ask_delete(),
            Action::PauseRun => return self.pause(),
            Action::ResumeRun => return self.resume(),
            Action::Compare => return self.compare(),
            Action::Export => return self.export(),
            Action::Replay => return self.toggle_replay(),
            Action::StepBack => return self.step_replay(-1),
            Action::StepForward => return self.step_replay(1),
            Action::StepBack10 => return self.step_replay(-10),
            Action::StepForward10 => return self.step_replay(10),
            Action::Play => {
                if let Some(r) = self.replay.as_mut() {
                    r.toggle_play(&self.timeline);
                    return self.cursor_moved();
                } else if self.open.is_some() {
                    self.replay = Replay::start(&self.timeline);
                    if let Some(r) = self.replay.as_mut() {
                        r.toggle_play(&self.timeline);
                    }
                    return self.cursor_moved();
                }
            }
            Action::Speed => {
                if let Some(r) = self.replay.as_mut() {
                    r.next_speed();
                }
            }
            Action::Open if self.view == View::Runs => return self.open_selected(),
            Action::Open if self.view == View::Dashboard => return self.open_samples(),
            other => return self.view_act(other),
        }
        vec![]
    }

    fn view_act(&mut self, action: Action) -> Vec<Effect> {
        let run = self.open.as_ref().map(|o| o.id);
        match (self.view, run) {
            (View::Runs, _) => self.runs.act(action),
            (View::Dashboard, _) => {
                if let Some(d) = self.dashboard.as_mut() {
                    d.act(action);
                }
            }
            (View::Samples, Some(_)) => {
                if let Some(s) = self.samples.as_mut()
                    && let Some(request) = s.act(action)
                {
                    return vec![s.effect(request)];
                }
            }
            (View::Workers, _) => {
                if let Some(w) = self.workers.as_mut() {
                    w.act(action);
                }
            }
            (View::Episodes, Some(run)) => {
                if let Some(step) = self.episodes.as_mut().and_then(|e| e.act(action)) {
                    return vec![Effect::LoadEpisodes { run, step }];
                }
            }
            (View::Events, _) => {
                if let Some(e) = self.events.as_mut() {
                    e.act(action);
                }
            }
            (View::Debugger, _) => {
                if let Some(d) = self.debugger.as_mut() {
                    return debug_effects(d.act(action));
                }
            }
            _ => {}
        }
        vec![]
    }

    /// `D` on the Episodes view: the selected episode, at the selected turn, in the debugger.
    fn debug_episode(&mut self) -> Vec<Effect> {
        let (Some(open), Some(view)) = (self.open.as_ref(), self.episodes.as_ref()) else {
            return vec![];
        };
        let Some(e) = view.selected_episode() else {
            self.notice = Some("no episode selected".into());
            return vec![];
        };
        let turn = match view.pane {
            super::episodes::Pane::Turns => view.turn,
            super::episodes::Pane::Episodes => e.turns.len(),
        };
        let asked = (open.id, e.step, e.group, e.episode, turn);
        // An episode played in the debugger and not saved is not thrown away on one key.
        if self.debugger.as_ref().is_some_and(|d| d.unsaved) && self.replace_debugged != Some(asked)
        {
            self.replace_debugged = Some(asked);
            self.notice = Some(
                "the debugger holds an episode that is not saved (7, then w saves it); D again \
                 replaces it"
                    .into(),
            );
            return vec![];
        }
        self.replace_debugged = None;
        let (mut d, job) = DebugView::opening(
            &open.name,
            e.step as u64,
            e.group,
            e.episode,
            Some(e.env.clone()),
            turn,
        );
        // The loaded model and sampling settings stay.
        if let Some(old) = self.debugger.take() {
            d.adopt_model(old);
        }
        self.debugger = Some(d);
        self.debugger_from = Some(self.view);
        self.view = View::Debugger;
        vec![Effect::Debug(Box::new(job))]
    }

    /// Esc: close the innermost thing first: a whole response, then the view's committed search or
    /// filter, then replay, and only then the view itself.
    fn back(&mut self) {
        if self.view == View::Samples && self.samples.as_mut().is_some_and(|s| s.close_whole()) {
            return;
        }
        if matches!(self.view, View::Dashboard | View::Samples | View::Events)
            && !self.filter().is_empty()
        {
            self.set_filter(String::new());
            return;
        }
        if self.replay.is_some() && self.view != View::Runs {
            self.replay = None;
            self.notice = Some("replay left: following the newest step".into());
            self.sync_as_of();
            return;
        }
        match self.view {
            View::Runs => {
                if !self.runs.filter.is_empty() {
                    self.runs.set_filter(String::new());
                } else {
                    self.status = None;
                    self.notice = None;
                }
            }
            View::Dashboard => self.view = View::Runs,
            // Back where `D` was pressed (the episode's view).
            View::Debugger if self.debugger_from.is_some() => {
                self.view = self.debugger_from.take().unwrap_or(View::Runs);
            }
            _ if self.open.is_none() => self.view = View::Runs,
            _ => self.view = View::Dashboard,
        }
    }

    fn refresh(&mut self) -> Vec<Effect> {
        let Some(run) = self.open.as_ref().map(|o| o.id) else {
            return vec![Effect::LoadRuns];
        };
        match self.view {
            View::Runs => vec![Effect::LoadRuns],
            View::Dashboard => self.series_loads(),
            View::Samples => {
                let mut effects = vec![Effect::LoadSampleSteps(run)];
                if let Some(s) = self.samples.as_mut()
                    && let Some(r) = s.act(Action::Refresh)
                {
                    effects.push(s.effect(r));
                }
                effects
            }
            View::Workers | View::Events => vec![Effect::LoadEvents { run, after: None }],
            View::Episodes => {
                let mut effects = vec![Effect::LoadEpisodeSteps(run)];
                if let Some(step) = self.episodes.as_mut().and_then(|e| e.act(Action::Refresh)) {
                    effects.push(Effect::LoadEpisodes { run, step });
                }
                effects
            }
            View::Debugger => vec![],
        }
    }

    /// Series reads for the dashboard: the open run, and the runs overlaid on it.
    fn series_loads(&self) -> Vec<Effect> {
        match &self.dashboard {
            Some(d) => d.runs().into_iter().map(Effect::load_whole).collect(),
            None => vec![],
        }
    }

    pub(super) fn go_to_view(&mut self, n: u8) -> Vec<Effect> {
        let Some(view) = View::ALL.get(usize::from(n).wrapping_sub(1)).copied() else {
            return vec![];
        };
        if view == View::Debugger {
            self.debugger_from = None;
            self.view = view;
            if self.debugger.is_none() {
                self.debugger = Some(DebugView::default_env());
            }
            return vec![];
        }
        let Some(run) = self.open.as_ref().map(|o| o.id) else {
            if view != View::Runs {
                self.notice = Some("open a run first (Enter on the runs list)".into());
            }
            self.view = View::Runs;
            return vec![];
        };
        self.view = view;
        match view {
            View::Samples if self.samples.is_none() => {
                self.samples = Some(SamplesView::new(run));
                vec![Effect::LoadSampleSteps(run)]
            }
            View::Episodes if self.episodes.is_none() => {
                self.episodes = Some(EpisodesView::new(run));
                vec![Effect::LoadEpisodeSteps(run)]
            }
            View::Workers | View::Events => {
                if self.workers.is_none() {
                    self.workers = Some(WorkersView::new(run));
                }
                if self.events.is_none() {
                    self.events = Some(EventsView::new(run));
                }
                self.sync_as_of();
                vec![self.load_events(run)]
            }
            _ => vec![],
        }
    }

    /// Enter on the dashboard: the samples of the replayed step, or of the newest one.
    fn open_samples(&mut self) -> Vec<Effect> {
        let mut effects = self.go_to_view(3);
        let step = self
            .samples
            .as_ref()
            .and_then(|s| self.replay_step_in(s.stage()));
        if let (Some(s), Some(step)) = (self.samples.as_mut(), step)
            && let Some(request) = s.go_to(step)
        {
            effects.push(s.effect(request));
        }
        effects
    }

    fn open_selected(&mut self) -> Vec<Effect> {
        let Some(row) = self.runs.selected_row() else {
            return vec![];
        };
        let open = OpenRun {
            id: row.info.id,
            name: row.info.name.clone(),
            live: row.live,
            start_ms: row.info.created_at,
        };
        self.view = View::Dashboard;
        if self.open.as_ref().is_some_and(|o| o.id == open.id)
            && self.dashboard.as_ref().is_some_and(|d| d.runs().len() == 1)
        {
            return vec![];
        }
        self.open_run(open, vec![])
    }

    /// Open `open`'s views (closing the last run's), with `overlay` runs (id, name, live) drawn
    /// over its curves.
    pub(super) fn open_run(
        &mut self,
        open: OpenRun,
        overlay: Vec<(RunId, String, bool)>,
    ) -> Vec<Effect> {
        let mut d = Dashboard::new(open.id, open.name.clone(), open.live);
        // A failed run says why above its curves, not only in its events.
        d.failure = self
            .runs
            .rows
            .iter()
            .find(|r| r.info.id == open.id && r.info.status == RunStatus::Failed)
            .map(|r| {
                r.info
                    .error
                    .clone()
                    .unwrap_or_else(|| "no reason recorded".into())
            });
        let config_of = |id: RunId| {
            self.runs
                .rows
                .iter()
                .find(|r| r.info.id == id)
                .map_or("", |r| r.info.config_json.as_str())
        };
        if !overlay.is_empty() {
            let mut configs = vec![config_of(open.id)];
            configs.extend(overlay.iter().map(|(id, _, _)| config_of(*id)));
            d.config_diff = super::config_diff::differences(&configs);
        }
        for (id, name, live) in overlay {
            d.overlay(id, name, live);
        }
        let effects = d.runs().into_iter().map(Effect::load_whole).collect();
        self.dashboard = Some(d);
        self.samples = None;
        self.episodes = None;
        self.workers = None;
        self.events = None;
        self.replay = None;
        self.timeline = Timeline::default();
        self.run_events = Arc::default();
        self.events_mark = None;
        self.open = Some(open);
        self.view = View::Dashboard;
        effects
    }
}

fn debug_effects(jobs: Vec<DebugJob>) -> Vec<Effect> {
    jobs.into_iter()
        .map(|j| Effect::Debug(Box::new(j)))
        .collect()
}
