//! RLVR: sample groups of completions per prompt, score them with rule rewards, and update the policy
//! — through the scheduler's roles: actor_infer generates (sample-level, continuous batching) into
//! reward scoring, actor_train learns, and the two time-share their devices or run side by side.
//!
//! With α = 0 (`rl.async_generation_ratio`) each step generates, then trains, then syncs weights,
//! in this thread. With α > 0 actor_infer runs in its own thread on its own devices and keeps
//! generating ahead while the trainer learns; each batch it hands over holds only groups at most α
//! policy versions old, and new weights reach it between two decode steps.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Instant;

use super::ahead::{Ask, drive_ahead};
use super::rl_eval;
use super::rl_learner::Learner;
use super::rollout_loop::{Rollout, StepRollout};
use super::score_link::ScoreLink;
use super::setup::{Domains, Tokenizing};
use super::time_sharing::TimeSharing;
use super::worker_report::report_workers;
use super::{PipelineEvent, Resume, RunContext, RunError, RunStatus, mix_seed};
use crate::config::{RlConfig, RunConfig, Stage};
use crate::data::mix::DomainMixer;
use crate::metrics::Metrics;
use crate::model::LoadedModel;
use crate::role::ResidentRole;
use crate::role::actor_infer::{Generator, Infer};
use crate::role::reward::{RewardScorer, SharedScorer};
use crate::rollout::engine::Detokenize;
use crate::scheduler::{Phase, Placement};

/// The placement the run asks for, refused with a message naming device and bytes if it cannot fit.
/// `judges`: the run's judge models (`llm_judge` rewards), whose shapes are read here, as are
/// those of its on-policy distillation teachers (`rl.opd`).
pub fn placement_for(
    run: &RunConfig,
    model: &LoadedModel,
    judges: &[PathBuf],
) -> Result<Option<Placement>, RunError> {
    let Some(rl) = &run.rl else {
        return Ok(None);
    };
    let shape = |dir: &PathBuf, what: &str| {
        crate::model::read_model_config(dir).map_err(|e| RunError::Setup(format!("{what}: {e}")))
    };
    let judges = judges
        .iter()
        .map(|dir| shape(dir, "the llm_judge reward's model"))
        .collect::<Result<Vec<_>, _>>()?;
    let teachers = rl
        .opd
        .iter()
        .flat_map(|o| o.teachers.iter().enumerate())
        .map(|(i, t)| {
            let what = format!("rl.opd.teachers[{i}] ('{}')", t.name);
            crate::role::teacher::shape_of(&what, &t.path).map_err(RunError::Setup)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let dtype_bytes = run.model.dtype.candle().size_in_bytes();
    let budget = run.workers.devices.budget_bytes()?;
    Placement::for_run(
        &run.workers,
        rl,
        model.config(),
        dtype_bytes,
        (&judges, &teachers),
        budget,
    )
    .and_then(|p| p.on_nodes(&super::setup::worker_nodes(&run.workers)))
    .map(Some)
    .map_err(|e| RunError::Setup(e.to_string()))
}

pub fn run_rlvr(
    ctx: &mut RunContext<'_>,
    cfg: &RlConfig,
    model: &LoadedModel,
    data: &Domains,
    resume: Option<&Resume>,
) -> Result<(RunStatus, Option<PathBuf>), RunError> {
    let seed = ctx.cfg.seed;
    let mut mixer = data.mixer(mix_seed(&[seed, 2]))?;
    let mut learner = Learner::new(ctx, cfg, model, resume, Some(&mut mixer))?;
    let lone = learner.lone_state_workers();
    let ck = &ctx.cfg.checkpoint;
    if !lone.is_empty() && ck.every == 0 && ck.every_minutes == 0.0 {
        ctx.warn(format!(
            "{} in a worker process with checkpoint.every: 0 and checkpoint.every_minutes: 0: if \
             that worker dies, the run stops with no checkpoint of this stage to resume from (set \
             either to checkpoint during the stage)",
            lone.join(" and ")
        ))?;
    }
    let judges = data.judge_models();
    let placement = placement_for(ctx.cfg, model, &judges)?
        .ok_or_else(|| RunError::Setup("the run has no rl section".into()))?;
    let mut sharing = TimeSharing::new(placement, &ctx.cfg.workers.devices)?;
    // actor_infer's own copy of the weights (here or in a worker), kept current by weight sync.
    let infer = Infer::start(ctx.cfg, cfg, model)?;
    let tok = Tokenizing {
        model,
        chat_template: data.chat_template,
        template_options: &data.template_options,
    };
    let first = learner.first_step;
    ctx.emit(PipelineEvent::StageStarted {
        stage: Stage::Rl,
        total_steps: cfg.steps,
        done_steps: first - 1,
    });
    let scorer = SharedScorer::new(RewardScorer::start(&ctx.cfg.workers, &judges)?);
    // Judge models are time-shared with the trainer's roles; rules and programs hold nothing.
    if !judges.is_empty() {
        learner.reward = Some(scorer.clone());
    }
    let eval_scorer = scorer.clone();
    let link = ScoreLink::start(scorer)?;
    let mut rollout = Rollout::new(cfg, tok, data, link, seed, first - 1);
    let evaluation = rl_eval::Evaluation {
        sampling: &cfg.sampling,
        data,
        tok,
        scorer: eval_scorer,
        seed,
    };
    if let Some(eval) = &cfg.eval {
        let (eos, batch) = (model.eos_ids.clone(), cfg.rollout_batch);
        learner.evaluate = Some(Box::new(move |infer: &Infer, step: usize| {
            let detok = move |ids: &[u32]| tok.decode(ids);
            let mut engine = infer.generator(eos.clone(), batch, &detok);
            evaluation.run(eval, engine.as_mut(), step)
        }));
    }
    let drive = Drive {
        cfg,
        model,
        infer: &infer,
        tok,
    };
    let status = if cfg.async_generation_ratio == 0 {
        drive.synchronous(ctx, &mut learner, &mut sharing, &mut rollout, &mut mixer)
    } else {
        drive.asynchronous(ctx, &mut learner, &mut sharing, &mut rollout, &mut mixer)
    };
    let mut events = rollout.shutdown();
    events.extend((&infer).shutdown());
    for role in learner.residents() {
        events.extend(role.shutdown());
    }
    let last_checkpoint = learner.last_checkpoint;
    report_workers(ctx, events)?;
    let status = status.map_err(|e| match e {
        RunError::WorkerLost(why) => RunError::WorkerLost(format!(
            "{why}. {}",
            match &last_checkpoint {
                Some(dir) => format!(
                    "`roll-tui resume {}` continues from its last checkpoint, '{}'",
                    ctx.cfg.name,
                    dir.display()
                ),
                None => "No checkpoint was written before (checkpoint.every or a shorter \
                         checkpoint.every_minutes checkpoint during the stage)"
                    .to_string(),
            }
        )),
        other => other,
    })?;
    Ok((status, last_checkpoint))
}

struct Drive<'a> {
    cfg: &'a RlConfig,
    model: &'a LoadedModel,
    infer: &'a Infer,
    tok: Tokenizing<'a>,
}

impl Drive<'_> {
    fn engine<'e>(&self, detok: Detokenize<'e>) -> Box<dyn Generator + 'e>
    where
        Self: 'e,
    {
        self.infer
            .generator(self.model.eos_ids.clone(), self.cfg.rollout_batch, detok)
    }

    /// Generate, train, sync — one phase at a time, time-sharing colocated devices.
    fn synchronous(
        &self,
        ctx: &mut RunContext<'_>,
        learner: &mut Learner<'_>,
        sharing: &mut TimeSharing,
        rollout: &mut Rollout<'_>,
        mixer: &mut DomainMixer,
    ) -> Result<RunStatus, RunError> {
        let tok = self.tok;
        let detok = move |ids: &[u32]| tok.decode(ids);
        let baseline = self.cfg.eval.as_ref().is_some_and(|e| e.before_training);
        if baseline && learner.first_step == 1 {
            learner.evaluate_before_training(ctx, self.cfg, sharing, self.infer)?;
        }
        for step in learner.first_step..=self.cfg.steps {
            let t_step = Instant::now();
            let mut m = Metrics::new();
            learner.enter(Phase::Generate, sharing, self.infer, ctx, &mut m)?;
            let mut engine = self.engine(&detok);
            let out = rollout.until_batch(engine.as_mut(), mixer)?;
            drop(engine);
            if learner.step(
                ctx, self.cfg, sharing, self.infer, None, step, out, m, t_step,
            )? {
                return Ok(RunStatus::Interrupted);
            }
            // Nothing is in flight between synchronous steps, so nothing can turn stale here.
            rollout.set_version(step, self.engine(&detok).as_mut())?;
        }
        Ok(RunStatus::Finished)
    }

    /// actor_infer in its own thread, generating ahead by up to α versions.
    fn asynchronous(
        &self,
        ctx: &mut RunContext<'_>,
        learner: &mut Learner<'_>,
        sharing: &mut TimeSharing,
        rollout: &mut Rollout<'_>,
        mixer: &mut DomainMixer,
    ) -> Result<RunStatus, RunError> {
        // The trainer's devices are its own: place its roles once.
        learner.enter(
            Phase::Generate,
            sharing,
            self.infer,
            ctx,
            &mut Metrics::new(),
        )?;
        drive_ahead(
            learner.first_step..=self.cfg.steps,
            |asks, out| self.generate_ahead(rollout, mixer, asks, out),
            |step, out, weights, t_step| {
                let m = Metrics::new();
                learner.step(
                    ctx,
                    self.cfg,
                    sharing,
                    self.infer,
                    Some(weights),
                    step,
                    out,
                    m,
                    t_step,
                )
            },
        )
    }

    /// The actor_infer thread: keep generating (up to the scheduler's horizon), answer each ask
    /// with the batch for its version, and take new weights between two decode steps.
    fn generate_ahead(
        &self,
        rollout: &mut Rollout<'_>,
        mixer: &mut DomainMixer,
        asks: mpsc::Receiver<Ask>,
        out: &mpsc::Sender<Result<StepRollout, RunError>>,
    ) -> Result<(), RunError> {
        let tok = self.tok;
        let detok = move |ids: &[u32]| tok.decode(ids);
        let mut engine = self.engine(&detok);
        let mut asked = false;
        let mut idle = false;
        loop {
            if !asked {
                let ask = if idle {
                    match asks.recv() {
                        Ok(a) => Some(a),
                        Err(_) => return Ok(()),
                    }
                } else {
                    match asks.try_recv() {
                        Ok(a) => Some(a),
                        Err(mpsc::TryRecvError::Empty) => None,
                        Err(mpsc::TryRecvError::Disconnected) => return Ok(()),
                    }
                };
                if let Some(a) = ask {
                    if let Some(w) = a.weights {
                        self.infer.set_weights(&w)?;
                    }
                    if a.step - 1 != rollout.sched.version() {
                        rollout.set_version(a.step - 1, engine.as_mut())?;
                    }
                    asked = true;
                }
            }
            let progressed = rollout.step_once(engine.as_mut(), mixer)?;
            idle = !progressed;
            if asked && let Some(batch) = rollout.try_batch(engine.as_mut(), mixer, idle)? {
                if out.send(Ok(batch)).is_err() {
                    return Ok(());
                }
                asked = false;
            }
        }
    }
}
