//! RLVR: sample groups of completions per prompt, score them with rule rewards, and update the policy.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use crate::algo::filter::frac_zero_std;
use crate::algo::kl::{KlController, KlMode};
use crate::algo::normalize::RunningStats;
use crate::config::RlConfig;
use crate::data::Example;
use crate::metrics::{Metrics, SampleRecord};
use crate::model::{LoadedModel, Transformer};
use crate::reward::RewardOutcome;
use crate::rollout::{Completion, FinishReason, Request, generate};
use crate::train::{AdamW, ValueHead};
use crate::worker::ScoreItem;

use super::reward_pool::{RewardScorer, report_workers};
use super::rl_update::{Critic, RlBatch, UpdateState, needs_critic, update};
use super::setup::{Domains, Tokenizing};
use super::{
    CheckpointExtras, PipelineError, PipelineEvent, Resume, RunContext, RunStatus, TensorContext,
    mix_seed,
};
use crate::train::checkpoint::{RlResumeState, load_moments, load_trainer_state, load_vars};

/// One scored sample.
#[derive(Clone)]
struct Scored {
    example: Example,
    prompt_ids: Vec<u32>,
    completion: Completion,
    text: String,
    outcome: RewardOutcome,
}

pub fn run_rlvr(
    ctx: &mut RunContext<'_>,
    cfg: &RlConfig,
    model: &LoadedModel,
    data: &Domains,
    resume: Option<&Resume>,
) -> Result<(RunStatus, Option<PathBuf>), PipelineError> {
    let seed = ctx.cfg.seed;
    let mut mixer = data.mixer(mix_seed(&[seed, 2]))?;
    let updates_per_step = cfg.ppo_epochs * cfg.mini_batches;
    let vars: Vec<_> = model.transformer.params().named_vars();
    let mut opt = AdamW::new(vars, cfg.optimizer.clone(), cfg.steps * updates_per_step)
        .during("rl optimizer setup")?;
    let frozen_copy = || -> Result<Transformer, PipelineError> {
        let params = model
            .transformer
            .params()
            .deep_clone()
            .during("copying the policy")?;
        Transformer::new(model.config().clone(), params).during("copying the policy")
    };
    // The reference is the policy as the stage began; a resumed stage reloads it from disk.
    let reference = match (cfg.kl.mode != KlMode::None, resume) {
        (false, _) => None,
        (true, None) => Some(frozen_copy()?),
        (true, Some(_)) => Some(super::setup::rl_start_policy(ctx.cfg)?.transformer),
    };
    let mut critic = match (&cfg.critic, needs_critic(cfg.adv_estimator)) {
        (Some(c), true) => {
            let net = frozen_copy()?;
            let head = ValueHead::new(model.config().hidden_size, model.transformer.device())
                .during("value head")?;
            let mut vars: Vec<_> = net.params().named_vars();
            vars.extend(head.vars());
            let opt = AdamW::new(vars, c.optimizer.clone(), cfg.steps * updates_per_step)
                .during("critic optimizer")?;
            Some(Critic {
                model: net,
                head,
                opt,
            })
        }
        _ => None,
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
        let device = model.transformer.device();
        let (_, moments) = load_trainer_state(&r.dir, device)?;
        opt.restore(r.state.optimizer_steps, &moments)
            .during("restoring the rl optimizer")?;
        if let Some(m) = &r.state.mixer {
            mixer.restore(m)?;
        }
        let rl = r.state.rl.as_ref().ok_or_else(|| {
            PipelineError::Setup(format!("checkpoint '{}' has no RL state", r.dir.display()))
        })?;
        kl_ctl.set_coef(rl.kl_coef);
        running = rl.running_reward.clone();
        if let Some(c) = critic.as_mut() {
            let mut vars = c.model.params().named_vars();
            vars.extend(c.head.vars());
            load_vars(&vars, &r.dir.join("critic.safetensors"))?;
            let moments = load_moments(&r.dir.join("critic_optimizer.safetensors"), device)?;
            c.opt
                .restore(rl.critic_optimizer_steps.unwrap_or(0), &moments)
                .during("restoring the critic optimizer")?;
        }
        first_step = r.state.step + 1;
    }
    let tok = Tokenizing {
        model,
        chat_template: data.chat_template,
    };
    let detok = |ids: &[u32]| tok.decode(ids);
    ctx.emit(PipelineEvent::StageStarted {
        stage: "rl".into(),
        total_steps: cfg.steps,
        done_steps: first_step - 1,
    });
    let mut scorer = RewardScorer::start(&ctx.cfg.workers.reward)?;
    let mut last = None;
    for step in first_step..=cfg.steps {
        let t_step = Instant::now();
        let mut m = Metrics::new();
        // Rollout, with dynamic-sampling refills of groups that carry no signal.
        let (mut groups, mut dropped, mut rounds) = (Vec::<Vec<Scored>>::new(), 0usize, 0usize);
        let (mut t_rollout, mut t_reward, mut gen_tokens) = (0.0, 0.0, 0usize);
        let mut all_scored: Vec<Vec<Scored>> = vec![];
        loop {
            let want = cfg.prompts_per_step - groups.len();
            let prompts = mixer.next_batch(want);
            let mut requests = vec![];
            let mut prompt_ids = vec![];
            for (pi, ex) in prompts.iter().enumerate() {
                let ids = tok.prompt_ids(&ex.prompt).map_err(PipelineError::Setup)?;
                for g in 0..cfg.group_size {
                    requests.push(Request {
                        id: (pi * cfg.group_size + g) as u64,
                        prompt_ids: ids.clone(),
                        params: cfg.sampling.clone(),
                        seed: mix_seed(&[seed, 3, step as u64, rounds as u64, pi as u64, g as u64]),
                    });
                }
                prompt_ids.push(ids);
            }
            let t0 = Instant::now();
            let completions = generate(
                &model.transformer,
                &model.eos_ids,
                requests,
                cfg.rollout_batch,
                Some(&detok),
            )
            .during("rollout")?;
            t_rollout += t0.elapsed().as_secs_f64();
            gen_tokens += completions.iter().map(|c| c.token_ids.len()).sum::<usize>();
            let t1 = Instant::now();
            let texts: Vec<String> = completions
                .iter()
                .map(|c| tok.decode(&c.token_ids))
                .collect();
            let items = completions
                .iter()
                .zip(&texts)
                .map(|(c, text)| {
                    let ex = &prompts[c.id as usize / cfg.group_size];
                    ScoreItem {
                        kind: data.reward_of(&ex.domain),
                        response: text.clone(),
                        ground_truth: ex.ground_truth.clone(),
                    }
                })
                .collect();
            let outcomes = scorer.score(items)?;
            let mut scored: Vec<Scored> = completions
                .into_iter()
                .zip(texts)
                .zip(outcomes)
                .map(|((c, text), outcome)| {
                    let pi = c.id as usize / cfg.group_size;
                    Scored {
                        prompt_ids: prompt_ids[pi].clone(),
                        example: prompts[pi].clone(),
                        completion: c,
                        text,
                        outcome,
                    }
                })
                .collect();
            t_reward += t1.elapsed().as_secs_f64();
            let mut round_groups = vec![];
            while !scored.is_empty() {
                let rest = scored.split_off(cfg.group_size.min(scored.len()));
                round_groups.push(std::mem::replace(&mut scored, rest));
            }
            for grp in round_groups {
                let rewards: Vec<f32> = grp.iter().map(|s| s.outcome.score).collect();
                let flat = rewards.iter().all(|r| (r - rewards[0]).abs() <= 1e-6);
                if cfg.dynamic_sampling.enabled && flat {
                    dropped += 1;
                    all_scored.push(grp);
                } else {
                    groups.push(grp);
                }
            }
            rounds += 1;
            if !cfg.dynamic_sampling.enabled
                || groups.len() >= cfg.prompts_per_step
                || rounds > cfg.dynamic_sampling.max_rounds
            {
                break;
            }
        }
        // Rollout statistics cover every sample generated this step, kept or dropped.
        all_scored.extend(groups.iter().cloned());
        rollout_metrics(&mut m, &all_scored, cfg);
        m.insert("group/dropped".into(), dropped as f64);
        report_workers(ctx, scorer.drain_events())?;
        if let RewardScorer::Pool(_) = scorer {
            m.insert("workers/reward_restarts".into(), scorer.restarts() as f64);
        }
        m.insert("time/rollout".into(), t_rollout);
        m.insert("time/reward".into(), t_reward);
        m.insert(
            "system/tokens_per_s".into(),
            gen_tokens as f64 / t_rollout.max(1e-9),
        );

        let mut advantages = vec![0f32; groups.iter().map(|g| g.len()).sum()];
        if !groups.is_empty() {
            let flat: Vec<&Scored> = groups.iter().flatten().collect();
            let batch = RlBatch {
                prompts: flat.iter().map(|s| s.prompt_ids.clone()).collect(),
                responses: flat
                    .iter()
                    .map(|s| s.completion.token_ids.clone())
                    .collect(),
                gen_logprobs: flat.iter().map(|s| s.completion.logprobs.clone()).collect(),
                rewards: flat.iter().map(|s| s.outcome.score).collect(),
                truncated: flat
                    .iter()
                    .map(|s| s.completion.finish == FinishReason::Length)
                    .collect(),
                correct: flat
                    .iter()
                    .map(|s| if s.outcome.correct { 1.0 } else { 0.0 })
                    .collect(),
                group_size: cfg.group_size,
            };
            let state = UpdateState {
                opt: &mut opt,
                reference: reference.as_ref(),
                critic: critic.as_mut(),
                kl_ctl: &mut kl_ctl,
                running: &mut running,
                seed: mix_seed(&[seed, 4, step as u64]),
            };
            let out = update(cfg, model, state, &batch)?;
            advantages = out.sample_advantages;
            m.extend(out.metrics);
        } else {
            ctx.warn(format!(
                "rl step {step}: every group had equal rewards; no update"
            ))?;
        }
        m.insert("time/step".into(), t_step.elapsed().as_secs_f64());
        let samples: Vec<SampleRecord> = groups
            .iter()
            .flatten()
            .zip(&advantages)
            .map(|(s, a)| SampleRecord {
                step,
                domain: s.example.domain.clone(),
                prompt: s.example.prompt.clone(),
                response: s.text.clone(),
                ground_truth: s.example.ground_truth.clone(),
                reward: s.outcome.score,
                correct: s.outcome.correct,
                breakdown: [
                    (
                        "correct".to_string(),
                        f64::from(u8::from(s.outcome.correct)),
                    ),
                    (
                        "format_ok".to_string(),
                        f64::from(u8::from(s.outcome.format_ok)),
                    ),
                ]
                .into_iter()
                .collect(),
                advantage: *a,
                stage: "rl".into(),
                prompt_tokens: s.prompt_ids.len(),
                response_tokens: s.completion.token_ids.len(),
                finish_reason: format!("{:?}", s.completion.finish).to_lowercase(),
                policy_version: step - 1,
            })
            .collect();
        ctx.record_samples(&samples)?;
        ctx.record_step("rl", step, cfg.steps, m)?;
        let extras = || CheckpointExtras {
            mixer: mixer.state(),
            rl: Some(RlResumeState {
                kl_coef: kl_ctl.coef(),
                running_reward: running.clone(),
                critic_optimizer_steps: critic.as_ref().map(|c| c.opt.steps_taken()),
            }),
            critic: critic.as_ref(),
        };
        if ctx.after_step(model, &opt, "rl", (step, cfg.steps), &mut last, extras)? {
            let events = scorer.shutdown();
            report_workers(ctx, events)?;
            return Ok((RunStatus::Interrupted, last));
        }
    }
    let events = scorer.shutdown();
    report_workers(ctx, events)?;
    Ok((RunStatus::Finished, last))
}

/// Per-domain reward and accuracy, response lengths, and the share of groups without signal.
fn rollout_metrics(m: &mut Metrics, groups: &[Vec<Scored>], cfg: &RlConfig) {
    let mut by_domain: BTreeMap<&str, Vec<&Scored>> = BTreeMap::new();
    for s in groups.iter().flatten() {
        by_domain
            .entry(s.example.domain.as_str())
            .or_default()
            .push(s);
    }
    for (domain, samples) in &by_domain {
        let rewards: Vec<f64> = samples.iter().map(|s| s.outcome.score as f64).collect();
        let n = rewards.len() as f64;
        let mean = rewards.iter().sum::<f64>() / n;
        let std = (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n).sqrt();
        let acc = samples.iter().filter(|s| s.outcome.correct).count() as f64 / n;
        let fmt = samples.iter().filter(|s| s.outcome.format_ok).count() as f64 / n;
        m.insert(format!("reward/{domain}/mean"), mean);
        m.insert(format!("reward/{domain}/std"), std);
        m.insert(format!("score/{domain}/accuracy"), acc);
        m.insert(format!("score/{domain}/format_ok"), fmt);
    }
    let lens: Vec<usize> = groups
        .iter()
        .flatten()
        .map(|s| s.completion.token_ids.len())
        .collect();
    if !lens.is_empty() {
        m.insert(
            "response_length/mean".into(),
            lens.iter().sum::<usize>() as f64 / lens.len() as f64,
        );
        m.insert(
            "response_length/max".into(),
            *lens.iter().max().unwrap_or(&0) as f64,
        );
        let clipped = groups
            .iter()
            .flatten()
            .filter(|s| s.completion.finish == FinishReason::Length)
            .count();
        m.insert(
            "response_length/clip_ratio".into(),
            clipped as f64 / lens.len() as f64,
        );
    }
    let rewards: Vec<f32> = groups.iter().flatten().map(|s| s.outcome.score).collect();
    if !rewards.is_empty() {
        m.insert(
            "group/frac_zero_std".into(),
            frac_zero_std(&rewards, cfg.group_size) as f64,
        );
    }
}
