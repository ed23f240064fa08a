//! Starting and resuming recorded runs: open the store, register (or take over) the run, run the
//! pipeline on this thread with a [`StoreSink`], and record how it ended. The headless front-end
//! calls this (the workbench starts `roll-tui run` processes); it prints nothing.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::config::RunConfig;
use crate::pipeline::{self, Observer, Resume, RunError, RunOutcome, RunStatus};
use crate::store::liveness::ProcessIdentity;
use crate::store::{
    EventKind, EventRecord, NewRun, OpenMode, RunId, RunInfo, Store, StoreError, StoreSink,
    WriterHandle,
};

/// Exit status of a run stopped by Ctrl-C (128 + SIGINT, the shell convention).
pub const EXIT_INTERRUPTED: i32 = 130;

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Pipeline(#[from] RunError),
    #[error("{0}")]
    Refused(String),
    #[error("starting the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// What to run.
pub enum Start {
    New {
        cfg: Box<RunConfig>,
        overwrite: bool,
    },
    /// Continue a stored run (by name or id) from its last checkpoint.
    Resume { run: String },
}

/// How a recorded run went.
pub struct Recorded {
    pub run: RunId,
    pub name: String,
    pub outcome: RunOutcome,
    /// Where the run continued from, for a resume: (stage, step, metric points dropped).
    pub resumed_from: Option<(String, usize, u64)>,
}

/// Run `start` in this process and record it in the store at `store_path`.
pub fn run_recorded(
    store_path: &Path,
    start: Start,
    observer: &mut dyn Observer,
    stop: Arc<AtomicBool>,
) -> Result<Recorded, LaunchError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("roll-store")
        .enable_all()
        .build()
        .map_err(LaunchError::Runtime)?;
    let mode = match start {
        Start::New { .. } => OpenMode::Create,
        Start::Resume { .. } => OpenMode::Existing,
    };
    let store = rt.block_on(Store::open(store_path, mode))?;
    let owner = ProcessIdentity::current();
    // `_lock` holds the output directory for this run until it ends.
    let (cfg, run, resume, resumed_from, _lock) = match start {
        Start::New { cfg, overwrite } => {
            let cfg = Box::new(cfg.with_absolute_paths());
            let new = NewRun {
                name: cfg.name.clone(),
                config_json: serde_json::to_string(&*cfg)
                    .map_err(|e| LaunchError::Refused(format!("encoding the config: {e}")))?,
                config_hash: cfg.hash(),
                git_revision: git_revision(),
                seed: cfg.seed,
                output_dir: cfg.output_dir().to_string_lossy().into_owned(),
            };
            // A run of this name that failed at set-up is replaced as if with --overwrite (its
            // output directory too, when it is this one): it has nothing to resume.
            let unstarted = rt.block_on(store.unstarted_failed_run(&cfg.name))?;
            let replace = overwrite || unstarted.is_some();
            let replace_dir = overwrite
                || unstarted
                    .as_ref()
                    .is_some_and(|old| std::path::Path::new(&old.output_dir) == cfg.output_dir());
            // Check the store first: a refused run must not touch the output directory.
            rt.block_on(store.check_name_free(&cfg.name, replace))?;
            // Locked before anything in it is replaced: a live run's files are never removed.
            let lock = pipeline::lock_output_dir(&cfg.output_dir())?;
            pipeline::prepare_output_dir(&cfg.output_dir(), replace_dir)?;
            let id = rt.block_on(store.create_run(&new, replace, &owner))?;
            (*cfg, id, None, None, lock)
        }
        Start::Resume { run } => {
            let info = rt.block_on(store.find_run(&run))?;
            let (cfg, resume) = resume_point(&rt, &store, &info)?;
            let lock = pipeline::lock_output_dir(&cfg.output_dir())?;
            let (stage, step) = (resume.state.stage.clone(), resume.state.step);
            let dropped = rt.block_on(store.begin_resume(&info, &stage, step as u64, &owner))?;
            (
                cfg,
                info.id,
                Some(resume),
                Some((stage, step, dropped)),
                lock,
            )
        }
    };
    let (writer, task) = {
        let _in_runtime = rt.enter();
        store.spawn_writer()
    };
    writer.own_blocking(run)?;
    let mut sink = StoreSink::new(writer.clone(), run);
    if let Some((stage, step, recomputed)) = &resumed_from {
        observer.on_event(&pipeline::PipelineEvent::Resumed {
            run: cfg.name.clone(),
            stage: stage.clone(),
            step: *step,
            recomputed: *recomputed,
        });
    }
    let result = pipeline::run(&cfg, observer, stop, &mut sink, resume.as_ref());
    drop(sink);
    let ended = finish(&writer, run, &result);
    drop(writer);
    let _ = rt.block_on(task);
    rt.block_on(store.close());
    let outcome = result?;
    ended?;
    Ok(Recorded {
        run,
        name: cfg.name,
        outcome,
        resumed_from,
    })
}

/// Record the run's final status and make everything durable.
fn finish(
    writer: &WriterHandle,
    run: RunId,
    result: &Result<RunOutcome, RunError>,
) -> Result<(), StoreError> {
    let (status, error) = match result {
        Ok(o) if o.status == RunStatus::Finished => (crate::store::RunStatus::Finished, None),
        Ok(_) => (
            crate::store::RunStatus::Interrupted,
            Some("stopped by the user".to_string()),
        ),
        Err(e) => (crate::store::RunStatus::Failed, Some(e.to_string())),
    };
    let message = match &error {
        Some(e) => format!("run {}: {e}", status.as_str()),
        None => format!("run {}", status.as_str()),
    };
    let kind = if status == crate::store::RunStatus::Failed {
        EventKind::Error
    } else {
        EventKind::RunEnded
    };
    let event = EventRecord {
        run_status: Some(status.as_str().into()),
        ..EventRecord::message(kind, message)
    };
    writer.event_blocking(Some(run), event)?;
    writer.status_blocking(run, status, error)?;
    writer.flush_blocking()
}

/// The config and checkpoint a stored run continues from; refuses (with the reason) when nothing
/// would run or the checkpoint is unusable.
fn resume_point(
    rt: &tokio::runtime::Runtime,
    store: &Store,
    info: &RunInfo,
) -> Result<(RunConfig, Resume), LaunchError> {
    let refuse =
        |why: String| LaunchError::Refused(format!("cannot resume run '{}': {why}", info.name));
    match info.status {
        crate::store::RunStatus::Finished => {
            // To train further is a new run from its last checkpoint, which is a model directory.
            let from = rt
                .block_on(store.checkpoints(info.id))?
                .last()
                .map(|c| {
                    format!(
                        "; to train on from it, start a new run from its last checkpoint: \
                         model.path={} model.init=null name=…",
                        c.path.display()
                    )
                })
                .unwrap_or_default();
            return Err(refuse(format!(
                "it already finished ({} step {}); nothing to run{from}",
                info.last_stage.as_deref().unwrap_or("?"),
                info.last_step
            )));
        }
        crate::store::RunStatus::Running if info.is_active() => {
            return Err(refuse(format!(
                "it is still running (pid {} on {})",
                info.pid.unwrap_or_default(),
                info.host.as_deref().unwrap_or("?")
            )));
        }
        _ => {}
    }
    let cfg: RunConfig = serde_json::from_str(&info.config_json)
        .map_err(|e| refuse(format!("its stored config cannot be read ({e})")))?;
    if cfg.hash() != info.config_hash {
        return Err(refuse(format!(
            "its stored config hashes to {} but was recorded as {}",
            cfg.hash(),
            info.config_hash
        )));
    }
    let checkpoints = rt.block_on(store.checkpoints(info.id))?;
    let Some(last) = checkpoints.last() else {
        // A run that failed at set-up (a model or dataset it could not read) has its reason;
        // one killed early does not.
        let failed = info.status == crate::store::RunStatus::Failed;
        let why = match (failed, info.last_step, &info.error) {
            (true, 0, Some(error)) => format!(
                "it failed before its first step ({}), so there is nothing to resume from: fix \
                 that and run its config again",
                crate::text::clean(error, 200, false)
            ),
            _ => "it stopped before its first checkpoint, so there is nothing to resume from: run \
                  its config again with --overwrite, and to checkpoint during a stage set \
                  checkpoint.every (steps) or a shorter checkpoint.every_minutes"
                .into(),
        };
        return Err(refuse(why));
    };
    if !last.path.join("trainer_state.json").exists() {
        return Err(refuse(format!(
            "its last checkpoint '{}' ({} step {}) is missing on disk",
            last.path.display(),
            last.stage,
            last.step
        )));
    }
    let resume = Resume::load(&last.path, &cfg).map_err(|e| refuse(e.to_string()))?;
    let last_stage_steps = match cfg.last_stage() {
        Some(stage) => (stage.as_str(), cfg.steps_of(stage)),
        None => ("", 0),
    };
    if (resume.state.stage.as_str(), resume.state.step) == last_stage_steps {
        return Err(refuse(format!(
            "its last checkpoint is at its final step ({} {}); nothing to run",
            resume.state.stage, resume.state.step
        )));
    }
    // Everything the resume needs must load now, before the store drops what came after the
    // checkpoint: a corrupt file is refused here, not half-way through setup.
    let model = crate::pipeline::setup::load_checkpoint_policy(&cfg, &resume.dir)
        .map_err(|e| refuse(format!("its last checkpoint cannot be loaded: {e}")))?;
    resume
        .check_setup(&cfg, &model)
        .map_err(|e| refuse(e.to_string()))?;
    Ok((cfg, resume))
}

/// `git rev-parse --short HEAD` of the working directory, `-dirty` when it has changes; `None`
/// outside a repository or without git.
fn git_revision() -> Option<String> {
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let rev = git(&["rev-parse", "--short=12", "HEAD"])?;
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{rev}-dirty") } else { rev })
}
