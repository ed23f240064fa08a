//! Agentic RL (`rl.env`): the policy acts in an environment over many turns. Each step plays
//! `prompts_per_step` groups of `group_size` episodes (a group's episodes start from one seed) with
//! actor_infer ([`episodes`]), turns them into a trajectory-wise batch — StarPO: the whole
//! conversation is one sequence, only the policy's own tokens are trained, the episode's return is
//! its reward ([`batch`]) — and trains it with the same learner, losses, KL and checkpoints as RLVR.
//! Generation, training and weight sync alternate as in synchronous RLVR, time-sharing colocated
//! devices.

mod ahead;
mod batch;
mod env_host;
mod episodes;
mod trajectory;
pub(crate) mod turns;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::time::Instant;

use super::rl_learner::{Learned, Learner};
use super::rlvr::placement_for;
use super::setup::Tokenizing;
use super::time_sharing::TimeSharing;
use super::worker_report::report_workers;
use super::{PipelineEvent, Resume, RunContext, RunError, RunStatus};
use crate::config::{EnvConfig, PlacementMode, RlConfig, Stage};
use crate::data::mix::MixerState;
use crate::metrics::Metrics;
use crate::model::LoadedModel;
use crate::role::ResidentRole;
use crate::role::actor_infer::{Generator, Infer};
use crate::scheduler::Phase;

use episodes::{EpisodeRunner, StepEpisodes};
use turns::TurnFormat;

/// The sentence before the first observation when a chat template is used and the config gives
/// no `instruction`.
pub(crate) fn default_instruction(env: &EnvConfig) -> Result<String, RunError> {
    let mut probe = crate::env::make(&env.name, &env.param_pairs())
        .map_err(|e| RunError::Setup(format!("rl.env: {e}")))?;
    // An external program may only say its action format once it has started an episode.
    probe
        .reset(0)
        .map_err(|e| RunError::Setup(format!("rl.env: {e}")))?;
    // Only the default parser's format can be named; a custom pattern's user says it themselves.
    let how = match env.action_pattern {
        None => "as <answer>ACTION</answer>, where ACTION is",
        Some(_) => "which is",
    };
    Ok(format!(
        "You are acting in the environment '{}'. Each turn, read the state and reply with your \
         action, {how} {}.",
        env.name,
        probe.action_format()
    ))
}

/// One warning per episode whose environment failed (it was played again in a new one), shown
/// and kept with the run.
fn report_discarded(
    ctx: &mut RunContext<'_>,
    step: usize,
    what: &str,
    failures: &[String],
) -> Result<(), RunError> {
    for failure in failures {
        ctx.warn(format!(
            "step {step}: {what} was discarded and played again in a new environment: {failure}"
        ))?;
    }
    Ok(())
}

pub fn run_agentic(
    ctx: &mut RunContext<'_>,
    cfg: &RlConfig,
    env: &EnvConfig,
    model: &LoadedModel,
    chat_template: bool,
    resume: Option<&Resume>,
) -> Result<(RunStatus, Option<PathBuf>), RunError> {
    let mut learner = Learner::new(ctx, cfg, model, resume, None)?;
    // Environments reward their episodes themselves: no judge models.
    let placement = placement_for(ctx.cfg, model, &[])?
        .ok_or_else(|| RunError::Setup("the run has no rl section".into()))?;
    let mut sharing = TimeSharing::new(placement, &ctx.cfg.workers.devices)?;
    let infer = Infer::start(ctx.cfg, cfg, model)?;
    let run_cfg = ctx.cfg;
    let tok = Tokenizing {
        model,
        chat_template,
        template_options: &run_cfg.data.chat_template_options,
    };
    let instruction = match (&env.instruction, chat_template) {
        (Some(i), _) => Some(i.clone()),
        (None, true) => Some(default_instruction(env)?),
        (None, false) => None,
    };
    let runner = EpisodeRunner::new(
        cfg,
        env,
        TurnFormat {
            tok,
            instruction: instruction.as_deref(),
        },
        ctx.cfg.seed,
    )
    .in_processes(match ctx.cfg.workers.env.mode {
        PlacementMode::Process => Some((
            crate::worker::process::worker_program()
                .map_err(|e| RunError::Setup(format!("workers.env: {e}")))?,
            ctx.cfg.workers.env.num_workers,
        )),
        PlacementMode::InProcess => None,
    });
    ctx.emit(PipelineEvent::StageStarted {
        stage: Stage::Rl,
        total_steps: cfg.steps,
        done_steps: learner.first_step - 1,
    });
    let status = match cfg.async_generation_ratio {
        0 => train(ctx, cfg, &mut learner, &mut sharing, &infer, &runner),
        _ => ahead::train_ahead(ctx, cfg, &mut learner, &mut sharing, &infer, &runner),
    };
    let mut events = (&infer).shutdown();
    for role in learner.residents() {
        events.extend(role.shutdown());
    }
    report_workers(ctx, events)?;
    let status = status?;
    Ok((status, learner.last_checkpoint))
}

/// One step's episodes as played: the evaluation (when due) and the training episodes, the policy
/// version they were played with, and what actor_infer's workers reported meanwhile.
pub(super) struct Played {
    step: usize,
    version: usize,
    val: Option<StepEpisodes>,
    out: StepEpisodes,
    notes: Vec<crate::metrics::WorkerNote>,
}

/// Play step `step`'s episodes (and its evaluation when due) with the policy behind `engine`,
/// version `version`.
pub(super) fn play_step(
    runner: &EpisodeRunner<'_>,
    engine: &mut dyn Generator,
    step: usize,
    version: usize,
) -> Result<Played, RunError> {
    let val = match runner
        .env
        .eval
        .as_ref()
        .filter(|e| (step - 1).is_multiple_of(e.every))
    {
        Some(eval) => Some(runner.evaluate(eval.episodes, eval.temperature, engine)?),
        None => None,
    };
    let out = runner.run(step, engine)?;
    Ok(Played {
        step,
        version,
        val,
        out,
        notes: engine.drain_events(),
    })
}

/// Play, train, sync — one phase at a time.
fn train(
    ctx: &mut RunContext<'_>,
    cfg: &RlConfig,
    learner: &mut Learner<'_>,
    sharing: &mut TimeSharing,
    infer: &Infer,
    runner: &EpisodeRunner<'_>,
) -> Result<RunStatus, RunError> {
    let tok = runner.format.tok;
    let detok = move |ids: &[u32]| tok.decode(ids);
    for step in learner.first_step..=cfg.steps {
        let t_step = Instant::now();
        let mut m = Metrics::new();
        learner.enter(Phase::Generate, sharing, infer, ctx, &mut m)?;
        let mut engine = infer.generator(tok.model.eos_ids.clone(), cfg.rollout_batch, &detok);
        let played = play_step(runner, engine.as_mut(), step, step - 1)?;
        drop(engine);
        let learn = LearnStep {
            cfg,
            runner,
            handoff: None,
            t_step,
        };
        if learn.run(ctx, learner, sharing, infer, played, m)? {
            return Ok(RunStatus::Interrupted);
        }
    }
    Ok(RunStatus::Finished)
}

/// Record a played step and train on it.
pub(super) struct LearnStep<'a, 'r> {
    cfg: &'a RlConfig,
    runner: &'a EpisodeRunner<'r>,
    /// Where the new weights go when actor_infer runs in its own thread.
    handoff: Option<&'a mut Option<crate::role::actor_infer::PolicyUpdate>>,
    t_step: Instant,
}

impl LearnStep<'_, '_> {
    /// Returns true when the stage must stop now.
    fn run(
        self,
        ctx: &mut RunContext<'_>,
        learner: &mut Learner<'_>,
        sharing: &mut TimeSharing,
        infer: &Infer,
        played: Played,
        mut m: Metrics,
    ) -> Result<bool, RunError> {
        let (cfg, env, tok) = (self.cfg, self.runner.env, self.runner.format.tok);
        let Played {
            step,
            version,
            val,
            out,
            mut notes,
        } = played;
        if let Some(val) = val {
            report_discarded(ctx, step, "an evaluation episode", &val.failures)?;
            batch::validation_metrics(&mut m, env.tag(), &val);
            // Stored beside the training episodes under `val/<tag>`, as their metrics are: the
            // same seeds at every evaluation, so one start state can be followed across steps.
            let tag = format!("val/{}", env.tag());
            let records = batch::trajectory_records(step, version, &tag, &val.trajectories);
            ctx.record_trajectories(&records)?;
        }
        report_discarded(ctx, step, "an episode", &out.failures)?;
        for role in learner.residents() {
            notes.extend(role.drain_events());
        }
        report_workers(ctx, notes)?;
        batch::episode_metrics(&mut m, env.tag(), env.format_penalty, &out, cfg.group_size);
        if cfg.async_generation_ratio > 0 {
            // Every episode of a step was played with one policy version.
            let stale = (step - 1).saturating_sub(version) as f64;
            m.insert("async/staleness_mean".into(), stale);
            m.insert("async/staleness_max".into(), stale);
        }
        let trajs = &out.trajectories;
        let rows = batch::first_rows(batch::is_step_wise(cfg), trajs);
        // Each episode's record shows the advantage of its first row (its first turn).
        let records = |adv: &[f32]| {
            let firsts: Vec<f32> = rows
                .iter()
                .map(|r| adv.get(*r).copied().unwrap_or(0.0))
                .collect();
            batch::sample_records(step, version, env.tag(), tok, trajs, &firsts)
        };
        let step_wise = batch::is_step_wise(cfg);
        let learned = Learned {
            batch: (!trajs.is_empty()).then(|| batch::agentic_batch(cfg, env, trajs)),
            records: &records,
            // An episode is one row, or step-wise a row per turn.
            record_rows: rows
                .iter()
                .zip(trajs)
                .map(|(&r, t)| r..r + if step_wise { t.turns.len() } else { 1 })
                .collect(),
            episodes: Some(batch::trajectory_records(step, version, env.tag(), trajs)),
            mixer: MixerState { domains: vec![] },
        };
        learner.learn(
            ctx,
            cfg,
            sharing,
            infer,
            self.handoff,
            step,
            learned,
            m,
            self.t_step,
        )
    }
}
