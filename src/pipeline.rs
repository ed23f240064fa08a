//! Pipelines as plain sequential code: SFT ([`sft`]) and RLVR ([`rlvr`]), run in-process for now
//! (the scheduler issue moves roles into worker processes behind the same calls).
//!
//! A pipeline reports progress only through [`Observer`] events and writes numbers only through a
//! [`MetricSink`]; it never prints. Front-ends (headless, TUI) subscribe to the events. A run can start
//! from a checkpoint ([`Resume`]): it then continues the stage the checkpoint belongs to from the next
//! step, with the same weights, optimizer moments, data cursor and RL state, so it computes the same
//! numbers an uninterrupted run would have.

mod rl_learner;
mod rl_metrics;
pub mod rl_update;
pub mod rlvr;
mod rollout_loop;
mod score_link;
pub mod setup;
pub mod sft;
mod time_sharing;
mod worker_report;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crate::config::{RunConfig, Stage, StageConfig};
use crate::data::mix::MixerState;
pub use crate::data::mix_seed;
use crate::metrics::{CheckpointRecord, MetricRecord, MetricSink, Metrics, SampleRecord};
use crate::model::LoadedModel;
use crate::role::RoleError;
use crate::role::critic::{CRITIC_FILE, CRITIC_OPTIMIZER_FILE, Critic};
use crate::train::checkpoint::{RlResumeState, TrainerState, save_checkpoint};

/// Something a front-end may want to show.
#[derive(Debug, Clone)]
pub enum PipelineEvent {
    StageStarted {
        stage: Stage,
        total_steps: usize,
        /// Steps already done (a resumed stage starts after them).
        done_steps: usize,
    },
    StepFinished {
        stage: Stage,
        step: usize,
        total_steps: usize,
        metrics: Metrics,
    },
    CheckpointSaved {
        path: PathBuf,
        step: usize,
        bytes: u64,
    },
    Message(String),
    /// A worker process started, logged, failed or exited (also recorded with the run).
    Worker(crate::metrics::WorkerNote),
    /// Time-sharing moved a role's state (also recorded with the run).
    Transfer(crate::scheduler::Transfer),
}

pub trait Observer {
    fn on_event(&mut self, event: &PipelineEvent);
}

/// An observer that ignores everything (tests, library use).
pub struct Silent;

impl Observer for Silent {
    fn on_event(&mut self, _: &PipelineEvent) {}
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Finished,
    /// Stopped on request (Ctrl-C) after writing a checkpoint.
    Interrupted,
}

#[derive(Debug)]
pub struct RunOutcome {
    pub status: RunStatus,
    pub output_dir: PathBuf,
    /// The last checkpoint written (a loadable HF directory).
    pub last_checkpoint: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Load(#[from] crate::model::LoadError),
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    #[error(transparent)]
    Sink(#[from] crate::metrics::SinkError),
    #[error("{0}")]
    Setup(String),
    /// A worker that cannot be replaced without changing the run (actor_train) is gone.
    #[error("{0}")]
    WorkerLost(String),
    #[error("tensor computation failed in {stage}: {source}")]
    Tensor {
        stage: &'static str,
        #[source]
        source: candle_core::Error,
    },
}

/// A role's failure is the pipeline's, variant by variant (a lost worker stays a lost worker).
impl From<RoleError> for PipelineError {
    fn from(e: RoleError) -> PipelineError {
        match e {
            RoleError::Load(e) => PipelineError::Load(e),
            RoleError::Setup(why) => PipelineError::Setup(why),
            RoleError::WorkerLost(why) => PipelineError::WorkerLost(why),
            RoleError::Tensor { stage, source } => PipelineError::Tensor { stage, source },
        }
    }
}

pub(crate) trait TensorContext<T> {
    fn during(self, stage: &'static str) -> Result<T, PipelineError>;
}

impl<T> TensorContext<T> for candle_core::Result<T> {
    fn during(self, stage: &'static str) -> Result<T, PipelineError> {
        self.map_err(|source| PipelineError::Tensor { stage, source })
    }
}

/// Where a resumed run starts: a checkpoint directory and its trainer state.
#[derive(Debug, Clone)]
pub struct Resume {
    pub dir: PathBuf,
    pub state: TrainerState,
}

impl Resume {
    /// Read `trainer_state.json` of checkpoint `dir` and check it belongs to `cfg` and can be resumed.
    pub fn load(dir: &std::path::Path, cfg: &RunConfig) -> Result<Resume, PipelineError> {
        let (state, _) =
            crate::train::checkpoint::load_trainer_state(dir, &candle_core::Device::Cpu)?;
        let bad =
            |why: String| PipelineError::Setup(format!("checkpoint '{}': {why}", dir.display()));
        if state.config_hash != cfg.hash() {
            return Err(bad(format!(
                "it belongs to config {} but the run's config is {}",
                state.config_hash,
                cfg.hash()
            )));
        }
        if state.mixer.is_none() {
            return Err(bad("it has no data cursor (written by an older roll-tui); it cannot be resumed exactly".into()));
        }
        if state.stage == Stage::Rl.as_str() && state.rl.is_none() {
            return Err(bad(
                "it has no RL state (KL controller, reward statistics)".into()
            ));
        }
        Ok(Resume {
            dir: dir.to_path_buf(),
            state,
        })
    }

    /// Check, before anything is changed, that this resume can set up: the data still matches the
    /// checkpoint's cursor, the RL stage's KL reference loads, and a critic's files are there.
    pub fn check_setup(&self, cfg: &RunConfig, model: &LoadedModel) -> Result<(), PipelineError> {
        let data = setup::load_domains(cfg, model)?;
        if let Some(m) = &self.state.mixer {
            data.mixer(0)?.restore(m)?;
        }
        let Some(rl) = cfg
            .rl
            .as_ref()
            .filter(|_| self.state.stage == Stage::Rl.as_str())
        else {
            return Ok(());
        };
        if rl.kl.mode != crate::algo::kl::KlMode::None {
            setup::rl_start_policy(cfg)?;
            let refreshed = rl.kl.refresh_every > 0 && self.state.step >= rl.kl.refresh_every;
            if refreshed && !self.dir.join(REFERENCE_FILE).is_file() {
                return Err(PipelineError::Setup(format!(
                    "checkpoint '{}': the refreshed KL reference '{REFERENCE_FILE}' is missing",
                    self.dir.display()
                )));
            }
        }
        if rl.critic.is_some() && crate::role::rows::needs_critic(rl.adv_estimator) {
            for f in [CRITIC_FILE, CRITIC_OPTIMIZER_FILE] {
                if !self.dir.join(f).is_file() {
                    return Err(PipelineError::Setup(format!(
                        "checkpoint '{}': the critic file '{f}' is missing",
                        self.dir.display()
                    )));
                }
            }
        }
        Ok(())
    }

    /// The state when resuming `stage`, `None` when the resume point is in another stage.
    pub fn for_stage(resume: Option<&Resume>, stage: Stage) -> Option<Resume> {
        resume.filter(|r| r.state.stage == stage.as_str()).cloned()
    }
}

/// A checkpoint's KL reference, once `rl.kl.refresh_every` has replaced the starting policy.
pub const REFERENCE_FILE: &str = "reference.safetensors";

/// What a stage adds to its checkpoints besides the policy and its optimizer.
pub struct CheckpointExtras<'a> {
    pub mixer: MixerState,
    pub rl: Option<RlResumeState>,
    pub critic: Option<&'a Critic>,
    /// The KL reference, when it is no longer the stage's starting policy (`rl.kl.refresh_every`).
    pub reference: Option<&'a crate::role::reference::Reference>,
}

/// What every stage shares: config, output, the observer, the sink and the stop flag.
pub struct RunContext<'a> {
    pub cfg: &'a RunConfig,
    pub output_dir: PathBuf,
    pub observer: &'a mut dyn Observer,
    pub sink: &'a mut dyn MetricSink,
    pub stop: Arc<AtomicBool>,
    pub started: Instant,
    /// Wall time already spent before this process (a resumed run continues its clock).
    pub wall_offset: f64,
}

impl RunContext<'_> {
    /// Seconds since the run started, across resumes.
    pub fn wall_time(&self) -> f64 {
        self.wall_offset + self.started.elapsed().as_secs_f64()
    }

    /// A notice for the user that is also kept with the run.
    pub fn warn(&mut self, text: String) -> Result<(), PipelineError> {
        self.sink.message(&text)?;
        self.emit(PipelineEvent::Message(text));
        Ok(())
    }

    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub fn emit(&mut self, event: PipelineEvent) {
        self.observer.on_event(&event);
    }

    pub fn record_step(
        &mut self,
        stage: Stage,
        step: usize,
        total: usize,
        metrics: Metrics,
    ) -> Result<(), PipelineError> {
        let record = MetricRecord {
            stage,
            step,
            wall_time: self.wall_time(),
            metrics,
        };
        self.sink.record(&record)?;
        self.emit(PipelineEvent::StepFinished {
            stage,
            step,
            total_steps: total,
            metrics: record.metrics,
        });
        Ok(())
    }

    pub fn record_samples(&mut self, samples: &[SampleRecord]) -> Result<(), PipelineError> {
        self.sink.samples(samples)?;
        Ok(())
    }

    /// After step `step` of `total`: checkpoint when the stage ends, every `checkpoint.every` steps,
    /// or when a stop was requested. Returns true when the stage must stop now.
    pub fn after_step<'a2>(
        &mut self,
        model: &LoadedModel,
        opt: &dyn crate::train::checkpoint::OptimizerState,
        stage: Stage,
        (step, total): (usize, usize),
        last: &mut Option<PathBuf>,
        extras: impl FnOnce() -> CheckpointExtras<'a2>,
    ) -> Result<bool, PipelineError> {
        let every = self.cfg.checkpoint.every;
        let stop = self.stop_requested();
        if stop || step == total || (every > 0 && step % every == 0) {
            *last = Some(self.checkpoint(model, opt, stage, step, extras())?);
        }
        // A stop requested during the run's very last step changes nothing: the run is complete.
        Ok(stop && !(step == total && self.cfg.last_stage() == Some(stage)))
    }

    /// Write `checkpoints/<stage>-step<N>` and report it.
    pub fn checkpoint(
        &mut self,
        model: &LoadedModel,
        opt: &dyn crate::train::checkpoint::OptimizerState,
        stage: Stage,
        step: usize,
        extras: CheckpointExtras<'_>,
    ) -> Result<PathBuf, PipelineError> {
        let dir = checkpoint_dir(&self.output_dir, stage, step);
        let state = TrainerState {
            stage: stage.as_str().into(),
            step,
            seed: self.cfg.seed,
            config_hash: self.cfg.hash(),
            optimizer_steps: opt.steps_taken(),
            wall_time: self.wall_time(),
            mixer: Some(extras.mixer),
            rl: extras.rl,
        };
        let (critic, reference) = (extras.critic, extras.reference);
        let write_critic = |dir: &std::path::Path| -> Result<(), crate::model::LoadError> {
            if let Some(c) = critic {
                c.save(dir)?;
            }
            if let Some(r) = reference {
                r.save(&dir.join(REFERENCE_FILE))?;
            }
            Ok(())
        };
        let bytes = save_checkpoint(&dir, model, opt, &state, Some(&write_critic))?;
        // Metrics up to this step first, then the checkpoint row: the store never points at a
        // checkpoint whose steps it has not recorded.
        self.sink.flush()?;
        self.sink.checkpoint(&CheckpointRecord {
            stage: stage.as_str().into(),
            step,
            path: dir.clone(),
            bytes,
        })?;
        self.emit(PipelineEvent::CheckpointSaved {
            path: dir.clone(),
            step,
            bytes,
        });
        Ok(dir)
    }
}

/// `checkpoints/<stage>-step<N>` under a run's output directory.
pub fn checkpoint_dir(output_dir: &std::path::Path, stage: Stage, step: usize) -> PathBuf {
    output_dir
        .join("checkpoints")
        .join(format!("{stage}-step{step}"))
}

/// Run every stage of `cfg` (SFT, then RL) in this process, writing results to `sink`; with `resume`,
/// continue from that checkpoint instead of starting over. A new run's output directory must have
/// been prepared ([`prepare_output_dir`]).
pub fn run(
    cfg: &RunConfig,
    observer: &mut dyn Observer,
    stop: Arc<AtomicBool>,
    sink: &mut dyn MetricSink,
    resume: Option<&Resume>,
) -> Result<RunOutcome, PipelineError> {
    let output_dir = cfg.output_dir();
    if resume.is_none() {
        std::fs::create_dir_all(&output_dir).map_err(|e| {
            PipelineError::Setup(format!("output directory '{}': {e}", output_dir.display()))
        })?;
        let resolved = output_dir.join("resolved_config.json");
        let text =
            serde_json::to_string_pretty(cfg).map_err(|e| PipelineError::Setup(e.to_string()))?;
        std::fs::write(&resolved, text)
            .map_err(|e| PipelineError::Setup(format!("'{}': {e}", resolved.display())))?;
    }
    let mut ctx = RunContext {
        cfg,
        output_dir: output_dir.clone(),
        observer,
        sink,
        stop,
        started: Instant::now(),
        wall_offset: resume.map(|r| r.state.wall_time).unwrap_or(0.0),
    };
    let model = match resume {
        Some(r) => setup::load_checkpoint_policy(cfg, &r.dir)?,
        None => setup::load_policy(cfg)?,
    };
    let data = setup::load_domains(cfg, &model)?;
    // Refuse a placement that cannot fit before any stage spends time.
    rlvr::placement_for(cfg, &model)?;
    let mut last_checkpoint = resume.map(|r| r.dir.clone());
    let stages = cfg.stages();
    // A resume continues its checkpoint's stage; the stages before it are done.
    let first = match resume {
        None => 0,
        Some(r) => stages
            .iter()
            .position(|s| s.stage().as_str() == r.state.stage)
            .ok_or_else(|| {
                PipelineError::Setup(format!(
                    "checkpoint '{}' belongs to stage '{}', which this run does not have",
                    r.dir.display(),
                    r.state.stage
                ))
            })?,
    };
    for stage in &stages[first..] {
        let from = Resume::for_stage(resume, stage.stage());
        let (status, ckpt) = match *stage {
            StageConfig::Sft(c) => sft::run_sft(&mut ctx, c, &model, &data, from.as_ref())?,
            StageConfig::Rl(c) => rlvr::run_rlvr(&mut ctx, c, &model, &data, from.as_ref())?,
        };
        last_checkpoint = ckpt.or(last_checkpoint);
        if status == RunStatus::Interrupted {
            return Ok(RunOutcome {
                status,
                output_dir,
                last_checkpoint,
            });
        }
    }
    ctx.sink.flush()?;
    Ok(RunOutcome {
        status: RunStatus::Finished,
        output_dir,
        last_checkpoint,
    })
}

/// What a run writes into its output directory (and what `overwrite` removes).
const RUN_FILES: [&str; 2] = ["resolved_config.json", "checkpoints"];

/// Create `dir` for a new run. A directory that already holds a run's results is refused unless
/// `overwrite` is set, in which case only the files a run writes are removed — never anything else.
pub fn prepare_output_dir(dir: &std::path::Path, overwrite: bool) -> Result<(), PipelineError> {
    let io = |e: std::io::Error| {
        PipelineError::Setup(format!("output directory '{}': {e}", dir.display()))
    };
    let existing: Vec<&str> = RUN_FILES
        .iter()
        .copied()
        .filter(|f| dir.join(f).exists())
        .collect();
    if !existing.is_empty() {
        if !overwrite {
            return Err(PipelineError::Setup(format!(
                "output directory '{}' already holds a run ({}); pass --overwrite to replace it, or set \
                 another 'name' or 'output_dir'",
                dir.display(),
                existing.join(", ")
            )));
        }
        for f in existing {
            let path = dir.join(f);
            if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            }
            .map_err(io)?;
        }
    }
    std::fs::create_dir_all(dir).map_err(io)
}
