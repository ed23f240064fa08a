//! `rl.eval`: the policy scored on each domain's held-out prompts between steps, with the domain's
//! own reward: `val/<domain>/mean@k` (the mean reward of the k samples of every prompt),
//! `val/<domain>/pass@k` (the share of prompts with at least one correct sample), `accuracy` (the
//! share of correct samples), `response_length` and `prompts`. The held-out prompts are set aside
//! when the domains load ([`split_held_out`] or `val_path`), so no stage ever trains on them.

use std::collections::{BTreeMap, HashSet};

use super::setup::{Domains, Tokenizing};
use crate::config::RlEval;
use crate::data::Example;
use crate::metrics::Metrics;
use crate::reward::RewardOutcome;
use crate::role::RunError;
use crate::role::actor_infer::Generator;
use crate::role::reward::ScoreItem;
use crate::role::reward::SharedScorer;
use crate::rollout::{Completion, Request, SamplingParams};
use crate::seed::{fnv1a, mix_seed};

/// Splits `examples` into (train, held out): `fraction` of their distinct prompts (at least one)
/// held out with every example that asks them, so a held-out prompt is never trained on even
/// when the data repeats it. Which prompts is decided by `seed` and each prompt's text, not by
/// the order; each part keeps the examples' order.
pub fn split_held_out(
    examples: Vec<Example>,
    fraction: f64,
    seed: u64,
) -> Result<(Vec<Example>, Vec<Example>), String> {
    let mut distinct: Vec<&str> = examples.iter().map(|e| e.prompt.as_str()).collect();
    distinct.sort_unstable();
    distinct.dedup();
    let n = distinct.len();
    let held = ((fraction * n as f64).round() as usize).max(1);
    if held >= n {
        return Err(format!(
            "val_split {fraction} of {n} distinct prompts leaves none to train on"
        ));
    }
    let mut ranked: Vec<(u64, &str)> = distinct
        .into_iter()
        .map(|p| (mix_seed(&[seed, fnv1a(p.as_bytes())]), p))
        .collect();
    ranked.sort_unstable();
    let held: HashSet<String> = ranked[..held].iter().map(|(_, p)| p.to_string()).collect();
    Ok(examples
        .into_iter()
        .partition(|e| !held.contains(&e.prompt)))
}

/// `train` without the examples whose prompt is one of `val`'s (a test file that repeats
/// training prompts): held-out prompts are never trained on.
pub fn without_held_out(train: Vec<Example>, val: &[Example]) -> Vec<Example> {
    let held: HashSet<&str> = val.iter().map(|e| e.prompt.as_str()).collect();
    train
        .into_iter()
        .filter(|e| !held.contains(e.prompt.as_str()))
        .collect()
}

/// One scored sample of a held-out prompt.
pub struct ValSample {
    pub prompt: usize,
    pub outcome: RewardOutcome,
    pub tokens: usize,
}

/// A domain's `val/<domain>/…` metrics from its samples, `k` per prompt.
pub fn val_metrics(domain: &str, k: usize, samples: &[ValSample]) -> Metrics {
    let mut m = Metrics::new();
    if samples.is_empty() {
        return m;
    }
    let n = samples.len() as f64;
    let mut any_correct: BTreeMap<usize, bool> = BTreeMap::new();
    for s in samples {
        *any_correct.entry(s.prompt).or_default() |= s.outcome.correct;
    }
    let mean = |f: &dyn Fn(&ValSample) -> f64| samples.iter().map(f).sum::<f64>() / n;
    let key = |name: &str| format!("val/{domain}/{name}");
    m.insert(
        key(&format!("mean@{k}")),
        mean(&|s| f64::from(s.outcome.score)),
    );
    m.insert(
        key("accuracy"),
        mean(&|s| f64::from(u8::from(s.outcome.correct))),
    );
    let passed = any_correct.values().filter(|c| **c).count();
    m.insert(
        key(&format!("pass@{k}")),
        passed as f64 / any_correct.len() as f64,
    );
    m.insert(key("response_length"), mean(&|s| s.tokens as f64));
    m.insert(key("prompts"), any_correct.len() as f64);
    m
}

/// A held-out prompt's sample as generated and scored.
pub struct ScoredSample<'d> {
    pub domain: &'d str,
    pub example: &'d Example,
    /// Which distinct prompt of the evaluation it answers.
    pub prompt: usize,
    pub completion: Completion,
    pub response: String,
    pub outcome: RewardOutcome,
}

/// An evaluation's scored samples, `k` per prompt, in prompt order.
pub struct Scored<'d> {
    pub k: usize,
    pub samples: Vec<ScoredSample<'d>>,
}

impl Scored<'_> {
    /// Every domain's `val/<domain>/…` metrics.
    pub fn metrics(&self) -> Metrics {
        let mut by_domain: BTreeMap<&str, Vec<ValSample>> = BTreeMap::new();
        for s in &self.samples {
            by_domain.entry(s.domain).or_default().push(ValSample {
                prompt: s.prompt,
                outcome: s.outcome.clone(),
                tokens: s.completion.token_ids.len(),
            });
        }
        let mut m = Metrics::new();
        for (domain, samples) in by_domain {
            m.extend(val_metrics(domain, self.k, &samples));
        }
        m
    }

    /// The rewards' errors (a ground truth the reward cannot read, no sandbox): (domain, the
    /// first error of its kind, how many samples errors of that kind made score 0), once per
    /// domain and kind — the text before any quoted sample text, as training reports them (a
    /// judge's errors quote its output, and would otherwise be one per answer).
    pub fn reward_errors(&self) -> Vec<(String, String, usize)> {
        let mut errors: BTreeMap<(&str, &str), (&str, usize)> = BTreeMap::new();
        for s in &self.samples {
            if let Some(e) = &s.outcome.error {
                let kind = e.split('"').next().unwrap_or(e).trim_end();
                errors.entry((s.domain, kind)).or_insert((e.as_str(), 0)).1 += 1;
            }
        }
        errors
            .into_iter()
            .map(|((d, _), (e, n))| (d.to_string(), e.to_string(), n))
            .collect()
    }
}

/// What an evaluation gives the step it runs in: its metrics, and the rewards' errors.
pub struct Evaluated {
    pub metrics: Metrics,
    pub reward_errors: Vec<(String, String, usize)>,
}

/// What an evaluation needs besides the policy: the settings, the data and the scorer.
pub struct Evaluation<'a> {
    /// The run's sampling (`max_new_tokens`, stop strings); the temperature is the eval's.
    pub sampling: &'a SamplingParams,
    pub data: &'a Domains,
    pub tok: Tokenizing<'a>,
    pub scorer: SharedScorer,
    pub seed: u64,
}

impl<'a> Evaluation<'a> {
    /// [`Evaluation::score`]'s metrics and reward errors.
    pub fn run(
        &self,
        eval: &RlEval,
        engine: &mut dyn Generator,
        step: usize,
    ) -> Result<Evaluated, RunError> {
        let scored = self.score(eval, engine, step, &mut |_, _| {})?;
        Ok(Evaluated {
            metrics: scored.metrics(),
            reward_errors: scored.reward_errors(),
        })
    }

    /// The distinct held-out prompts an evaluation asks, with their domains: each domain's
    /// first `eval.max_prompts`.
    pub fn prompts(&self, eval: &RlEval) -> Vec<(&'a str, &'a Example)> {
        let mut prompts = vec![];
        for d in &self.data.domains {
            // Each distinct prompt once: a held-out set that repeats a prompt does not weigh it
            // more, nor spend more generation on it.
            let mut seen = HashSet::new();
            let distinct = d.val.iter().filter(|e| seen.insert(e.prompt.as_str()));
            let take = eval.max_prompts.unwrap_or(usize::MAX);
            prompts.extend(distinct.take(take).map(|e| (d.name.as_str(), e)));
        }
        prompts
    }

    /// Generates `eval.samples` responses to each held-out prompt with the policy behind
    /// `engine` and scores them with their domain's reward; `progress(done, total)` hears of
    /// each finished sample. Seeds depend on `step` only, so an evaluation is the same whatever
    /// the training around it did.
    pub fn score(
        &self,
        eval: &RlEval,
        engine: &mut dyn Generator,
        step: usize,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Scored<'a>, RunError> {
        let params = SamplingParams {
            temperature: eval.temperature,
            ..self.sampling.clone()
        };
        let k = eval.samples;
        let prompts = self.prompts(eval);
        let positions = self.tok.model.config().max_position_embeddings;
        for (p, (_, example)) in prompts.iter().enumerate() {
            let ids = self.tok.prompt_ids(&example.prompt).map_err(|e| {
                RunError::Setup(format!("held-out prompt '{}': {e}", example.prompt))
            })?;
            // Refused before any generation: the engine would stop at the first such prompt.
            if ids.len().saturating_add(params.max_new_tokens) > positions {
                return Err(RunError::Setup(format!(
                    "held-out prompt '{}' is {} tokens and answers may take {} more \
                     (max_new_tokens), but the model holds {positions} positions: allow {} \
                     new tokens or fewer",
                    crate::text::clean(&example.prompt, 60, false),
                    ids.len(),
                    params.max_new_tokens,
                    positions.saturating_sub(ids.len())
                )));
            }
            for i in 0..k {
                engine.submit(Request {
                    id: (p * k + i) as u64,
                    prompt_ids: ids.clone(),
                    params: params.clone(),
                    seed: mix_seed(&[self.seed, 9, step as u64, p as u64, i as u64]),
                });
            }
        }
        let total = prompts.len() * k;
        let mut done = vec![];
        while !engine.is_idle() {
            done.extend(engine.step()?);
            progress(done.len(), total);
        }
        done.sort_by_key(|c| c.id);
        let mut items = vec![];
        for c in &done {
            let (domain, example) = prompts[c.id as usize / k];
            items.push(ScoreItem {
                reward: self.data.reward_of(domain)?.clone(),
                domain: domain.to_string(),
                prompt: example.prompt.clone(),
                response: self.tok.decode(&c.token_ids),
                ground_truth: example.ground_truth.clone(),
                metadata: example.metadata.clone(),
            });
        }
        let outcomes = self.scorer.lock().score(items.clone())?;
        let samples = done
            .into_iter()
            .zip(items)
            .zip(outcomes)
            .map(|((completion, item), outcome)| {
                let prompt = completion.id as usize / k;
                let (domain, example) = prompts[prompt];
                ScoredSample {
                    domain,
                    example,
                    prompt,
                    completion,
                    response: item.response,
                    outcome,
                }
            })
            .collect();
        Ok(Scored { k, samples })
    }
}

#[cfg(test)]
#[path = "rl_eval_tests.rs"]
mod tests;
