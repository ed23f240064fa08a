//! Sample-level rollout on an in-process actor_infer: prompts are dispatched group by group as the
//! [`SampleScheduler`] asks, the continuous-batching engine admits them as slots free up, and each
//! sample that finishes goes to reward scoring at once (scored while the next decode step runs when
//! rewards live in worker processes). A step's batch is taken as soon as enough groups pass the
//! filter; with α = 0 whatever is still generating is then aborted.

use std::collections::HashMap;
use std::time::Instant;

use super::score_link::{ScoreLink, ScoreReport};
use super::setup::{Domains, Tokenizing};
use super::{RunError, mix_seed};
use crate::config::RlConfig;
use crate::data::Example;
use crate::data::mix::{DomainMixer, MixerState};
use crate::reward::RewardOutcome;
use crate::role::actor_infer::Generator;
use crate::role::reward::ScoreItem;
use crate::rollout::{Completion, Request};
use crate::scheduler::{ReadyGroup, RolloutPolicy, RolloutStats, SampleScheduler};

pub(super) struct Prompt {
    pub example: Example,
    pub prompt_ids: Vec<u32>,
}

#[derive(Clone)]
pub(super) struct Sample {
    pub completion: Completion,
    pub text: String,
    pub outcome: RewardOutcome,
}

/// What a sample contributes to its step's rollout metrics: the batch's samples and those of the
/// groups the filter dropped meanwhile (not those aborted half-way).
pub(super) struct Seen {
    pub domain: String,
    pub outcome: RewardOutcome,
    pub tokens: usize,
    pub truncated: bool,
}

impl Seen {
    fn of(domain: &str, s: &Sample) -> Seen {
        Seen {
            domain: domain.to_string(),
            outcome: s.outcome.clone(),
            tokens: s.completion.token_ids.len(),
            truncated: s.completion.finish == crate::rollout::FinishReason::Length,
        }
    }
}

/// One step's rollout.
pub(super) struct StepRollout {
    pub groups: Vec<ReadyGroup<Prompt, Sample>>,
    pub seen: Vec<Seen>,
    pub stats: RolloutStats,
    pub gen_tokens: usize,
    pub t_generate: f64,
    pub t_reward: f64,
    pub reward_restarts: usize,
    /// actor_infer worker processes replaced so far.
    pub infer_restarts: usize,
    pub worker_events: Vec<crate::metrics::WorkerNote>,
    /// The data cursor after this step's dispatches.
    pub mixer: MixerState,
}

pub(super) fn policy_of(cfg: &RlConfig) -> RolloutPolicy {
    let pps = cfg.prompts_per_step;
    let ds = &cfg.dynamic_sampling;
    let margin = (pps as f64 * ds.oversample).ceil() as usize;
    RolloutPolicy {
        prompts_per_step: pps,
        group_size: cfg.group_size,
        max_prompts_per_version: pps * (1 + if ds.enabled { ds.max_rounds } else { 0 }) + margin,
        oversample: ds.oversample,
        filter_flat: ds.enabled,
        async_ratio: cfg.async_generation_ratio,
    }
}

pub(super) struct Rollout<'a> {
    pub sched: SampleScheduler<Prompt, Sample>,
    link: ScoreLink,
    tok: Tokenizing<'a>,
    data: &'a Domains,
    cfg: &'a RlConfig,
    seed: u64,
    /// Prompts dispatched at the current version (part of each sample's seed).
    ordinal: usize,
    /// Finished samples sent for scoring whose outcomes are not collected yet.
    awaiting: Option<Vec<(u64, Completion, String)>>,
    /// Metric entries of the samples of groups still in flight.
    pending_seen: HashMap<u64, Vec<Seen>>,
    acc: Acc,
}

#[derive(Default)]
struct Acc {
    seen: Vec<Seen>,
    gen_tokens: usize,
    t_generate: f64,
    report: ScoreReport,
}

impl<'a> Rollout<'a> {
    pub fn new(
        cfg: &'a RlConfig,
        tok: Tokenizing<'a>,
        data: &'a Domains,
        link: ScoreLink,
        seed: u64,
        version: usize,
    ) -> Self {
        Rollout {
            sched: SampleScheduler::new(policy_of(cfg), version),
            link,
            tok,
            data,
            cfg,
            seed,
            ordinal: 0,
            awaiting: None,
            pending_seen: HashMap::new(),
            acc: Acc::default(),
        }
    }

    /// The policy moved to `version` (its weights are already in the engine's model): groups that
    /// can no longer train are cancelled.
    pub fn set_version(
        &mut self,
        version: usize,
        engine: &mut dyn Generator,
    ) -> Result<(), RunError> {
        let dead = self.sched.set_version(version);
        self.ordinal = 0;
        self.cancel(&dead, engine)
    }

    fn cancel(&mut self, groups: &[u64], engine: &mut dyn Generator) -> Result<(), RunError> {
        if groups.is_empty() {
            return Ok(());
        }
        for g in groups {
            self.pending_seen.remove(g);
        }
        let gs = self.cfg.group_size as u64;
        engine.abort(&|id| groups.contains(&(id / gs)))
    }

    /// Step until this version's batch is ready (or the dispatch quota ran out).
    pub fn until_batch(
        &mut self,
        engine: &mut dyn Generator,
        mixer: &mut DomainMixer,
    ) -> Result<StepRollout, RunError> {
        loop {
            let progressed = self.step_once(engine, mixer)?;
            if let Some(done) = self.try_batch(engine, mixer, !progressed)? {
                return Ok(done);
            }
        }
    }

    /// Dispatch what the scheduler wants, run one engine step, collect the previous step's rewards
    /// and send this step's finished samples for scoring. Returns false when nothing can move
    /// (engine idle, nothing being scored, nothing wanted).
    pub fn step_once(
        &mut self,
        engine: &mut dyn Generator,
        mixer: &mut DomainMixer,
    ) -> Result<bool, RunError> {
        self.dispatch(engine, mixer)?;
        let t0 = Instant::now();
        let finished = if engine.is_idle() {
            vec![]
        } else {
            engine.step()?
        };
        self.acc.t_generate += t0.elapsed().as_secs_f64();
        let was_scoring = self.awaiting.is_some();
        self.collect()?;
        let generated = !finished.is_empty();
        if generated {
            self.acc.gen_tokens += finished.iter().map(|c| c.token_ids.len()).sum::<usize>();
            self.send(finished)?;
        }
        Ok(generated || was_scoring || !engine.is_idle())
    }

    /// The step's result once its batch is complete; with `stuck` (nothing can move) whatever is
    /// ready is taken, even less than a batch.
    pub fn try_batch(
        &mut self,
        engine: &mut dyn Generator,
        mixer: &DomainMixer,
        stuck: bool,
    ) -> Result<Option<StepRollout>, RunError> {
        let groups = match self.sched.take_batch() {
            Some(g) => g,
            None if stuck => self.sched.take_ready(),
            None => return Ok(None),
        };
        if self.cfg.async_generation_ratio == 0 {
            // Early stop: the batch is complete; what is still generating is not needed.
            let ids = self.sched.abort_in_flight();
            self.cancel(&ids, engine)?;
            self.collect()?;
        }
        let mut acc = std::mem::take(&mut self.acc);
        acc.report.events.extend(engine.drain_events());
        acc.seen.extend(groups.iter().flat_map(|g| {
            g.samples
                .iter()
                .map(|s| Seen::of(&g.prompt.example.domain, s))
        }));
        Ok(Some(StepRollout {
            groups,
            seen: acc.seen,
            stats: self.sched.take_stats(),
            gen_tokens: acc.gen_tokens,
            t_generate: acc.t_generate,
            t_reward: acc.report.seconds,
            reward_restarts: acc.report.restarts,
            infer_restarts: engine.restarts(),
            worker_events: acc.report.events,
            mixer: mixer.state(),
        }))
    }

    fn dispatch(
        &mut self,
        engine: &mut dyn Generator,
        mixer: &mut DomainMixer,
    ) -> Result<(), RunError> {
        let want = self.sched.prompts_wanted();
        if want == 0 {
            return Ok(());
        }
        let version = self.sched.version() as u64;
        for example in mixer.next_batch(want) {
            let prompt_ids = self
                .tok
                .prompt_ids(&example.prompt)
                .map_err(RunError::Setup)?;
            let ordinal = self.ordinal as u64;
            self.ordinal += 1;
            let ids = prompt_ids.clone();
            let group = self.sched.dispatch(Prompt {
                example,
                prompt_ids,
            });
            for i in 0..self.cfg.group_size {
                engine.submit(Request {
                    id: group * self.cfg.group_size as u64 + i as u64,
                    prompt_ids: ids.clone(),
                    params: self.cfg.sampling.clone(),
                    seed: mix_seed(&[self.seed, 3, version, ordinal, i as u64]),
                });
            }
        }
        Ok(())
    }

    fn send(&mut self, finished: Vec<Completion>) -> Result<(), RunError> {
        let gs = self.cfg.group_size as u64;
        let mut items = vec![];
        let mut awaiting = vec![];
        for c in finished {
            let group = c.id / gs;
            // A sample of a group cancelled meanwhile is not scored.
            let Some(prompt) = self.sched.prompt(group) else {
                continue;
            };
            let text = self.tok.decode(&c.token_ids);
            let example = &prompt.example;
            items.push(ScoreItem {
                reward: self.data.reward_of(&example.domain)?.clone(),
                domain: example.domain.clone(),
                prompt: example.prompt.clone(),
                response: text.clone(),
                ground_truth: example.ground_truth.clone(),
                metadata: example.metadata.clone(),
            });
            awaiting.push((group, c, text));
        }
        if !awaiting.is_empty() {
            self.link.send(items)?;
            self.awaiting = Some(awaiting);
        }
        Ok(())
    }

    /// Collect the outcomes of the samples sent last and hand them to the scheduler.
    fn collect(&mut self) -> Result<(), RunError> {
        let Some(awaiting) = self.awaiting.take() else {
            return Ok(());
        };
        let (outcomes, report) = self.link.recv()?;
        self.acc.report.seconds += report.seconds;
        self.acc.report.events.extend(report.events);
        self.acc.report.restarts = report.restarts;
        let gs = self.cfg.group_size as u64;
        for ((group, completion, text), outcome) in awaiting.into_iter().zip(outcomes) {
            let Some(domain) = self.sched.prompt(group).map(|p| p.example.domain.clone()) else {
                continue;
            };
            let index = (completion.id % gs) as usize;
            let sample = Sample {
                completion,
                text,
                outcome,
            };
            let seen = Seen::of(&domain, &sample);
            let reward = sample.outcome.score;
            if !self.sched.finish(group, index, sample, reward) {
                continue;
            }
            let entries = self.pending_seen.entry(group).or_default();
            entries.push(seen);
            if self.sched.prompt(group).is_none() {
                // The group completed: kept groups are counted with their batch, dropped ones now.
                let entries = self.pending_seen.remove(&group).unwrap_or_default();
                if self.sched.take_filtered().contains(&group) {
                    self.acc.seen.extend(entries);
                }
            }
        }
        Ok(())
    }

    /// Stop scoring; the worker events not reported yet.
    pub fn shutdown(self) -> Vec<crate::metrics::WorkerNote> {
        self.link.shutdown()
    }
}

#[cfg(test)]
#[path = "rollout_loop_tests.rs"]
mod tests;
