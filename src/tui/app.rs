//! The workbench's state and its one update function (TEA): [`App::update`] takes a [`Msg`] (a key,
//! a tick, data the loader read) and returns the [`Effect`]s the runtime must carry out (reads).
//! No IO and no drawing here, so every behaviour is testable by feeding messages.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::action::{Action, Binding, DEFAULT_KEYS, Scope, action_for};
use super::dashboard::Dashboard;
use super::runs::{RunRow, RunsView};
use crate::metrics::Series;
use crate::store::RunId;

/// Below this the views do not fit; the screen says so instead.
pub const MIN_WIDTH: u16 = 80;
pub const MIN_HEIGHT: u16 = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum View {
    Runs,
    Dashboard,
}

impl View {
    pub fn scope(self) -> Scope {
        match self {
            View::Runs => Scope::Runs,
            View::Dashboard => Scope::Dashboard,
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            View::Runs => "Runs",
            View::Dashboard => "Dashboard",
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
    Resize {
        width: u16,
        height: u16,
    },
    /// Time passes: spinners turn, live data is polled.
    Tick,
    RunsLoaded(Result<Vec<RunRow>, String>),
    SeriesLoaded {
        run: RunId,
        result: Result<Vec<Series>, String>,
    },
}

/// What the runtime must do for the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    LoadRuns,
    LoadSeries(RunId),
}

/// Ticks between polls of the store for live data (a tick is 250 ms).
pub const POLL_TICKS: u64 = 4;

pub struct App {
    pub view: View,
    pub help: bool,
    /// A filter being typed after `/`.
    pub input: Option<String>,
    pub runs: RunsView,
    pub dashboard: Option<Dashboard>,
    /// The last error or notice, shown in the status line.
    pub status: Option<String>,
    pub ticks: u64,
    pub size: (u16, u16),
    pub quit: bool,
    keys: &'static [Binding],
}

impl Default for App {
    fn default() -> Self {
        App::new()
    }
}

impl App {
    pub fn new() -> App {
        App {
            view: View::Runs,
            help: false,
            input: None,
            runs: RunsView::default(),
            dashboard: None,
            status: None,
            ticks: 0,
            size: (MIN_WIDTH, MIN_HEIGHT),
            quit: false,
            keys: DEFAULT_KEYS,
        }
    }

    pub fn keys(&self) -> &'static [Binding] {
        self.keys
    }

    /// The effects to run when the workbench opens.
    pub fn start(&self) -> Vec<Effect> {
        vec![Effect::LoadRuns]
    }

    pub fn update(&mut self, msg: Msg) -> Vec<Effect> {
        match msg {
            Msg::Key(key) => self.key(key),
            Msg::Scroll { up } => {
                let action = if up { Action::Up } else { Action::Down };
                self.act(action)
            }
            Msg::Resize { width, height } => {
                self.size = (width, height);
                vec![]
            }
            Msg::Tick => self.tick(),
            Msg::RunsLoaded(Ok(rows)) => {
                self.runs.set_rows(rows);
                vec![]
            }
            Msg::RunsLoaded(Err(e)) => {
                self.runs.loaded = true;
                self.status = Some(e);
                vec![]
            }
            Msg::SeriesLoaded { run, result } => {
                match (self.dashboard.as_mut(), result) {
                    (Some(d), Ok(series)) if d.run == run => d.set_series(series),
                    (Some(d), Err(e)) if d.run == run => {
                        d.loaded = true;
                        self.status = Some(e);
                    }
                    _ => {} // an answer for a dashboard that was closed since
                }
                vec![]
            }
        }
    }

    fn tick(&mut self) -> Vec<Effect> {
        self.ticks += 1;
        if !self.ticks.is_multiple_of(POLL_TICKS) {
            return vec![];
        }
        // Live data: the run list while it shows a live run, the open dashboard unless frozen.
        let mut effects = vec![];
        if self.view == View::Runs && self.runs.rows.iter().any(|r| r.live) {
            effects.push(Effect::LoadRuns);
        }
        if let Some(d) = &self.dashboard
            && self.view == View::Dashboard
            && d.live
            && !d.frozen
        {
            effects.push(Effect::LoadSeries(d.run));
        }
        effects
    }

    fn key(&mut self, key: KeyEvent) -> Vec<Effect> {
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
                    self.quit = true;
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
        match action_for(self.keys, self.view.scope(), &key) {
            Some(action) => self.act(action),
            None => vec![],
        }
    }

    fn set_filter(&mut self, filter: String) {
        match self.view {
            View::Runs => self.runs.set_filter(filter),
            View::Dashboard => {
                if let Some(d) = self.dashboard.as_mut() {
                    d.set_filter(filter);
                }
            }
        }
    }

    /// Carry out one action.
    pub fn act(&mut self, action: Action) -> Vec<Effect> {
        if self.help {
            // The help screen is modal: it closes on any of these, everything else is ignored.
            if matches!(action, Action::ToggleHelp | Action::Back | Action::Quit) {
                self.help = false;
            }
            return vec![];
        }
        match action {
            Action::Quit => self.quit = true,
            Action::ToggleHelp => self.help = true,
            Action::Filter => {
                let current = match self.view {
                    View::Runs => self.runs.filter.clone(),
                    View::Dashboard => self
                        .dashboard
                        .as_ref()
                        .map(|d| d.filter.clone())
                        .unwrap_or_default(),
                };
                self.input = Some(current);
            }
            Action::Refresh => {
                return match (&self.view, &self.dashboard) {
                    (View::Dashboard, Some(d)) => vec![Effect::LoadSeries(d.run)],
                    _ => vec![Effect::LoadRuns],
                };
            }
            Action::View(1) => self.view = View::Runs,
            Action::View(2) if self.dashboard.is_some() => self.view = View::Dashboard,
            Action::View(_) => {}
            Action::Back => match self.view {
                View::Dashboard => self.view = View::Runs,
                View::Runs => {
                    if !self.runs.filter.is_empty() {
                        self.runs.set_filter(String::new());
                    } else {
                        self.status = None;
                    }
                }
            },
            Action::Open if self.view == View::Runs => return self.open_selected(),
            other => match self.view {
                View::Runs => self.runs.act(other),
                View::Dashboard => {
                    if let Some(d) = self.dashboard.as_mut() {
                        d.act(other);
                    }
                }
            },
        }
        vec![]
    }

    fn open_selected(&mut self) -> Vec<Effect> {
        let Some(row) = self.runs.selected_row() else {
            return vec![];
        };
        let (id, name, live) = (row.info.id, row.info.name.clone(), row.live);
        self.view = View::Dashboard;
        if self.dashboard.as_ref().is_some_and(|d| d.run == id) {
            return vec![];
        }
        self.dashboard = Some(Dashboard::new(id, name, live));
        vec![Effect::LoadSeries(id)]
    }

    /// Whether the terminal is too small for the views.
    pub fn too_small(&self) -> bool {
        self.size.0 < MIN_WIDTH || self.size.1 < MIN_HEIGHT
    }
}
