//! Agentic RL with α > 0 (`rl.async_generation_ratio`): actor_infer plays episodes in a thread of
//! its own, on its own devices, α steps ahead of the trainer. Each step's episodes are played
//! with one policy version; the trainer asks for step `s` with the weights of version `s − 1`, and
//! gets the oldest step played ahead, at most α versions older (staleness applies per trajectory,
//! and every trajectory of a step shares its version). New weights reach actor_infer between two
//! steps' episodes, never in the middle of an episode.
//!
//! actor_infer always fills its α steps ahead before it waits for the trainer, so step `s` is
//! played by the policy of version `max(0, s − 1 − α)` whatever the timing: an asynchronous run is
//! as repeatable as a synchronous one. A step that would still be too stale (it cannot happen on
//! this schedule) is dropped and counted rather than trained on.

use std::collections::VecDeque;
use std::sync::mpsc;

use super::episodes::EpisodeRunner;
use super::{LearnStep, Played, play_step};
use crate::config::RlConfig;
use crate::metrics::Metrics;
use crate::pipeline::ahead::{Ask, drive_ahead};
use crate::pipeline::rl_learner::Learner;
use crate::pipeline::time_sharing::TimeSharing;
use crate::pipeline::{RunContext, RunError, RunStatus};
use crate::role::actor_infer::Infer;
use crate::scheduler::Phase;

/// A step's episodes, with how many steps played ahead were dropped as too stale before it.
type Answer = Result<(Played, usize), RunError>;

pub(super) fn train_ahead(
    ctx: &mut RunContext<'_>,
    cfg: &RlConfig,
    learner: &mut Learner<'_>,
    sharing: &mut TimeSharing,
    infer: &Infer,
    runner: &EpisodeRunner<'_>,
) -> Result<RunStatus, RunError> {
    // The trainer's devices are its own: place its roles once.
    learner.enter(Phase::Generate, sharing, infer, ctx, &mut Metrics::new())?;
    let first = learner.first_step;
    drive_ahead(
        first..=cfg.steps,
        |asks, out| play_ahead(cfg, runner, infer, first, &asks, out),
        |step, (mut played, dropped): (Played, usize), weights, t_step| {
            // Its episodes' seeds are those of the step it was played as; it trains as this one.
            played.step = step;
            let mut m = Metrics::new();
            m.insert("async/dropped_steps".into(), dropped as f64);
            let learn = LearnStep {
                cfg,
                runner,
                handoff: Some(weights),
                t_step,
            };
            learn.run(ctx, learner, sharing, infer, played, m)
        },
    )
}

/// The actor_infer thread: fill α steps ahead, then answer each ask with the oldest one fresh
/// enough (or play it then), taking new weights between two steps.
fn play_ahead(
    cfg: &RlConfig,
    runner: &EpisodeRunner<'_>,
    infer: &Infer,
    first: usize,
    asks: &mpsc::Receiver<Ask>,
    out: &mpsc::Sender<Answer>,
) -> Result<(), RunError> {
    let alpha = cfg.async_generation_ratio.max(1);
    let tok = runner.format.tok;
    let detok = move |ids: &[u32]| tok.decode(ids);
    let mut engine = infer.generator(tok.model.eos_ids.clone(), cfg.rollout_batch, &detok);
    // The policy version actor_infer holds, and the next step to play.
    let (mut version, mut next) = (first - 1, first);
    let mut ready: VecDeque<Played> = VecDeque::new();
    loop {
        // Ahead first, then wait: the schedule does not depend on timing.
        if ready.len() < alpha && next <= cfg.steps {
            ready.push_back(play_step(runner, engine.as_mut(), next, version)?);
            next += 1;
            continue;
        }
        let Ok(ask) = asks.recv() else {
            return Ok(());
        };
        if let Some(w) = ask.weights {
            infer.set_weights(&w)?;
            engine.forget_prefixes();
            version = ask.step - 1;
        }
        // A step played more than α versions before the one asked for is too stale.
        let before = ready.len();
        ready.retain(|p| p.version + alpha >= ask.step - 1);
        let dropped = before - ready.len();
        let played = match ready.pop_front() {
            Some(p) => p,
            None => {
                let p = play_step(runner, engine.as_mut(), next, version)?;
                next += 1;
                p
            }
        };
        if out.send(Ok((played, dropped))).is_err() {
            return Ok(());
        }
    }
}
