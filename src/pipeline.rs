//! Pipelines as plain sequential code over role handles (`crate::role`): a run is the ordered list
//! of its stages ([`run`] loops over `RunConfig::stages`), each stage a module — SFT ([`sft`]),
//! DPO ([`dpo`]), RLVR ([`rlvr`]) and agentic RL ([`agentic`]). Every stage that changes the
//! policy's weights trains through actor_train (`role::actor_train`) with its own recipe. Whether a role runs here or in a worker process is the role's business.
//!
//! A pipeline reports progress only through [`Observer`] events and writes numbers only through a
//! [`MetricSink`]; it never prints. Front-ends (headless, TUI) subscribe to the events. A run can start
//! from a checkpoint ([`Resume`]): it then continues the stage the checkpoint belongs to from the next
//! step, with the same weights, optimizer moments, data cursor and RL state, so it computes the same
//! numbers an uninterrupted run would have.

pub mod agentic;
mod ahead;
mod context;
pub mod distill;
pub mod dpo;
pub mod evaluate;
pub mod opd;
mod resume;
pub mod rl_eval;
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
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use crate::config::{RunConfig, Stage, StageConfig};
pub use crate::data::mix_seed;
use crate::metrics::{MetricSink, Metrics};
pub use context::{CheckpointExtras, REFERENCE_FILE, RunContext, checkpoint_dir};
pub use resume::Resume;

/// Something a front-end may want to show.
#[derive(Debug, Clone)]
pub enum PipelineEvent {
    /// The run got past its setup (model, data, placement): what it is about to do.
    Started {
        /// The policy: its architecture (`qwen2`), where it came from, its parameters.
        model_type: String,
        source: String,
        parameters: usize,
        /// Trainable parameters when fewer than all (a LoRA adapter's).
        trainable: Option<usize>,
        device: String,
        /// Each stage with its steps, in order (a resumed run lists only what is left).
        stages: Vec<(Stage, usize)>,
        output_dir: PathBuf,
    },
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
    /// A stored run goes on from its checkpoint at `step` of `stage`; the `recomputed` metric
    /// points it had recorded after that checkpoint were dropped, to be recorded again.
    Resumed {
        run: String,
        stage: String,
        step: usize,
        recomputed: u64,
    },
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

pub use crate::role::RunError;
pub(crate) use crate::role::TensorContext;

/// Run every stage of `cfg` (SFT, then RL) in this process, writing results to `sink`; with `resume`,
/// continue from that checkpoint instead of starting over. A new run's output directory must have
/// been prepared ([`prepare_output_dir`]).
pub fn run(
    cfg: &RunConfig,
    observer: &mut dyn Observer,
    stop: Arc<AtomicBool>,
    sink: &mut dyn MetricSink,
    resume: Option<&Resume>,
) -> Result<RunOutcome, RunError> {
    let output_dir = cfg.output_dir();
    let mut ctx = RunContext {
        cfg,
        output_dir: output_dir.clone(),
        observer,
        sink,
        stop,
        started: Instant::now(),
        last_checkpoint_at: Instant::now(),
        timed_checkpoint: None,
        wall_offset: resume.map(|r| r.state.wall_time).unwrap_or(0.0),
    };
    // The workers this run starts reach it over TCP with the run's secret, or over Unix sockets;
    // what they read and write goes where every one of them sees it.
    let shared = cfg.cluster.as_ref().and_then(|c| c.shared_dir.clone());
    if let Some(dir) = &shared {
        std::fs::create_dir_all(dir)
            .map_err(|e| RunError::Setup(format!("cluster.shared_dir '{}': {e}", dir.display())))?;
    }
    crate::scheduler::host_copy::set_area_base(shared);
    crate::worker::process::set_transport(match &cfg.cluster {
        Some(c) => crate::worker::process::Transport::Tcp {
            listen: c.listen,
            secret: crate::worker::auth::run_secret().clone(),
            launch: setup::launch_of(c)?,
        },
        None => crate::worker::process::Transport::Unix,
    });
    // Before the first model: a run asking for the generic path gets it in every process
    // (worker processes inherit it); `ROLL_KERNELS=generic` already chose it for this one.
    if cfg.workers.devices.kernels == crate::config::Kernels::Generic {
        crate::device::use_kernels(crate::config::Kernels::Generic);
    }
    let model = match resume {
        Some(r) => setup::load_checkpoint_policy(cfg, &r.dir)?,
        None => setup::load_policy(cfg)?,
    };
    let data = setup::load_domains(cfg, &model)?;
    // Refuse a placement that cannot fit before any stage spends time.
    rlvr::placement_for(cfg, &model, &data.judge_models())?;
    distill::placement_for(cfg, &model)?;
    // Only a run that got past its setup marks the directory as holding a run: one refused for a
    // bad dataset or model must not block rerunning it once that is fixed.
    if resume.is_none() {
        std::fs::create_dir_all(&output_dir).map_err(|e| {
            RunError::Setup(format!("output directory '{}': {e}", output_dir.display()))
        })?;
        let resolved = output_dir.join("resolved_config.json");
        let text = serde_json::to_string_pretty(cfg).map_err(|e| RunError::Setup(e.to_string()))?;
        std::fs::write(&resolved, text)
            .map_err(|e| RunError::Setup(format!("'{}': {e}", resolved.display())))?;
    }
    let mut last_checkpoint = resume.map(|r| r.dir.clone());
    let stages = cfg.stages();
    // A resume continues its checkpoint's stage; the stages before it are done.
    let first = match resume {
        None => 0,
        Some(r) => stages
            .iter()
            .position(|s| s.stage().as_str() == r.state.stage)
            .ok_or_else(|| {
                RunError::Setup(format!(
                    "checkpoint '{}' belongs to stage '{}', which this run does not have",
                    r.dir.display(),
                    r.state.stage
                ))
            })?,
    };
    ctx.emit(started_event(
        cfg,
        &model,
        &stages[first..],
        resume,
        &output_dir,
    ));
    for stage in &stages[first..] {
        let from = Resume::for_stage(resume, stage.stage());
        let (status, ckpt) = match *stage {
            StageConfig::Sft(c) => sft::run_sft(&mut ctx, c, &model, &data, from.as_ref())?,
            StageConfig::Distill(c) => {
                distill::run_distill(&mut ctx, c, &model, &data, from.as_ref())?
            }
            StageConfig::Dpo(c) => {
                dpo::run_dpo(&mut ctx, c, &model, cfg.data.chat_template, from.as_ref())?
            }
            StageConfig::Rl(c) => match &c.env {
                Some(env) => agentic::run_agentic(
                    &mut ctx,
                    c,
                    env,
                    &model,
                    cfg.data.chat_template,
                    from.as_ref(),
                )?,
                None => rlvr::run_rlvr(&mut ctx, c, &model, &data, from.as_ref())?,
            },
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

/// [`PipelineEvent::Started`] for `cfg`'s policy and the stages it has `left` (from the resumed
/// one, if any, whose steps before the checkpoint are done).
fn started_event(
    cfg: &RunConfig,
    model: &crate::model::LoadedModel,
    left: &[StageConfig<'_>],
    resume: Option<&Resume>,
    output_dir: &std::path::Path,
) -> PipelineEvent {
    let source = match (&cfg.model.path, resume) {
        (_, Some(r)) => format!("checkpoint '{}'", r.dir.display()),
        (Some(path), None) => format!("'{}'", path.display()),
        (None, None) => format!("random init, seed {}", cfg.seed),
    };
    let transformer = &model.transformer;
    let trainable = transformer.lora().map(|_| {
        let vars = transformer.trainable_vars();
        vars.iter().map(|(_, v)| v.elem_count()).sum()
    });
    let done = resume.map_or(0, |r| r.state.step);
    let stages = left
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let steps = cfg.steps_of(s.stage());
            (
                s.stage(),
                if i == 0 {
                    steps.saturating_sub(done)
                } else {
                    steps
                },
            )
        })
        .collect();
    PipelineEvent::Started {
        model_type: model.config().arch.model_type().to_string(),
        source,
        parameters: transformer.params().num_params(),
        trainable,
        device: crate::device::spec_of(transformer.device()).to_string(),
        stages,
        output_dir: output_dir.to_path_buf(),
    }
}

/// What a run writes into its output directory (and what `overwrite` removes).
const RUN_FILES: [&str; 2] = ["resolved_config.json", "checkpoints"];

/// The file in a run's output directory that its process holds locked while it runs.
pub const OUTPUT_LOCK: &str = ".roll-tui.lock";

/// Lock `dir` (created if missing) for this process's run, until the returned file is dropped or
/// the process ends (the OS releases the lock even after kill -9). A directory a live run holds
/// is refused, naming its process: `--overwrite` must never delete a running run's files, even
/// one of another name or store.
pub fn lock_output_dir(dir: &std::path::Path) -> Result<std::fs::File, RunError> {
    let io =
        |e: std::io::Error| RunError::Setup(format!("output directory '{}': {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(io)?;
    let path = dir.join(OUTPUT_LOCK);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            return Err(RunError::Setup(format!(
                "output directory '{}' is in use by a running run ({}); stop it first, or set \
                 another 'output_dir'",
                dir.display(),
                crate::text::clean(holder.trim(), 200, false)
            )));
        }
        // A filesystem without locks (some network mounts) cannot hold it: the run goes on
        // unguarded rather than not at all.
        Err(std::fs::TryLockError::Error(e)) if e.kind() == std::io::ErrorKind::Unsupported => {}
        Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
    }
    use std::io::Write as _;
    file.set_len(0).map_err(io)?;
    write!(
        file,
        "pid {} on {}",
        std::process::id(),
        crate::store::liveness::ProcessIdentity::current().host
    )
    .map_err(io)?;
    Ok(file)
}

/// Create `dir` for a new run. A directory that already holds a run's results is refused unless
/// `overwrite` is set, in which case only the files a run writes are removed — never anything else.
pub fn prepare_output_dir(dir: &std::path::Path, overwrite: bool) -> Result<(), RunError> {
    let io =
        |e: std::io::Error| RunError::Setup(format!("output directory '{}': {e}", dir.display()));
    let existing: Vec<&str> = RUN_FILES
        .iter()
        .copied()
        .filter(|f| dir.join(f).exists())
        .collect();
    if !existing.is_empty() {
        if !overwrite {
            return Err(RunError::Setup(format!(
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
