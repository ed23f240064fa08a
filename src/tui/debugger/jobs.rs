//! The debugger's work for the runtime ([`DebugJob`]) and its answers ([`DebugMsg`]), and how the
//! view takes an answer in: a model loaded, a turn drawn (the next one of a run to the end), a
//! resample, a save, a stored episode opened, a program-backed step done.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::config::EnvConfig;
use crate::debugger::Session;
use crate::debugger::open::{StoredEpisode, session};
use crate::debugger::policy::{CANCELLED, ModelTurn, Prompt};
use crate::debugger::record::{SaveRequest, SaveTarget, Saved};
use crate::debugger::{ModelPolicy, Resample};
use crate::env::ActionParser;
use crate::tui::debugger::input::InputKind;
use crate::tui::debugger::ops::{SessionCell, SessionOp};
use crate::tui::debugger::{DebugView, Pane, PolicyKind};

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
    /// A program-backed environment is stepping (it cannot be interrupted; its `step_timeout`
    /// bounds the wait).
    Stepping,
    /// A newly chosen environment is starting.
    Starting,
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
        /// The turn to open it at (0-based: before that turn).
        at: usize,
    },
    /// A fresh episode of `env` from `seed`.
    StartEnv {
        job: u64,
        env: Box<EnvConfig>,
        seed: u64,
    },
    /// Every checkpoint in the store, as `RUN@STEP`, newest run first.
    ListCheckpoints { job: u64 },
    /// Change the episode of a program-backed env, which waits in `cell` meanwhile.
    Step {
        job: u64,
        cell: SessionCell,
        op: SessionOp,
    },
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
            | DebugJob::ListCheckpoints { job }
            | DebugJob::Step { job, .. }
            | DebugJob::StartEnv { job, .. } => *job,
        }
    }

    /// The answer of a job that is computation only (drawing, resampling, a program-backed step,
    /// starting an env), worked out on this thread: the runtime calls it on a blocking thread,
    /// the tests directly. `Err` gives back a job that needs the store or files.
    pub fn compute(self) -> Result<DebugMsg, Box<DebugJob>> {
        Ok(match self {
            DebugJob::Generate {
                job,
                policy,
                prompt,
                seed,
                cancel,
            } => DebugMsg::Generated {
                job,
                result: policy.generate(&prompt, seed, Some(&cancel)),
            },
            DebugJob::Resample {
                job,
                policy,
                prompt,
                draws,
                seed,
                parser,
                actions,
                cancel,
            } => DebugMsg::Resampled {
                job,
                result: policy.resample(&prompt, draws, seed, &parser, &actions, Some(&cancel)),
            },
            DebugJob::Step { job, cell, op } => DebugMsg::Stepped {
                job,
                result: cell.apply(op),
            },
            DebugJob::StartEnv { job, env, seed } => DebugMsg::EnvStarted {
                job,
                result: session(&env, seed).map(Box::new),
                env,
            },
            other => return Err(Box::new(other)),
        })
    }

    /// The answer saying this job's work failed with `error` (it panicked, or never ran).
    pub fn failed(self, error: String) -> DebugMsg {
        match self {
            DebugJob::LoadModel { job, .. } => DebugMsg::ModelLoaded {
                job,
                result: Err(error),
            },
            DebugJob::Generate { job, .. } => DebugMsg::Generated {
                job,
                result: Err(error),
            },
            DebugJob::Resample { job, .. } => DebugMsg::Resampled {
                job,
                result: Err(error),
            },
            DebugJob::Save { job, .. } => DebugMsg::Saved {
                job,
                result: Err(error),
            },
            DebugJob::Export { job, .. } => DebugMsg::Exported {
                job,
                result: Err(error),
            },
            DebugJob::Open { job, .. } => DebugMsg::Opened {
                job,
                result: Err(error),
            },
            DebugJob::ListCheckpoints { job } => DebugMsg::Checkpoints { job, specs: vec![] },
            DebugJob::Step { job, .. } => DebugMsg::Stepped {
                job,
                result: Err(error),
            },
            DebugJob::StartEnv { job, env, .. } => DebugMsg::EnvStarted {
                job,
                env,
                result: Err(error),
            },
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
            DebugJob::Step { op, .. } => format!("step {op:?}"),
            DebugJob::StartEnv { env, seed, .. } => format!("start {} seed {seed}", env.name),
        };
        write!(f, "DebugJob #{} {kind}", self.id())
    }
}

/// A stored episode and the session rebuilt from it (off the screen's thread: an external env
/// replays through its program).
#[derive(Debug)]
pub struct OpenedEpisode {
    pub stored: StoredEpisode,
    pub session: Session,
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
        result: Result<Box<OpenedEpisode>, String>,
    },
    EnvStarted {
        job: u64,
        env: Box<EnvConfig>,
        result: Result<Box<Session>, String>,
    },
    /// Checkpoints to offer in the model input (none when the store cannot be read).
    Checkpoints { job: u64, specs: Vec<String> },
    /// The episode was changed in its cell (see [`DebugJob::Step`]).
    Stepped {
        job: u64,
        result: Result<Option<String>, String>,
    },
}

impl DebugView {
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
                        self.overrides.apply(&mut m.sampling);
                        // A model of a run of this env plays it with the run's settings (its
                        // action pattern, penalty, turns, instruction), as `--model` does.
                        let before = self.env.clone();
                        let adopted = self.adopt_run_env(&m);
                        // The env may have changed while the model loaded.
                        match m.for_env(&self.env) {
                            Ok(()) => {
                                self.notice = Some(model_notice(&m, &self.env));
                                self.model = Some(*m);
                                self.policy = PolicyKind::Model;
                                self.changed();
                                if adopted {
                                    return self.restart_with_run_env();
                                }
                            }
                            Err(e) => {
                                // Not this model's env after all: the settings stay as they were.
                                self.env = before;
                                self.fail(format!("model '{}': {e}", self.model_spec));
                                self.changed();
                            }
                        }
                    }
                    Err(e) => self.fail(format!("model '{}': {e}", self.model_spec)),
                }
            }
            DebugMsg::Generated { job, result } => {
                let Some(Work::Drawing { to_end }) = self.answered(job) else {
                    return vec![];
                };
                // Esc after the last decode step: the turn is dropped, not played.
                if self.cancel.load(Ordering::Relaxed) {
                    self.notice = Some("cancelled".into());
                    return vec![];
                }
                match result {
                    Ok((output, turn)) => {
                        self.pane = Pane::Output;
                        self.to_end = to_end;
                        return self.session_op(SessionOp::Model(output, Box::new(turn)));
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
            DebugMsg::Stepped { job, result } => {
                let Some(cell) = self.away.take() else {
                    return vec![];
                };
                self.session = cell.take();
                self.answered(job);
                if self.session.is_none() {
                    self.fail("internal: the episode did not come back from its step");
                    return vec![];
                }
                return self.applied(result);
            }
            DebugMsg::Checkpoints { job: _, specs } => {
                if let Some(input) = self.input.as_mut().filter(|i| i.kind == InputKind::Model) {
                    input.choice = specs.iter().position(|s| *s == input.text);
                    // Nothing typed yet: the newest RL policy (else the newest checkpoint) is
                    // picked, so Enter loads it.
                    if input.text.is_empty() && !specs.is_empty() {
                        let pick = specs.iter().position(|s| s.contains("@rl-")).unwrap_or(0);
                        input.choice = Some(pick);
                        input.text = specs[pick].clone();
                    }
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
                match result {
                    Ok(opened) => self.opened(*opened),
                    Err(e) => self.fail(e),
                }
            }
            DebugMsg::EnvStarted { job, env, result } => {
                if self.answered(job).is_none() {
                    return vec![];
                }
                match result {
                    Ok(s) => {
                        self.session = Some(*s);
                        self.env = *env;
                        self.save_target = SaveTarget::NewRun;
                        self.origin = None;
                        self.resample = None;
                        self.unsaved = false;
                        self.reprompt();
                        self.changed();
                    }
                    Err(e) => self.fail(e),
                }
            }
        }
        vec![]
    }

    /// A stored episode rebuilt: it becomes the session, saved beside its run's episodes; the
    /// model input offers the checkpoint of the policy that played it.
    fn opened(&mut self, opened: OpenedEpisode) {
        let OpenedEpisode { stored, session } = opened;
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
        self.model_spec = stored.played_by();
        self.env = stored.env.clone();
        let divergence = session.divergence.as_ref().map(|d| d.turn + 1);
        self.session = Some(session);
        self.pane = Pane::Info;
        self.unsaved = false;
        self.reprompt();
        self.changed();
        if let Some(turn) = divergence {
            self.error = Some(format!(
                "the stored episode diverges at turn {turn}: replaying it from its seed shows \
                 another observation (see Info)"
            ));
        }
    }

    /// Take `m`'s run's settings for the env debugged (keeping the parameters chosen here, or
    /// the run's when none were): whether they differ from the settings in use.
    fn adopt_run_env(&mut self, m: &ModelPolicy) -> bool {
        let Some(run) = m.run_env.as_ref().filter(|r| r.name == self.env.name) else {
            return false;
        };
        let mut env = run.clone();
        if !self.env.params.is_empty() {
            env.params = self.env.params.clone();
        }
        if env == self.env {
            return false;
        }
        self.env = env;
        true
    }

    /// The episode from its seed again, under the settings just adopted, when no turn of it is
    /// played yet; otherwise they wait for the next episode started with `c`, and a notice says so.
    fn restart_with_run_env(&mut self) -> Vec<DebugJob> {
        let Some(s) = &self.session else {
            return vec![];
        };
        if !s.turns.is_empty() {
            let later = format!(
                "its run's settings for '{}' apply to the next episode (c, Enter)",
                self.env.name
            );
            self.notice = Some(match self.notice.take() {
                Some(notice) => format!("{notice}; {later}"),
                None => later,
            });
            return vec![];
        }
        let seed = s.seed;
        let job = self.job();
        self.busy = Some((Work::Starting, job));
        vec![DebugJob::StartEnv {
            job,
            env: Box::new(self.env.clone()),
            seed,
        }]
    }

    /// The loaded model prompts for the env now debugged.
    fn reprompt(&mut self) {
        let env = self.env.clone();
        if let Some(Err(e)) = self.model.as_mut().map(|m| m.for_env(&env)) {
            self.fail(format!("the model cannot prompt for '{}': {e}", env.name));
        }
    }
}

/// What a loaded model is, and a warning when it was trained on another env.
fn model_notice(m: &ModelPolicy, env: &EnvConfig) -> String {
    match &m.run_env {
        Some(run) if run.name != env.name => format!(
            "model {} loaded; it was trained on '{}', not '{}'",
            m.source, run.name, env.name
        ),
        Some(_) => format!(
            "model {} loaded, playing '{}' with its run's settings",
            m.source, env.name
        ),
        None => format!("model {} loaded", m.source),
    }
}
