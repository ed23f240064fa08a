//! The training side of the RL stage (actor_train with its reference and critic): set up or resume
//! its state, turn a step's rollout into an update, record the step's samples and checkpoint.

use std::path::PathBuf;
use std::time::Instant;

use super::opd::OpdTeachers;
use super::rl_metrics::rollout_metrics;
use super::rl_update::{RlBatch, RowTrace, UpdateState, update};
use super::rollout_loop::{Prompt, Sample, StepRollout};
use super::time_sharing::TimeSharing;
use super::worker_report::report_workers;
use super::{CheckpointExtras, Resume, RunContext, RunError, TensorContext, mix_seed};
use crate::algo::kl::{KlController, KlMode};
use crate::algo::normalize::RunningStats;
use crate::config::{PlacementMode, RlConfig, Stage};
use crate::data::mix::{DomainMixer, MixerState};
use crate::metrics::{Metrics, SampleRecord, TokenTrace, TrajectoryRecord, finite};
use crate::model::LoadedModel;
use crate::role::actor_infer::{Infer, PolicyUpdate, reference_of};
use crate::role::actor_train::ActorTrain;
use crate::role::critic::Critic;
use crate::role::reference::Reference;
use crate::role::reward::SharedScorer;
use crate::role::{ResidentRole, Restore};
use crate::rollout::FinishReason;
use crate::scheduler::Phase;
use crate::train::checkpoint::{RlResumeState, load_vars};

/// What a step's rollout gives the learner.
pub(super) struct Learned<'a> {
    /// The scored batch, rows of a group consecutive; `None` when no group can teach anything.
    pub batch: Option<RlBatch>,
    /// The step's sample records, given each row's advantage (all 0 without a batch).
    pub records: &'a dyn Fn(&[f32]) -> Vec<SampleRecord>,
    /// The batch rows of each record (an agentic episode's turns may be several rows).
    pub record_rows: Vec<std::ops::Range<usize>>,
    /// An agentic step's episodes, a record each, stored with the step's samples (each turn
    /// given its part of its episode's token trace when there is one).
    pub episodes: Option<Vec<TrajectoryRecord>>,
    /// The data cursor to checkpoint (empty when the stage reads no dataset).
    pub mixer: MixerState,
}

pub(super) struct Learner<'m> {
    pub model: &'m LoadedModel,
    pub actor: ActorTrain,
    pub reference: Option<Reference>,
    pub critic: Option<Critic>,
    pub kl_ctl: KlController,
    pub running: RunningStats,
    /// The first step this process runs (after a resume, the one after the checkpoint).
    pub first_step: usize,
    pub last_checkpoint: Option<PathBuf>,
    /// The step whose policy the KL reference is (0: the policy the stage started from).
    pub reference_version: usize,
    /// Reward errors already reported, as (domain, error up to any quoted text): each is said once,
    /// not every step.
    pub reward_errors: std::collections::BTreeSet<(String, String)>,
    /// The reward role when it holds judge models, time-shared with the roles above.
    pub reward: Option<SharedScorer>,
    /// On-policy distillation's teachers (`rl.opd`).
    pub opd: Option<OpdTeachers>,
    /// `rl.eval`: scores the policy actor_infer holds on held-out prompts (see [`Learner::learn`]).
    pub evaluate: Option<Evaluate<'m>>,
}

/// An evaluation of the policy behind actor_infer after step `usize`: its `val/…` metrics and
/// the rewards' errors.
pub(super) type Evaluate<'m> =
    Box<dyn Fn(&Infer, usize) -> Result<super::rl_eval::Evaluated, RunError> + 'm>;

impl<'m> Learner<'m> {
    pub fn new(
        ctx: &RunContext<'_>,
        cfg: &RlConfig,
        model: &'m LoadedModel,
        resume: Option<&Resume>,
        mixer: Option<&mut DomainMixer>,
    ) -> Result<Learner<'m>, RunError> {
        let updates = cfg.updates();
        let restore = resume.map(|r| Restore {
            dir: &r.dir,
            optimizer_steps: r.state.optimizer_steps,
        });
        let actor = ActorTrain::start(ctx.cfg, cfg.actor_recipe(), model, updates, restore)?;
        // The reference is the policy as the stage began; a resumed stage reloads it from disk.
        let reference = match (cfg.kl.mode != KlMode::None, resume) {
            (false, _) => None,
            (true, None) => Some(reference_of(model)?),
            (true, Some(_)) => Some(super::setup::stage_start_reference(
                ctx.cfg,
                crate::config::Stage::Rl,
                model,
            )?),
        };
        let mut kl_ctl = KlController::new(
            cfg.kl.controller,
            cfg.kl.coef,
            cfg.kl.target,
            cfg.kl.horizon,
        );
        let mut running = RunningStats::new();
        let mut first_step = 1;
        if let Some(r) = resume {
            if let (Some(m), Some(mixer)) = (&r.state.mixer, mixer) {
                mixer.restore(m)?;
            }
            let rl = r.state.rl.as_ref().ok_or_else(|| {
                RunError::Setup(format!("checkpoint '{}' has no RL state", r.dir.display()))
            })?;
            kl_ctl.set_coef(rl.kl_coef);
            running = rl.running_reward.clone();
            first_step = r.state.step + 1;
        }
        // With refreshes, the reference is the policy of the last refresh at or before the resume
        // point; the checkpoint holds it.
        let every = cfg.kl.refresh_every;
        let reference_version = match resume {
            Some(r) if every > 0 => r.state.step / every * every,
            _ => 0,
        };
        if let (Some(reference), Some(r), true) = (&reference, resume, reference_version > 0) {
            // Under LoRA the checkpoint holds the reference's adapter.
            load_vars(
                &reference.trainable_vars(),
                &r.dir.join(super::REFERENCE_FILE),
            )?;
        }
        let reference = match reference {
            Some(copy) => Some(Reference::start(ctx.cfg, copy, model.pad_id)?),
            None => None,
        };
        let restore = resume.map(|r| Restore {
            dir: &r.dir,
            optimizer_steps: r
                .state
                .rl
                .as_ref()
                .and_then(|rl| rl.critic_optimizer_steps)
                .unwrap_or(0),
        });
        let critic = Critic::start(ctx.cfg, cfg, model, updates, restore)?;
        let opd = match &cfg.opd {
            Some(o) => Some(OpdTeachers::start(ctx.cfg, o, model)?),
            None => None,
        };
        Ok(Learner {
            model,
            actor,
            reference,
            critic,
            kl_ctl,
            running,
            first_step,
            last_checkpoint: resume.map(|r| r.dir.clone()),
            reference_version,
            reward_errors: Default::default(),
            reward: None,
            evaluate: None,
            opd,
        })
    }

    /// The roles in worker processes whose optimizer state lives only there (lost with the worker).
    pub fn lone_state_workers(&self) -> Vec<&'static str> {
        let mut roles = vec![];
        if self.actor.is_remote() {
            roles.push("actor_train");
        }
        if self.critic.as_ref().is_some_and(Critic::is_remote) {
            roles.push("critic");
        }
        roles
    }

    /// The trainer's resident roles: actor_train, then the reference, the critic, the judges and
    /// the on-policy distillation teachers when the run has them.
    pub fn residents(&mut self) -> Vec<&mut dyn ResidentRole> {
        let mut roles: Vec<&mut dyn ResidentRole> = vec![&mut self.actor];
        if let Some(r) = self.reference.as_mut() {
            roles.push(r);
        }
        if let Some(c) = self.critic.as_mut() {
            roles.push(c);
        }
        if let Some(r) = self.reward.as_mut() {
            roles.push(r);
        }
        if let Some(o) = self.opd.as_mut() {
            roles.push(o);
        }
        roles
    }

    /// Bring the roles of `phase` onto their devices, `infer` being actor_infer.
    pub fn enter(
        &mut self,
        phase: Phase,
        sharing: &mut TimeSharing,
        infer: &Infer,
        ctx: &mut RunContext<'_>,
        m: &mut Metrics,
    ) -> Result<(), RunError> {
        let policy = self.model;
        let mut infer = infer;
        let mut roles = self.residents();
        roles.push(&mut infer);
        sharing.enter(phase, &mut roles, policy, ctx, m)
    }

    /// Train step `step` on `out`, record its metrics and samples, hand the new weights to
    /// actor_infer, and checkpoint when due. Returns true when the stage must stop now.
    ///
    /// The weights go straight into actor_infer (or its host copy) unless `handoff` is given: then
    /// actor_infer is generating in another thread, and gets a snapshot put there instead.
    #[allow(clippy::too_many_arguments)]
    pub fn step(
        &mut self,
        ctx: &mut RunContext<'_>,
        cfg: &RlConfig,
        sharing: &mut TimeSharing,
        infer: &Infer,
        handoff: Option<&mut Option<PolicyUpdate>>,
        step: usize,
        mut out: StepRollout,
        mut m: Metrics,
        t_step: Instant,
    ) -> Result<bool, RunError> {
        self.report_rollout_workers(ctx, &mut out, &mut m)?;
        let errors = out.groups.iter().flat_map(|g| {
            let domain = &g.prompt.example.domain;
            g.samples
                .iter()
                .filter_map(|s| Some((domain.clone(), s.outcome.error.clone()?)))
        });
        self.report_reward_errors(ctx, &format!("rl step {step}"), errors)?;
        rollout_metrics(&mut m, &out);
        if cfg.opd.as_ref().is_some_and(|o| o.pure) {
            // Pure on-policy distillation learns from the teachers' KL alone: groups whose rewards
            // are all equal are no lack of signal, and would only raise a false alarm.
            m.remove("group/frac_zero_std"); // the health rule's key (health::FLAT_KEY)
        }
        // Groups in the order they were dispatched: the batch does not depend on finishing order.
        let mut groups = out.groups;
        groups.sort_by_key(|g| g.id);
        let flat: Vec<(&Prompt, &Sample, usize)> = groups
            .iter()
            .flat_map(|g| g.samples.iter().map(move |s| (&g.prompt, s, g.version)))
            .collect();
        let batch = (!flat.is_empty()).then(|| rl_batch(&flat, cfg.group_size));
        let records = |advantages: &[f32]| -> Vec<SampleRecord> {
            flat.iter()
                .zip(advantages)
                .map(|((p, s, version), a)| sample_record(step, p, s, *version, *a))
                .collect()
        };
        let learned = Learned {
            batch,
            records: &records,
            record_rows: (0..flat.len()).map(|i| i..i + 1).collect(),
            episodes: None,
            mixer: out.mixer,
        };
        self.learn(ctx, cfg, sharing, infer, handoff, step, learned, m, t_step)
    }

    /// Train step `step` on a scored batch (`None`: nothing to learn from), record its metrics and
    /// samples, hand the new weights to actor_infer, and checkpoint when due. Returns true when the
    /// stage must stop now. Shared by every RL pipeline (prompts or environments).
    #[allow(clippy::too_many_arguments)]
    pub fn learn(
        &mut self,
        ctx: &mut RunContext<'_>,
        cfg: &RlConfig,
        sharing: &mut TimeSharing,
        infer: &Infer,
        handoff: Option<&mut Option<PolicyUpdate>>,
        step: usize,
        learned: Learned<'_>,
        mut m: Metrics,
        t_step: Instant,
    ) -> Result<bool, RunError> {
        self.enter(Phase::Train, sharing, infer, ctx, &mut m)?;
        let rows = learned.batch.as_ref().map_or(0, |b| b.prompts.len());
        let mut advantages = vec![0f32; rows];
        let mut traces = None;
        match &learned.batch {
            Some(batch) => {
                let state = UpdateState {
                    actor: &mut self.actor,
                    reference: self.reference.as_mut(),
                    critic: self.critic.as_mut(),
                    kl_ctl: &mut self.kl_ctl,
                    running: &mut self.running,
                    opd: self.opd.as_mut(),
                    seed: mix_seed(&[ctx.cfg.seed, 4, step as u64]),
                };
                let up = match update(cfg, self.model, state, batch) {
                    Ok(up) => up,
                    Err(e) => {
                        // The step's episodes are what one needs to see why it failed.
                        if let Some(episodes) = &learned.episodes {
                            ctx.record_trajectories(episodes)?;
                        }
                        return Err(e);
                    }
                };
                advantages = up.sample_advantages;
                traces = up.traces;
                m.extend(up.metrics);
            }
            None => ctx.warn(format!(
                "rl step {step}: every group had equal rewards; no update"
            ))?,
        }
        self.refresh_reference(ctx, cfg, sharing, step, &mut m)?;
        let synced = handoff.is_none();
        let (sync, bytes) = match handoff {
            None => sharing.sync_weights(self.model, infer)?,
            Some(slot) => {
                let t0 = Instant::now();
                let update = PolicyUpdate::snapshot(self.model)
                    .during("snapshotting weights for actor_infer")?;
                let bytes = update.bytes();
                *slot = Some(update);
                (t0.elapsed().as_secs_f64(), bytes)
            }
        };
        m.insert("time/weight_sync".into(), sync);
        // What the sync handed actor_infer: the model, or under LoRA only the adapter.
        m.insert("weight_sync/bytes".into(), bytes as f64);
        // `rl.eval` of the policy this step made, now in actor_infer: before the step is recorded
        // and checkpointed, so a resume never skips an evaluation, and in the step's record.
        let due = cfg.eval.as_ref().is_some_and(|e| e.due(step, cfg.steps));
        if synced && due && self.evaluate.is_some() {
            self.enter(Phase::Generate, sharing, infer, ctx, &mut m)?;
            let t0 = Instant::now();
            let evaluated = match &self.evaluate {
                Some(evaluate) => Some(evaluate(infer, step)?),
                None => None,
            };
            if let Some(evaluated) = evaluated {
                m.extend(evaluated.metrics);
                let errors = evaluated.reward_errors.into_iter().map(|(d, e, _)| (d, e));
                self.report_reward_errors(ctx, &format!("rl step {step} evaluation"), errors)?;
            }
            m.insert("time/eval".into(), t0.elapsed().as_secs_f64());
        }
        m.insert("time/step".into(), t_step.elapsed().as_secs_f64());
        let mut records = (learned.records)(&advantages);
        if let Some(traces) = &traces {
            attach_traces(&mut records, &learned.record_rows, traces, self.model);
        }
        ctx.record_samples(&records)?;
        if let Some(mut episodes) = learned.episodes {
            for (e, r) in episodes.iter_mut().zip(&records) {
                let lengths: Vec<usize> = e.turns.iter().map(|t| t.response_tokens).collect();
                let parts = r.tokens.as_ref().and_then(|t| t.split(&lengths));
                for (turn, part) in e.turns.iter_mut().zip(parts.into_iter().flatten()) {
                    turn.tokens = Some(part);
                }
            }
            ctx.record_trajectories(&episodes)?;
        }
        ctx.record_step(Stage::Rl, step, cfg.steps, m)?;
        self.checkpoint_due(ctx, cfg, step, learned.mixer)
    }

    /// `rl.eval.before_training`: the policy the stage starts from, which actor_infer holds
    /// before the first step, scored and recorded as step 0 (the baseline of the `val/…` curves).
    pub fn evaluate_before_training(
        &mut self,
        ctx: &mut RunContext<'_>,
        cfg: &RlConfig,
        sharing: &mut TimeSharing,
        infer: &Infer,
    ) -> Result<(), RunError> {
        if self.evaluate.is_none() {
            return Ok(());
        }
        let mut m = Metrics::new();
        self.enter(Phase::Generate, sharing, infer, ctx, &mut m)?;
        let t0 = Instant::now();
        let evaluated = match &self.evaluate {
            Some(evaluate) => evaluate(infer, 0)?,
            None => return Ok(()),
        };
        m.extend(evaluated.metrics);
        let errors = evaluated.reward_errors.into_iter().map(|(d, e, _)| (d, e));
        self.report_reward_errors(ctx, "rl evaluation before training", errors)?;
        m.insert("time/eval".into(), t0.elapsed().as_secs_f64());
        ctx.record_step(Stage::Rl, 0, cfg.steps, m)
    }

    /// Say, once per domain and error, when a reward could not judge responses (a ground truth it
    /// cannot read, no sandbox, a judge that fails to load): they scored 0, and without this the
    /// run would only show a flat reward.
    fn report_reward_errors(
        &mut self,
        ctx: &mut RunContext<'_>,
        at: &str,
        errors: impl Iterator<Item = (String, String)>,
    ) -> Result<(), RunError> {
        let mut new = vec![];
        for (domain, e) in errors {
            // Said once per kind of error: a quoted sample text (a judge's garbage, say) does not
            // make it a new one.
            let kind = e.split('"').next().unwrap_or(&e).trim_end().to_string();
            if self.reward_errors.insert((domain.clone(), kind)) {
                new.push((domain, e));
            }
        }
        for (domain, error) in new {
            ctx.warn(format!(
                "{at}: domain '{domain}': {error} (those responses scored 0; said once)"
            ))?;
        }
        Ok(())
    }

    /// Record the workers' events since the last step; count the rollout's worker restarts.
    fn report_rollout_workers(
        &mut self,
        ctx: &mut RunContext<'_>,
        out: &mut StepRollout,
        m: &mut Metrics,
    ) -> Result<(), RunError> {
        let mut events = std::mem::take(&mut out.worker_events);
        for role in self.residents() {
            events.extend(role.drain_events());
        }
        report_workers(ctx, events)?;
        let workers = &ctx.cfg.workers;
        if workers.reward.mode == PlacementMode::Process {
            m.insert("workers/reward_restarts".into(), out.reward_restarts as f64);
        }
        if workers.actor_infer.mode == PlacementMode::Process {
            m.insert(
                "workers/actor_infer_restarts".into(),
                out.infer_restarts as f64,
            );
        }
        // Workers over TCP: their links' round trips, and what their mirrors moved so far.
        m.extend(crate::worker::link::metrics());
        Ok(())
    }

    /// After the update: count reference replacements, refresh the reference when due
    /// (`rl.kl.refresh_every`), and record which step's policy it is.
    fn refresh_reference(
        &mut self,
        ctx: &RunContext<'_>,
        cfg: &RlConfig,
        sharing: &TimeSharing,
        step: usize,
        m: &mut Metrics,
    ) -> Result<(), RunError> {
        let Some(reference) = self.reference.as_mut() else {
            return Ok(());
        };
        // After this step's reference calls, so a replacement shows in its own step.
        if ctx.cfg.workers.reference.mode == PlacementMode::Process {
            m.insert(
                "workers/reference_restarts".into(),
                reference.restarts() as f64,
            );
        }
        let every = cfg.kl.refresh_every;
        if every > 0 && step.is_multiple_of(every) {
            sharing.refresh_reference(self.model, reference)?;
            self.reference_version = step;
        }
        m.insert(
            "actor/reference_version".into(),
            self.reference_version as f64,
        );
        Ok(())
    }

    /// Checkpoint when due (with the RL state, critic and refreshed reference); true when the stage
    /// must stop now.
    fn checkpoint_due(
        &mut self,
        ctx: &mut RunContext<'_>,
        cfg: &RlConfig,
        step: usize,
        mixer: MixerState,
    ) -> Result<bool, RunError> {
        let (kl_coef, running) = (self.kl_ctl.coef(), self.running.clone());
        let critic = self.critic.as_ref();
        let reference = self
            .reference
            .as_ref()
            .filter(|_| self.reference_version > 0);
        let extras = || CheckpointExtras {
            mixer,
            rl: Some(RlResumeState {
                kl_coef,
                running_reward: running,
                critic_optimizer_steps: critic.map(Critic::steps_taken),
            }),
            critic,
            reference,
        };
        ctx.after_step(
            self.model,
            &self.actor,
            Stage::Rl,
            (step, cfg.steps),
            &mut self.last_checkpoint,
            extras,
        )
    }
}

/// The update's batch from the step's samples in dispatch order.
fn rl_batch(flat: &[(&Prompt, &Sample, usize)], group_size: usize) -> RlBatch {
    RlBatch {
        prompts: flat.iter().map(|(p, _, _)| p.prompt_ids.clone()).collect(),
        responses: flat
            .iter()
            .map(|(_, s, _)| s.completion.token_ids.clone())
            .collect(),
        gen_logprobs: flat
            .iter()
            .map(|(_, s, _)| s.completion.logprobs.clone())
            .collect(),
        rewards: flat.iter().map(|(_, s, _)| s.outcome.score).collect(),
        truncated: flat
            .iter()
            .map(|(_, s, _)| s.completion.finish == FinishReason::Length)
            .collect(),
        correct: flat
            .iter()
            .map(|(_, s, _)| f32::from(u8::from(s.outcome.correct)))
            .collect(),
        response_masks: None,
        advantages: None,
        group_size,
        tags: flat
            .iter()
            .map(|(p, _, _)| p.example.domain.clone())
            .collect(),
    }
}

/// Give each record the traces of its rows, joined, each token decoded alone (special tokens
/// shown: an end-of-turn token is a token the teacher scored too).
fn attach_traces(
    records: &mut [SampleRecord],
    rows: &[std::ops::Range<usize>],
    traces: &[RowTrace],
    model: &LoadedModel,
) {
    let piece = |id: u32| {
        model
            .tokenizer
            .tokenizer
            .decode(&[id], false)
            .unwrap_or_else(|_| format!("<{id}>"))
    };
    for (record, rows) in records.iter_mut().zip(rows) {
        let mine: Vec<&RowTrace> = rows.clone().filter_map(|r| traces.get(r)).collect();
        let mut joined = TokenTrace::default();
        for name in mine.iter().flat_map(|t| t.teachers.keys()) {
            joined.teachers.entry(name.clone()).or_default();
        }
        for t in mine {
            joined.pieces.extend(t.ids.iter().map(|&id| piece(id)));
            joined.student.extend(t.student.iter().map(|&x| finite(x)));
            // A teacher that did not score this row has no log-probs for its tokens.
            for (name, logp) in joined.teachers.iter_mut() {
                match t.teachers.get(name) {
                    Some(theirs) => logp.extend(theirs.iter().map(|&x| finite(x))),
                    None => logp.extend(std::iter::repeat_n(None, t.ids.len())),
                }
            }
        }
        record.tokens = Some(joined);
    }
}

fn sample_record(
    step: usize,
    p: &Prompt,
    s: &Sample,
    version: usize,
    advantage: f32,
) -> SampleRecord {
    SampleRecord {
        step,
        domain: p.example.domain.clone(),
        prompt: p.example.prompt.clone(),
        response: s.text.clone(),
        ground_truth: p.example.ground_truth.clone(),
        reward: s.outcome.score,
        correct: s.outcome.correct,
        breakdown: s.outcome.breakdown(),
        advantage,
        stage: Stage::Rl.as_str().into(),
        prompt_tokens: p.prompt_ids.len(),
        response_tokens: s.completion.token_ids.len(),
        finish_reason: s.completion.finish.as_str().into(),
        policy_version: version,
        tokens: None,
    }
}
