//! The Env view (view 7, also `roll-tui env debug`): the env debugger's front-end state over a
//! [`Session`]. Keys become debugger commands; what takes time (loading a model, drawing a turn,
//! resampling, saving, reading a stored episode) leaves as a [`DebugJob`] for the runtime and comes
//! back as a [`DebugMsg`], so the screen never waits, and a draw can be cancelled. Environment
//! steps run here: they are quick, and a program that hangs is stopped by its own step timeout.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::action::Action;
use super::debugger_input::{Input, InputKind, InputOutcome};
use crate::config::EnvConfig;
use crate::debugger::open::{StoredEpisode, env_config, session, session_at};
use crate::debugger::policy::{CANCELLED, ModelTurn, Prompt};
use crate::debugger::record::{SaveRequest, SaveTarget, Saved, to_jsonl};
use crate::debugger::{Actor, ModelPolicy, Resample, Session};
use crate::env::ActionParser;
use crate::rollout::SamplingParams;
use crate::seed::mix_seed;

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

/// What is under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    LoadingModel,
    /// A model's turn; `to_end` goes on until the episode ends.
    Drawing {
        to_end: bool,
    },
    Resampling,
    Saving,
    Opening,
}

/// Work for the runtime; answered by a [`DebugMsg`] with the same `job`.
#[derive(Clone)]
pub enum DebugJob {
    LoadModel {
        job: u64,
        spec: String,
        env: EnvConfig,
    },
    Generate {
        job: u64,
        policy: ModelPolicy,
        prompt: Prompt,
        seed: u64,
        cancel: Arc<AtomicBool>,
    },
    Resample {
        job: u64,
        policy: ModelPolicy,
        prompt: Prompt,
        draws: usize,
        seed: u64,
        parser: ActionParser,
        actions: Vec<String>,
        cancel: Arc<AtomicBool>,
    },
    Save {
        job: u64,
        request: Box<SaveRequest>,
        target: SaveTarget,
    },
    Export {
        job: u64,
        path: PathBuf,
        text: String,
    },
    Open {
        job: u64,
        run: String,
        step: u64,
        group: usize,
        episode: usize,
        env: Option<String>,
    },
    /// Every checkpoint in the store, as `RUN@STEP`, newest run first.
    ListCheckpoints { job: u64 },
}

impl DebugJob {
    pub fn id(&self) -> u64 {
        match self {
            DebugJob::LoadModel { job, .. }
            | DebugJob::Generate { job, .. }
            | DebugJob::Resample { job, .. }
            | DebugJob::Save { job, .. }
            | DebugJob::Export { job, .. }
            | DebugJob::Open { job, .. }
            | DebugJob::ListCheckpoints { job } => *job,
        }
    }
}

// Jobs are told apart by their number: an effect list compares them without comparing models.
impl PartialEq for DebugJob {
    fn eq(&self, other: &Self) -> bool {
        self.id() == other.id()
    }
}

impl Eq for DebugJob {}

impl std::fmt::Debug for DebugJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self {
            DebugJob::LoadModel { spec, .. } => format!("load model {spec}"),
            DebugJob::Generate { seed, .. } => format!("generate (seed {seed})"),
            DebugJob::Resample { draws, .. } => format!("resample ×{draws}"),
            DebugJob::Save { .. } => "save".into(),
            DebugJob::Export { path, .. } => format!("export {}", path.display()),
            DebugJob::Open { run, step, .. } => format!("open {run} step {step}"),
            DebugJob::ListCheckpoints { .. } => "list checkpoints".into(),
        };
        write!(f, "DebugJob #{} {kind}", self.id())
    }
}

/// A job's outcome.
#[derive(Debug)]
pub enum DebugMsg {
    ModelLoaded {
        job: u64,
        result: Result<Box<ModelPolicy>, String>,
    },
    Generated {
        job: u64,
        result: Result<(String, ModelTurn), String>,
    },
    Resampled {
        job: u64,
        result: Result<Resample, String>,
    },
    Saved {
        job: u64,
        result: Result<(Saved, SaveTarget), String>,
    },
    Exported {
        job: u64,
        result: Result<String, String>,
    },
    Opened {
        job: u64,
        result: Result<Box<StoredEpisode>, String>,
    },
    /// Checkpoints to offer in the model input (none when the store cannot be read).
    Checkpoints { job: u64, specs: Vec<String> },
}

pub struct DebugView {
    pub session: Option<Session>,
    pub env: EnvConfig,
    pub policy: PolicyKind,
    pub model: Option<ModelPolicy>,
    /// The model asked for last (shown in the model input).
    pub model_spec: String,
    /// Sampling set by hand (`t`), kept over model loads; `None`: the model's own.
    pub sampling: Option<SamplingParams>,
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
    cancel: Arc<AtomicBool>,
    /// The last resample and the turn it drew.
    pub resample: Option<(usize, Resample)>,
    /// The next model turn's prompt (or why there is none), while a model is loaded.
    pub next_prompt: Option<Result<Prompt, String>>,
    pub error: Option<String>,
    pub notice: Option<String>,
    pub save_target: SaveTarget,
    /// Where the episode came from (`run q · step 3 · group 0 episode 1`).
    pub origin: Option<String>,
    /// The turn to open a stored episode at.
    opening_at: usize,
    draws_made: u64,
    next_job: u64,
    /// The model load under way (it may run beside the reading of a stored episode).
    pending_model: Option<u64>,
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
            sampling: None,
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
            opening_at: 0,
            draws_made: 0,
            next_job: 0,
            pending_model: None,
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
        view.opening_at = turn;
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
        };
        (view, open)
    }

    fn job(&mut self) -> u64 {
        self.next_job += 1;
        self.next_job
    }

    pub fn turns(&self) -> usize {
        self.session.as_ref().map_or(0, |s| s.turns.len())
    }

    /// The state changed: select the newest state and work out the next prompt again.
    fn changed(&mut self) {
        self.selected = self.turns();
        self.token = 0;
        self.scroll = 0;
        self.next_prompt = match (&self.model, &self.session) {
            (Some(m), Some(s)) if !s.done() => Some(m.prompt(s)),
            _ => None,
        };
    }

    fn fail(&mut self, e: impl ToString) {
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
            Action::MoveLeft => self.human("Left"),
            Action::MoveDown => self.human("Down"),
            Action::MoveRight => self.human("Right"),
            Action::MoveUp => self.human("Up"),
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
            Action::Undo => self.with_session(|s| match s.undo() {
                Ok(true) => Ok(None),
                Ok(false) => Ok(Some("nothing to undo".into())),
                Err(e) => Err(e.to_string()),
            }),
            Action::Fork => {
                let at = self.selected;
                self.with_session(|s| {
                    if at >= s.turns.len() {
                        return Ok(Some("select an earlier turn (j k) to fork at".into()));
                    }
                    s.fork(at).map_err(|e| e.to_string())?;
                    Ok(Some(format!(
                        "forked at turn {}: play it differently",
                        at + 1
                    )))
                })
            }
            Action::NewEpisode | Action::RestartEpisode => {
                let next = matches!(action, Action::NewEpisode);
                self.with_session(|s| {
                    let seed = if next { s.seed.wrapping_add(1) } else { s.seed };
                    s.reset(seed).map_err(|e| e.to_string())?;
                    Ok(Some(format!("episode from seed {seed}")))
                });
                self.resample = None;
                self.save_target = SaveTarget::NewRun;
                self.origin = None;
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
                    &super::debugger_input::sampling_text(&now, self.draws),
                ));
            }
            Action::ChooseEnv => {
                let seed = self.session.as_ref().map_or(0, |s| s.seed);
                self.input = Some(Input::new(
                    InputKind::Env,
                    &super::debugger_input::env_text(&self.env, seed),
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

    /// Apply `f` to the session, then show its notice or error.
    fn with_session(&mut self, f: impl FnOnce(&mut Session) -> Result<Option<String>, String>) {
        let Some(s) = self.session.as_mut() else {
            return self.fail("no episode: c chooses an environment");
        };
        match f(s) {
            Ok(notice) => self.notice = notice,
            Err(e) => self.error = Some(e),
        }
        self.changed();
    }

    fn human(&mut self, action: &str) {
        self.with_session(|s| {
            if !s.env().actions().iter().any(|a| a == action) && !s.env().actions().is_empty() {
                return Err(format!(
                    "'{action}' is not an action here (a picks from the env's actions; i types \
                     any output)"
                ));
            }
            s.take(action, Actor::Human).map_err(|e| e.to_string())?;
            Ok(None)
        });
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
            Action::Up => self.picker = Some(i.saturating_sub(1)),
            Action::Down => self.picker = Some((i + 1).min(actions.len().saturating_sub(1))),
            Action::Open => {
                self.picker = None;
                if let Some(a) = actions.get(i) {
                    let a = a.clone();
                    self.with_session(|s| {
                        s.take(&a, Actor::Human).map_err(|e| e.to_string())?;
                        Ok(None)
                    });
                }
            }
            Action::Back => self.picker = None,
            _ => {}
        }
        vec![]
    }

    fn effective_sampling(&self) -> SamplingParams {
        self.sampling
            .clone()
            .or_else(|| self.model.as_ref().map(|m| m.sampling.clone()))
            .unwrap_or_default()
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
            PolicyKind::Random => {
                let limit = self.env.max_turns;
                self.with_session(|s| {
                    loop {
                        if s.done() {
                            return Ok(None);
                        }
                        if to_end && s.turns.len() >= limit {
                            return Ok(Some(format!("stopped at max_turns ({limit})")));
                        }
                        let a = s.random_action().ok_or(
                            "this environment lists no actions to draw from: i types an output",
                        )?;
                        s.take(&a, Actor::Random).map_err(|e| e.to_string())?;
                        if !to_end {
                            return Ok(None);
                        }
                    }
                });
                vec![]
            }
            PolicyKind::Model => self.draw(to_end),
        }
    }

    fn draw(&mut self, to_end: bool) -> Vec<DebugJob> {
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
        let request = Box::new(SaveRequest::of(s));
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
            InputKind::Output => self.with_session(|s| {
                s.act(text, Actor::Human, None).map_err(|e| e.to_string())?;
                Ok(None)
            }),
            InputKind::Model => {
                let spec = text.trim().to_string();
                if spec.is_empty() {
                    return vec![];
                }
                self.model_spec = spec.clone();
                return vec![self.load_model(&spec)];
            }
            InputKind::Sampling => {
                match super::debugger_input::parse_sampling(&text, self.effective_sampling()) {
                    Ok((sampling, draws)) => {
                        if let Some(m) = self.model.as_mut() {
                            m.sampling = sampling.clone();
                        }
                        self.sampling = Some(sampling);
                        self.draws = draws;
                        self.changed();
                    }
                    Err(e) => self.fail(e),
                }
            }
            InputKind::Env => match super::debugger_input::parse_env(&text) {
                Ok((env, seed)) => {
                    let view = DebugView::new(env, seed);
                    match view.session {
                        Some(s) => {
                            self.session = Some(s);
                            self.env = view.env;
                            self.save_target = SaveTarget::NewRun;
                            self.origin = None;
                            self.resample = None;
                            self.changed();
                        }
                        None => self.error = view.error,
                    }
                }
                Err(e) => self.fail(e),
            },
        }
        vec![]
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

    fn answered(&mut self, job: u64) -> Option<Work> {
        match self.busy {
            Some((work, j)) if j == job => {
                self.busy = None;
                Some(work)
            }
            _ => None,
        }
    }

    /// A job's outcome; what to do next (the next turn of a run to the end).
    pub fn answer(&mut self, msg: DebugMsg) -> Vec<DebugJob> {
        match msg {
            DebugMsg::ModelLoaded { job, result } => {
                if self.pending_model != Some(job) {
                    return vec![];
                }
                self.pending_model = None;
                self.answered(job);
                match result {
                    Ok(mut m) => {
                        if let Some(s) = &self.sampling {
                            m.sampling = s.clone();
                        }
                        self.notice = Some(format!("model {} loaded", m.source));
                        self.model = Some(*m);
                        self.policy = PolicyKind::Model;
                        self.changed();
                    }
                    Err(e) => self.fail(format!("model '{}': {e}", self.model_spec)),
                }
            }
            DebugMsg::Generated { job, result } => {
                let Some(Work::Drawing { to_end }) = self.answered(job) else {
                    return vec![];
                };
                match result {
                    Ok((output, turn)) => {
                        self.with_session(|s| {
                            s.act(output, Actor::Model, Some(turn))
                                .map_err(|e| e.to_string())?;
                            Ok(None)
                        });
                        self.pane = Pane::Output;
                        self.selected = self.turns().saturating_sub(1);
                        let go_on = self
                            .session
                            .as_ref()
                            .is_some_and(|s| !s.done() && s.turns.len() < self.env.max_turns);
                        if to_end && go_on && self.error.is_none() {
                            return self.draw(true);
                        }
                    }
                    Err(e) if e == CANCELLED => self.notice = Some("cancelled".into()),
                    Err(e) => self.fail(e),
                }
            }
            DebugMsg::Resampled { job, result } => {
                if self.answered(job).is_none() {
                    return vec![];
                }
                match result {
                    Ok(r) => self.resample = Some((self.turns(), r)),
                    Err(e) if e == CANCELLED => self.notice = Some("cancelled".into()),
                    Err(e) => self.fail(e),
                }
            }
            DebugMsg::Saved { job, result } => {
                self.answered(job);
                match result {
                    Ok((saved, target)) => {
                        self.save_target = target;
                        self.notice = Some(format!(
                            "saved as episode {} of run '{}' step {} (debug)",
                            saved.episode, saved.run_name, saved.step
                        ));
                    }
                    Err(e) => self.fail(format!("saving: {e}")),
                }
            }
            DebugMsg::Checkpoints { job: _, specs } => {
                if let Some(input) = self.input.as_mut().filter(|i| i.kind == InputKind::Model) {
                    input.choice = specs.iter().position(|s| *s == input.text);
                    input.choices = specs;
                }
            }
            DebugMsg::Exported { job: _, result } => match result {
                Ok(done) => self.notice = Some(done),
                Err(e) => self.fail(e),
            },
            DebugMsg::Opened { job, result } => {
                if self.answered(job).is_none() {
                    return vec![];
                }
                match result
                    .and_then(|stored| session_at(&stored, self.opening_at).map(|s| (stored, s)))
                {
                    Ok((stored, s)) => {
                        let r = &stored.record;
                        self.origin = Some(format!(
                            "run {} · step {} · group {} episode {}",
                            stored.run.name, r.step, r.group, r.episode
                        ));
                        self.save_target = SaveTarget::Run {
                            run: stored.run.id,
                            step: r.step,
                            group: r.group,
                        };
                        if let Some(d) = &s.divergence {
                            self.error = Some(format!(
                                "the stored episode diverges at turn {}: replaying it from its \
                                 seed shows another observation (see Info)",
                                d.turn + 1
                            ));
                        }
                        self.env = stored.env.clone();
                        self.session = Some(s);
                        self.pane = Pane::Info;
                        let error = self.error.take();
                        self.changed();
                        self.error = error;
                    }
                    Err(e) => self.fail(e),
                }
            }
        }
        vec![]
    }
}

#[cfg(test)]
#[path = "debugger_tests.rs"]
mod tests;
