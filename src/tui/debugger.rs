//! The Env view (view 7, also `roll-tui env debug`): the env debugger's front-end state over a
//! [`Session`]. Keys become debugger commands; what takes time (loading a model, drawing a turn,
//! resampling, saving, reading a stored episode) leaves as a [`DebugJob`] for the runtime and comes
//! back as a [`DebugMsg`], so the screen never waits, and a draw can be cancelled. Environment
//! steps run here: they are quick, and a program that hangs is stopped by its own step timeout.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

pub mod input;
pub mod jobs;
mod loader;
pub mod ops;
pub mod render;

use super::action::Action;
use crate::config::EnvConfig;
use crate::debugger::open::{env_config, session};
use crate::debugger::policy::{Prompt, SamplingOverrides};
use crate::debugger::record::{SaveRequest, SaveTarget, to_jsonl};
use crate::debugger::{Actor, ModelPolicy, Resample, Session};
use crate::rollout::SamplingParams;
use crate::seed::mix_seed;
use input::{Input, InputKind, InputOutcome};
pub use jobs::{DebugJob, DebugMsg, Work};
use ops::{SessionCell, SessionOp};

/// Who plays the turns of `s` (step) and `e` (run to the end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    Human,
    Random,
    Model,
}

/// What the detail panel shows (Tab cycles).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pane {
    Prompt,
    Output,
    Info,
    Samples,
}

pub struct DebugView {
    pub session: Option<Session>,
    pub env: EnvConfig,
    pub policy: PolicyKind,
    pub model: Option<ModelPolicy>,
    /// The model asked for last (shown in the model input).
    pub model_spec: String,
    /// Sampling set by hand (`t`), kept over model loads; `None`: the model's own.
    pub overrides: SamplingOverrides,
    /// Draws per resample.
    pub draws: usize,
    /// The selected turn (0-based); `turns.len()` is the state now.
    pub selected: usize,
    pub pane: Pane,
    pub token: usize,
    /// Lines the detail panel is scrolled up from its end.
    pub scroll: u16,
    pub input: Option<Input>,
    /// The action picker's selection, while it is open.
    pub picker: Option<usize>,
    pub busy: Option<(Work, u64)>,
    pub(super) cancel: Arc<AtomicBool>,
    /// The last resample and the turn it drew.
    pub resample: Option<(usize, Resample)>,
    /// The next model turn's prompt (or why there is none), while a model is loaded.
    pub next_prompt: Option<Result<Prompt, String>>,
    pub error: Option<String>,
    pub notice: Option<String>,
    pub save_target: SaveTarget,
    /// Where the episode came from (`run q · step 3 · group 0 episode 1`).
    pub origin: Option<String>,
    pub(super) draws_made: u64,
    /// The model load under way (it may run beside the reading of a stored episode).
    pub(super) pending_model: Option<u64>,
    /// The episode while a program steps it.
    pub(super) away: Option<SessionCell>,
    /// A model plays to the end: draw again once its turn is applied.
    pub(super) to_end: bool,
    /// The episode changed since it was opened or last saved.
    pub unsaved: bool,
}

/// The environment a debugger opens on when none was named.
pub const DEFAULT_ENV: &str = "frozen_lake";

impl DebugView {
    /// A fresh episode of `env` from `seed`; an environment that cannot start is shown as the
    /// view's error.
    pub fn new(env: EnvConfig, seed: u64) -> DebugView {
        let (session, error) = match session(&env, seed) {
            Ok(s) => (Some(s), None),
            Err(e) => (None, Some(format!("environment '{}': {e}", env.name))),
        };
        DebugView {
            session,
            env,
            policy: PolicyKind::Human,
            model: None,
            model_spec: String::new(),
            overrides: SamplingOverrides::default(),
            draws: 32,
            selected: 0,
            pane: Pane::Output,
            token: 0,
            scroll: 0,
            input: None,
            picker: None,
            busy: None,
            cancel: Arc::default(),
            resample: None,
            next_prompt: None,
            error,
            notice: None,
            save_target: SaveTarget::NewRun,
            origin: None,
            draws_made: 0,
            pending_model: None,
            away: None,
            to_end: false,
            unsaved: false,
        }
    }

    /// The default environment (FrozenLake 4×4) from seed 0.
    pub fn default_env() -> DebugView {
        let env = env_config(DEFAULT_ENV, &[]).expect("the default env's config is valid");
        DebugView::new(env, 0)
    }

    /// A view that opens `run`'s stored episode at `turn` (0-based) once it is read.
    pub fn opening(
        run: &str,
        step: u64,
        group: usize,
        episode: usize,
        env: Option<String>,
        turn: usize,
    ) -> (DebugView, DebugJob) {
        let mut view = DebugView::default_env();
        view.session = None;
        view.model_spec = format!("{run}@{step}");
        let job = view.job();
        view.busy = Some((Work::Opening, job));
        let open = DebugJob::Open {
            job,
            run: run.to_string(),
            step,
            group,
            episode,
            env,
            at: turn,
        };
        (view, open)
    }

    /// A job number no other view of this process has used: an answer to a view that was
    /// replaced can never be taken for one of the new view's.
    pub(super) fn job(&mut self) -> u64 {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        NEXT.fetch_add(1, Ordering::Relaxed)
    }

    pub fn turns(&self) -> usize {
        self.session.as_ref().map_or(0, |s| s.turns.len())
    }

    /// The state changed: select the newest state and work out the next prompt again.
    pub(super) fn changed(&mut self) {
        self.selected = self.turns();
        self.token = 0;
        self.scroll = 0;
        self.next_prompt = match (&self.model, &self.session) {
            (Some(m), Some(s)) if !s.done() => Some(m.prompt(s)),
            _ => None,
        };
    }

    pub(super) fn fail(&mut self, e: impl ToString) {
        self.error = Some(e.to_string());
    }

    /// Carry out a debugger command.
    pub fn act(&mut self, action: Action) -> Vec<DebugJob> {
        self.error = None;
        self.notice = None;
        if let Some(i) = self.picker {
            return self.picker_act(i, action);
        }
        if self.busy.is_some()
            && !matches!(
                action,
                Action::Up
                    | Action::Down
                    | Action::NextPane
                    | Action::PrevPane
                    | Action::PageUp
                    | Action::PageDown
                    | Action::PrevToken
                    | Action::NextToken
            )
        {
            self.notice = Some("busy: Esc cancels".into());
            return vec![];
        }
        match action {
            Action::MoveLeft => return self.session_op(SessionOp::Take("Left".into())),
            Action::MoveDown => return self.session_op(SessionOp::Take("Down".into())),
            Action::MoveRight => return self.session_op(SessionOp::Take("Right".into())),
            Action::MoveUp => return self.session_op(SessionOp::Take("Up".into())),
            Action::PickAction => self.open_picker(),
            Action::TypeOutput => self.input = Some(Input::new(InputKind::Output, "")),
            Action::CyclePolicy => {
                self.policy = match self.policy {
                    PolicyKind::Human => PolicyKind::Random,
                    PolicyKind::Random => PolicyKind::Model,
                    PolicyKind::Model => PolicyKind::Human,
                };
                if self.policy == PolicyKind::Model && self.model.is_none() {
                    self.notice = Some("no model yet: m chooses one".into());
                }
            }
            Action::StepTurn => return self.step(false),
            Action::RunToEnd => return self.step(true),
            Action::Undo => return self.session_op(SessionOp::Undo),
            Action::Fork => return self.session_op(SessionOp::Fork(self.selected)),
            Action::NewEpisode | Action::RestartEpisode => {
                self.resample = None;
                self.save_target = SaveTarget::NewRun;
                self.origin = None;
                let next = matches!(action, Action::NewEpisode);
                return self.session_op(SessionOp::Reset { next });
            }
            Action::Resample => return self.resample(),
            Action::SaveSession => return self.save(),
            Action::ExportSession => return self.export(),
            Action::ChooseModel => {
                self.input = Some(Input::new(InputKind::Model, &self.model_spec));
                return vec![DebugJob::ListCheckpoints { job: self.job() }];
            }
            Action::EditSampling => {
                let now = self.effective_sampling();
                self.input = Some(Input::new(
                    InputKind::Sampling,
                    &crate::tui::debugger::input::sampling_text(&now, self.draws),
                ));
            }
            Action::ChooseEnv => {
                let seed = self.session.as_ref().map_or(0, |s| s.seed);
                self.input = Some(Input::new(
                    InputKind::Env,
                    &crate::tui::debugger::input::env_text(&self.env, seed),
                ));
            }
            Action::Up => self.selected = self.selected.saturating_sub(1),
            Action::Down => self.selected = (self.selected + 1).min(self.turns()),
            Action::Top => self.selected = 0,
            Action::Bottom => self.selected = self.turns(),
            Action::PageUp => self.scroll = self.scroll.saturating_add(10),
            Action::PageDown => self.scroll = self.scroll.saturating_sub(10),
            Action::NextPane | Action::PrevPane => {
                let order = [Pane::Prompt, Pane::Output, Pane::Info, Pane::Samples];
                let i = order.iter().position(|p| *p == self.pane).unwrap_or(0);
                let step = if action == Action::NextPane { 1 } else { 3 };
                self.pane = order[(i + step) % order.len()];
                self.scroll = 0;
            }
            Action::PrevToken => self.token = self.token.saturating_sub(1),
            Action::NextToken => self.token += 1,
            _ => {}
        }
        if matches!(
            action,
            Action::Up | Action::Down | Action::Top | Action::Bottom
        ) {
            self.token = 0;
            self.scroll = 0;
        }
        vec![]
    }

    /// Esc: close the innermost thing (input, picker, work under way); `false` when there was
    /// none, and the view itself is left.
    pub fn back(&mut self) -> bool {
        if self.input.take().is_some() || self.picker.take().is_some() {
            return true;
        }
        if matches!(self.busy, Some((Work::Stepping, _))) {
            self.notice = Some(
                "the environment is stepping: it cannot be interrupted, and its step_timeout \
                 stops a program that hangs"
                    .into(),
            );
            return true;
        }
        if self.busy.is_some() {
            self.cancel.store(true, Ordering::Relaxed);
            if matches!(
                self.busy,
                Some((Work::Drawing { .. } | Work::Resampling, _))
            ) {
                self.notice = Some("cancelling…".into());
            } else {
                // Loading, saving and reading cannot be stopped half way; their answer is
                // dropped.
                if matches!(self.busy, Some((Work::LoadingModel, _))) {
                    self.pending_model = None;
                }
                self.busy = None;
                self.notice = Some("cancelled".into());
            }
            return true;
        }
        false
    }

    /// Change the episode: at once for an env in this process, else on a blocking thread (the
    /// episode waits in a cell until [`DebugMsg::Stepped`]).
    pub(super) fn session_op(&mut self, op: SessionOp) -> Vec<DebugJob> {
        let Some(s) = self.session.as_mut() else {
            self.fail("no episode: c chooses an environment");
            return vec![];
        };
        if !s.env().blocks() {
            let result = op.apply(s);
            return self.applied(result);
        }
        let Some(s) = self.session.take() else {
            return vec![];
        };
        let cell = SessionCell::new(s);
        self.away = Some(cell.clone());
        let job = self.job();
        self.busy = Some((Work::Stepping, job));
        vec![DebugJob::Step { job, cell, op }]
    }

    /// Show what a change of the episode did; the next turn of a model playing to the end.
    pub(super) fn applied(&mut self, result: Result<Option<String>, String>) -> Vec<DebugJob> {
        let ok = result.is_ok();
        self.unsaved |= ok;
        match result {
            Ok(notice) => self.notice = notice.or(self.notice.take()),
            Err(e) => self.error = Some(e),
        }
        self.changed();
        // A model's turn stays selected, so its output and log-probs show.
        if let Some(s) = &self.session
            && s.turns.last().is_some_and(|t| t.actor == Actor::Model)
        {
            self.selected = s.turns.len() - 1;
        }
        if std::mem::take(&mut self.to_end) && ok {
            let go_on = self
                .session
                .as_ref()
                .is_some_and(|s| !s.done() && s.turns.len() < self.env.max_turns);
            if go_on {
                return self.draw(true);
            }
        }
        vec![]
    }

    fn open_picker(&mut self) {
        match self.session.as_ref().map(|s| s.env().actions()) {
            Some(a) if !a.is_empty() => self.picker = Some(0),
            Some(_) => self.fail("this environment lists no actions: i types an output"),
            None => self.fail("no episode: c chooses an environment"),
        }
    }

    fn picker_act(&mut self, i: usize, action: Action) -> Vec<DebugJob> {
        let actions = self
            .session
            .as_ref()
            .map(|s| s.env().actions())
            .unwrap_or_default();
        match action {
            Action::Up | Action::MoveUp => self.picker = Some(i.saturating_sub(1)),
            Action::Down | Action::MoveDown => {
                self.picker = Some((i + 1).min(actions.len().saturating_sub(1)))
            }
            Action::Open => {
                self.picker = None;
                if let Some(a) = actions.get(i) {
                    return self.session_op(SessionOp::Take(a.clone()));
                }
            }
            Action::Back => self.picker = None,
            _ => {}
        }
        vec![]
    }

    /// The sampling a model turn uses: the loaded model's (overrides applied at its load), or
    /// the overrides over the defaults before one is loaded.
    fn effective_sampling(&self) -> SamplingParams {
        match &self.model {
            Some(m) => m.sampling.clone(),
            None => {
                let mut s = SamplingParams::default();
                self.overrides.apply(&mut s);
                s
            }
        }
    }

    /// The model and the prompt of the next turn, or why a model cannot act now.
    fn model_ready(&mut self) -> Option<(ModelPolicy, Prompt)> {
        let Some(model) = self.model.clone() else {
            self.fail("no model: m chooses a directory or RUN@STEP");
            return None;
        };
        if self.session.as_ref().is_none_or(|s| s.done()) {
            self.fail("the episode is over: u undoes, f forks, n starts a new one");
            return None;
        }
        match self.next_prompt.clone() {
            Some(Ok(p)) => Some((model, p)),
            Some(Err(e)) => {
                self.fail(e);
                None
            }
            None => {
                self.changed();
                self.next_prompt
                    .clone()?
                    .map_err(|e| self.fail(e))
                    .ok()
                    .map(|p| (model, p))
            }
        }
    }

    fn step(&mut self, to_end: bool) -> Vec<DebugJob> {
        match self.policy {
            PolicyKind::Human => {
                self.open_picker();
                vec![]
            }
            PolicyKind::Random => self.session_op(SessionOp::Random {
                to_end,
                limit: self.env.max_turns,
            }),
            PolicyKind::Model => self.draw(to_end),
        }
    }

    pub(super) fn draw(&mut self, to_end: bool) -> Vec<DebugJob> {
        let Some((policy, prompt)) = self.model_ready() else {
            return vec![];
        };
        let (seed, turn) = match &self.session {
            Some(s) => (s.seed, s.turns.len() as u64),
            None => return vec![],
        };
        self.draws_made += 1;
        let job = self.job();
        self.cancel = Arc::default();
        self.busy = Some((Work::Drawing { to_end }, job));
        vec![DebugJob::Generate {
            job,
            policy,
            prompt,
            seed: mix_seed(&[seed, 0xdd, turn, self.draws_made]),
            cancel: self.cancel.clone(),
        }]
    }

    fn resample(&mut self) -> Vec<DebugJob> {
        let Some((policy, prompt)) = self.model_ready() else {
            return vec![];
        };
        let Some(s) = &self.session else {
            return vec![];
        };
        self.draws_made += 1;
        let (parser, actions) = (s.parser().clone(), s.env().actions());
        let seed = mix_seed(&[s.seed, 0x5e, s.turns.len() as u64, self.draws_made]);
        let job = self.job();
        self.cancel = Arc::default();
        self.busy = Some((Work::Resampling, job));
        self.pane = Pane::Samples;
        vec![DebugJob::Resample {
            job,
            policy,
            prompt,
            draws: self.draws,
            seed,
            parser,
            actions,
            cancel: self.cancel.clone(),
        }]
    }

    fn save(&mut self) -> Vec<DebugJob> {
        let Some(s) = &self.session else {
            self.fail("no episode to save");
            return vec![];
        };
        if s.turns.is_empty() {
            self.fail("nothing to save yet: play a turn first");
            return vec![];
        }
        let request = Box::new(SaveRequest::of(s, &self.env));
        let job = self.job();
        self.busy = Some((Work::Saving, job));
        vec![DebugJob::Save {
            job,
            request,
            target: self.save_target.clone(),
        }]
    }

    fn export(&mut self) -> Vec<DebugJob> {
        let Some(s) = &self.session else {
            self.fail("no episode to export");
            return vec![];
        };
        let path = PathBuf::from("exports").join(format!(
            "debug-{}-seed{}-{}turns.jsonl",
            s.env_name,
            s.seed,
            s.turns.len()
        ));
        let text = to_jsonl(s);
        vec![DebugJob::Export {
            job: self.job(),
            path,
            text,
        }]
    }

    /// A key while the input line is open.
    pub fn input_key(&mut self, key: crossterm::event::KeyEvent) -> Vec<DebugJob> {
        let Some(input) = self.input.as_mut() else {
            return vec![];
        };
        let text = match input.key(key) {
            InputOutcome::Stay => return vec![],
            InputOutcome::Cancel => {
                self.input = None;
                return vec![];
            }
            InputOutcome::Submit(text) => text,
        };
        let kind = input.kind;
        self.input = None;
        self.error = None;
        match kind {
            InputKind::Output => return self.session_op(SessionOp::Output(text)),
            InputKind::Model => {
                let spec = text.trim().to_string();
                if spec.is_empty() {
                    return vec![];
                }
                self.model_spec = spec.clone();
                return vec![self.load_model(&spec)];
            }
            InputKind::Sampling => {
                match crate::tui::debugger::input::parse_sampling(&text, self.effective_sampling())
                {
                    Ok((sampling, draws)) => {
                        self.overrides = SamplingOverrides::all(&sampling);
                        if let Some(m) = self.model.as_mut() {
                            m.sampling = sampling;
                        }
                        self.draws = draws;
                        self.changed();
                    }
                    Err(e) => self.fail(e),
                }
            }
            InputKind::Env => match crate::tui::debugger::input::parse_env(&text, &self.env) {
                // Started off the screen's thread: an external env's program may be slow.
                Ok((env, seed)) => {
                    let job = self.job();
                    self.busy = Some((Work::Starting, job));
                    return vec![DebugJob::StartEnv {
                        job,
                        env: Box::new(env),
                        seed,
                    }];
                }
                Err(e) => self.fail(e),
            },
        }
        vec![]
    }

    /// Keep `old`'s model, sampling settings and draws (a new view replaces it).
    pub fn adopt_model(&mut self, old: DebugView) {
        self.model = old.model;
        self.overrides = old.overrides;
        self.draws = old.draws;
        if self.model.is_some() {
            self.policy = PolicyKind::Model;
        }
    }

    /// Start loading the model `spec` names (a directory or `RUN@STEP`).
    pub fn load_model(&mut self, spec: &str) -> DebugJob {
        let job = self.job();
        self.pending_model = Some(job);
        if self.busy.is_none() {
            self.busy = Some((Work::LoadingModel, job));
        }
        DebugJob::LoadModel {
            job,
            spec: spec.to_string(),
            env: self.env.clone(),
        }
    }
}

#[cfg(test)]
mod tests;
