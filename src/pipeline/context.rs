//! What every stage shares while it runs — config, output directory, observer, sink, stop flag —
//! and the recording it does through it: step metrics, samples, checkpoints.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::{Observer, PipelineEvent, RunError};
use crate::config::{RunConfig, Stage};
use crate::data::mix::MixerState;
use crate::metrics::{CheckpointRecord, MetricRecord, MetricSink, Metrics, SampleRecord};
use crate::model::LoadedModel;
use crate::role::critic::Critic;
use crate::train::checkpoint::{RlResumeState, TrainerState, save_checkpoint};

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
    /// When this process last wrote a checkpoint (or started), for `checkpoint.every_minutes`.
    pub last_checkpoint_at: Instant,
    /// The last checkpoint written only because time passed, removed when the next is written.
    pub timed_checkpoint: Option<PathBuf>,
}

/// Why step `step` of `total` ends with a checkpoint, if it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// The stage's end, a stop, or every `every` steps: kept.
    Kept,
    /// Only because `every_minutes` passed: a safety net, replaced by the next one.
    Timed,
}

/// Whether step `step` of `total` ends with a checkpoint: at the stage's end, on a stop, every
/// `every` steps, or once `every_minutes` have passed since the last one (`since_last`).
pub fn checkpoint_due(
    (step, total): (usize, usize),
    cfg: &crate::config::CheckpointConfig,
    since_last: std::time::Duration,
    stop: bool,
) -> Option<Due> {
    let by_steps = cfg.every > 0 && step.is_multiple_of(cfg.every);
    let by_time = cfg.every_minutes > 0.0 && since_last.as_secs_f64() >= cfg.every_minutes * 60.0;
    if stop || step == total || by_steps {
        Some(Due::Kept)
    } else {
        by_time.then_some(Due::Timed)
    }
}

impl RunContext<'_> {
    /// Seconds since the run started, across resumes.
    pub fn wall_time(&self) -> f64 {
        self.wall_offset + self.started.elapsed().as_secs_f64()
    }

    /// A notice for the user that is also kept with the run.
    pub fn warn(&mut self, text: String) -> Result<(), RunError> {
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
    ) -> Result<(), RunError> {
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

    pub fn record_samples(&mut self, samples: &[SampleRecord]) -> Result<(), RunError> {
        self.sink.samples(samples)?;
        Ok(())
    }

    pub fn record_trajectories(
        &mut self,
        trajectories: &[crate::metrics::TrajectoryRecord],
    ) -> Result<(), RunError> {
        self.sink.trajectories(trajectories)?;
        Ok(())
    }

    /// [`Self::after_step`] for a stage whose only state besides the policy's is its data
    /// cursor (`mixer`, read when a checkpoint is due): SFT, distillation, DPO.
    pub fn after_data_step(
        &mut self,
        model: &LoadedModel,
        opt: &dyn crate::train::checkpoint::OptimizerState,
        stage: Stage,
        progress: (usize, usize),
        last: &mut Option<PathBuf>,
        mixer: impl FnOnce() -> MixerState,
    ) -> Result<bool, RunError> {
        let extras = || CheckpointExtras {
            mixer: mixer(),
            rl: None,
            critic: None,
            reference: None,
        };
        self.after_step(model, opt, stage, progress, last, extras)
    }

    /// After step `step` of `total`: checkpoint when the stage ends, every `checkpoint.every` steps,
    /// `checkpoint.every_minutes` after the last one, or when a stop was requested. Returns true when the stage must stop now.
    pub fn after_step<'a2>(
        &mut self,
        model: &LoadedModel,
        opt: &dyn crate::train::checkpoint::OptimizerState,
        stage: Stage,
        (step, total): (usize, usize),
        last: &mut Option<PathBuf>,
        extras: impl FnOnce() -> CheckpointExtras<'a2>,
    ) -> Result<bool, RunError> {
        let stop = self.stop_requested();
        let since_last = self.last_checkpoint_at.elapsed();
        if let Some(due) = checkpoint_due((step, total), &self.cfg.checkpoint, since_last, stop) {
            let dir = self.checkpoint(model, opt, stage, step, extras())?;
            // A timed checkpoint only guards against a crash until the next one: the one it
            // replaces goes, so a long stage keeps one (plus those it keeps on purpose), not one
            // per half hour. The store keeps its record (`runs show` marks it removed).
            if let Some(old) = self.timed_checkpoint.take() {
                let _ = std::fs::remove_dir_all(old);
            }
            if due == Due::Timed {
                self.timed_checkpoint = Some(dir.clone());
            }
            *last = Some(dir);
            self.last_checkpoint_at = Instant::now();
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
    ) -> Result<PathBuf, RunError> {
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

#[cfg(test)]
mod tests {
    use super::{Due, checkpoint_due};
    use crate::config::CheckpointConfig;
    use std::time::Duration;

    #[test]
    fn checkpoints_come_by_step_count_by_time_at_the_end_and_on_stop() {
        let min = |m: u64| Duration::from_secs(m * 60);
        let cfg = CheckpointConfig::default();
        // The default: not by count, but once 30 minutes have passed since the last one.
        assert_eq!(checkpoint_due((5, 400), &cfg, min(29), false), None);
        assert_eq!(
            checkpoint_due((5, 400), &cfg, min(30), false),
            Some(Due::Timed)
        );
        assert_eq!(
            checkpoint_due((400, 400), &cfg, min(45), false),
            Some(Due::Kept)
        );
        assert_eq!(
            checkpoint_due((5, 400), &cfg, min(0), true),
            Some(Due::Kept)
        );
        let steps = CheckpointConfig {
            every: 50,
            every_minutes: 0.0,
        };
        assert_eq!(
            checkpoint_due((100, 400), &steps, min(0), false),
            Some(Due::Kept)
        );
        assert_eq!(checkpoint_due((101, 400), &steps, min(600), false), None);
    }
}
