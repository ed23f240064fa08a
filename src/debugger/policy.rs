//! A model as the debugged episode's policy. The prompt of a turn is built exactly as a rollout
//! builds it (the run's chat template or plain transcript, instruction, trajectory or step mode,
//! token budget), so what the debugger shows is what training sees. Sampling goes through the
//! same engine as rollouts; the per-token detail (log-prob, entropy, most likely alternatives)
//! comes from one teacher-forced forward pass over prompt and output.
//!
//! Building a prompt is cheap and needs the session; drawing needs only the prompt, so a front-end
//! builds the prompt on its own thread and draws on another.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::DType;

use super::session::Session;
use crate::config::EnvConfig;
use crate::env::ActionParser;
use crate::model::chat_template::TemplateOptions;
use crate::model::threads::on_the_pool;
use crate::model::{LoadedModel, Numerics};
use crate::pipeline::agentic::turns::{TurnFormat, step_content};
use crate::pipeline::setup::Tokenizing;
use crate::rollout::{Completion, Engine, FinishReason, Request, SamplingParams};
use crate::seed::mix_seed;
use crate::train::TrainBatch;
use crate::train::batch::response_hidden;

/// Sampling settings given by hand, over a model's own (a run's `rl.sampling`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplingOverrides {
    pub temperature: Option<f64>,
    pub top_k: Option<usize>,
    pub top_p: Option<f64>,
    pub max_new_tokens: Option<usize>,
}

impl SamplingOverrides {
    /// Every setting of `s`.
    pub fn all(s: &SamplingParams) -> SamplingOverrides {
        SamplingOverrides {
            temperature: Some(s.temperature),
            top_k: Some(s.top_k),
            top_p: Some(s.top_p),
            max_new_tokens: Some(s.max_new_tokens),
        }
    }

    pub fn apply(&self, s: &mut SamplingParams) {
        s.temperature = self.temperature.unwrap_or(s.temperature);
        s.top_k = self.top_k.unwrap_or(s.top_k);
        s.top_p = self.top_p.unwrap_or(s.top_p);
        s.max_new_tokens = self.max_new_tokens.unwrap_or(s.max_new_tokens);
    }
}

/// The error of a draw stopped by its cancel flag.
pub const CANCELLED: &str = "cancelled";

/// One token of a model's output.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenView {
    pub id: u32,
    /// The token's text (special tokens by name).
    pub text: String,
    /// Log-probability under the sampling temperature (what training uses as the old log-prob).
    pub logprob: f32,
    /// Entropy (nats) of the distribution the token was drawn from.
    pub entropy: f32,
    /// The most likely tokens at this position, most likely first: text and probability.
    pub alternatives: Vec<(String, f32)>,
}

/// What a model's turn was, beyond its output text.
#[derive(Debug, Clone)]
pub struct ModelTurn {
    /// The exact prompt, special tokens written out.
    pub prompt_text: String,
    pub prompt_tokens: usize,
    pub output_ids: Vec<u32>,
    pub finish: FinishReason,
    pub tokens: Vec<TokenView>,
}

/// A turn's prompt in token ids, and as text.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub ids: Vec<u32>,
    pub text: String,
    /// Tokens the output may take: the sampling limit within what is left of the budget.
    pub max_new_tokens: usize,
}

/// How often one kind of output came out of N draws.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionCount {
    /// The parsed action, or `None` for output in which no action was found.
    pub action: Option<String>,
    /// The environment lists its valid actions and this is not one of them.
    pub unknown: bool,
    pub count: usize,
}

/// The distribution of actions over N draws of one turn, most frequent first.
#[derive(Debug, Clone, PartialEq)]
pub struct Resample {
    pub draws: usize,
    pub counts: Vec<ActionCount>,
    /// Mean log-probability of a draw's tokens.
    pub mean_logprob: f64,
}

/// A model acting as the policy, with its sampling settings. Cloning shares the model (a
/// front-end hands a copy to the thread that draws).
#[derive(Clone)]
pub struct ModelPolicy {
    /// Where the model came from (`runs/x/checkpoints/rl-step20`, `RUN@20`), for display.
    pub source: String,
    model: Arc<LoadedModel>,
    chat_template: bool,
    /// The run's `data.chat_template_options` (none for a model opened on its own).
    pub template_options: TemplateOptions,
    /// The prompt's shape: the debugged env's config ([`ModelPolicy::for_env`]), and the text
    /// before its first observation.
    env: EnvConfig,
    instruction: Option<String>,
    /// `env` and `instruction` were worked out for `env` ([`ModelPolicy::for_env`]).
    shaped: bool,
    /// The `rl.env` of the run the checkpoint came from (what the model was trained on).
    pub run_env: Option<EnvConfig>,
    pub sampling: SamplingParams,
    /// Alternatives shown per token.
    pub alternatives: usize,
}

impl std::fmt::Debug for ModelPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelPolicy")
            .field("source", &self.source)
            .field("sampling", &self.sampling)
            .finish_non_exhaustive()
    }
}

impl ModelPolicy {
    /// A policy prompting for episodes of `env` (see [`ModelPolicy::for_env`]).
    pub fn new(
        source: String,
        model: LoadedModel,
        chat_template: bool,
        env: &EnvConfig,
        sampling: SamplingParams,
    ) -> Result<ModelPolicy, String> {
        let mut policy = ModelPolicy {
            source,
            model: Arc::new(model),
            chat_template,
            template_options: TemplateOptions::default(),
            env: env.clone(),
            instruction: None,
            shaped: false,
            run_env: None,
            sampling,
            alternatives: 5,
        };
        policy.for_env(env)?;
        Ok(policy)
    }

    /// Prompt for episodes of `env` as a rollout of it would: its mode and history, token budget,
    /// and instruction (its own, or with a chat template the sentence naming the env and its
    /// action format).
    /// The same env again changes nothing: its default instruction probes the env (a reset,
    /// which starts an external env's program), and a front-end shapes the prompt at load and
    /// again whenever the env may have changed.
    pub fn for_env(&mut self, env: &EnvConfig) -> Result<(), String> {
        if self.shaped && self.env == *env {
            return Ok(());
        }
        self.instruction = match (&env.instruction, self.chat_template) {
            (Some(i), _) => Some(i.clone()),
            (None, true) => Some(
                crate::pipeline::agentic::default_instruction(env).map_err(|e| e.to_string())?,
            ),
            (None, false) => None,
        };
        self.env = env.clone();
        self.shaped = true;
        Ok(())
    }

    pub fn model(&self) -> &LoadedModel {
        &self.model
    }

    fn tok(&self) -> Tokenizing<'_> {
        Tokenizing {
            model: &self.model,
            chat_template: self.chat_template,
            template_options: &self.template_options,
        }
    }

    fn format(&self) -> TurnFormat<'_> {
        TurnFormat {
            tok: self.tok(),
            instruction: self.instruction.as_deref(),
        }
    }

    fn budget(&self) -> usize {
        let positions = self.model.config().max_position_embeddings;
        self.env
            .max_trajectory_tokens
            .map_or(positions, |b| b.min(positions))
    }

    /// The prompt of the session's next turn, as a rollout would build it: earlier model turns
    /// keep the ids they sampled, other turns' outputs are tokenized.
    pub fn prompt(&self, session: &Session) -> Result<Prompt, String> {
        let format = self.format();
        let ids = if self.env.mode == crate::config::EnvMode::Step {
            let history: Vec<(Option<&str>, f64)> = session
                .turns
                .iter()
                .map(|t| (t.parsed_action().filter(|_| t.valid()), t.step.reward))
                .collect();
            format
                .first(&step_content(&self.env, &history, session.observation()))
                .map_err(|e| format!("the observation {e}"))?
        } else {
            let mut ids = format
                .first(session.first_observation())
                .map_err(|e| format!("the first observation {e}"))?;
            for (i, t) in session.turns.iter().enumerate() {
                let output = match &t.model {
                    Some(m) => m.output_ids.clone(),
                    None => self
                        .tok()
                        .encode(&t.output)
                        .map_err(|e| format!("turn {}'s output {e}", i + 1))?,
                };
                ids.extend(
                    format
                        .next(&output, &t.step.observation)
                        .map(|between| output.iter().copied().chain(between))
                        .map_err(|e| format!("turn {}'s observation {e}", i + 1))?,
                );
            }
            ids
        };
        let budget = self.budget();
        let room = budget.saturating_sub(ids.len());
        if room == 0 {
            return Err(format!(
                "the conversation takes {} tokens and fills the budget of {budget} \
                 (max_trajectory_tokens, or the model's max_position_embeddings): a rollout \
                 would cut the episode here",
                ids.len()
            ));
        }
        // A run's tokens per turn are in its checkpoint's sampling already (open::model_policy).
        let per_turn = self.sampling.max_new_tokens;
        let text = self
            .model
            .tokenizer
            .tokenizer
            .decode(&ids, false)
            .unwrap_or_default();
        Ok(Prompt {
            ids,
            text,
            max_new_tokens: per_turn.min(room),
        })
    }

    /// Completions of `prompt`, one per seed, in seed order; stops early with an error once
    /// `cancel` is set (checked between decode steps).
    fn draw(
        &self,
        prompt: &Prompt,
        seeds: &[u64],
        cancel: Option<&AtomicBool>,
    ) -> Result<Vec<Completion>, String> {
        let mut params = self.sampling.clone();
        params.max_new_tokens = prompt.max_new_tokens;
        let m = &self.model;
        let mut engine = Engine::new(&m.transformer, m.eos_ids.clone(), seeds.len());
        for (i, &seed) in seeds.iter().enumerate() {
            engine.submit(Request {
                id: i as u64,
                prompt_ids: prompt.ids.clone(),
                params: params.clone(),
                seed,
            });
        }
        let mut done = on_the_pool(|| {
            let mut done = vec![];
            while !engine.is_idle() {
                if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                    return Err(CANCELLED.to_string());
                }
                done.extend(
                    engine
                        .step()
                        .map_err(|e| format!("generation failed: {e}"))?,
                );
            }
            Ok(done)
        })?;
        done.sort_by_key(|c| c.id);
        Ok(done)
    }

    /// One turn's output, drawn with `seed`, and its detail.
    pub fn generate(
        &self,
        prompt: &Prompt,
        seed: u64,
        cancel: Option<&AtomicBool>,
    ) -> Result<(String, ModelTurn), String> {
        let c = self
            .draw(prompt, &[seed], cancel)?
            .pop()
            .ok_or("generation returned nothing")?;
        let tokens = self.token_views(&prompt.ids, &c.token_ids)?;
        let output = self.tok().decode(&c.token_ids);
        Ok((
            output,
            ModelTurn {
                prompt_text: prompt.text.clone(),
                prompt_tokens: prompt.ids.len(),
                output_ids: c.token_ids,
                finish: c.finish,
                tokens,
            },
        ))
    }

    /// Draw the turn `n` times and count the actions the parser finds; `actions` are the
    /// environment's valid actions now (empty when it does not list them).
    pub fn resample(
        &self,
        prompt: &Prompt,
        n: usize,
        seed: u64,
        parser: &ActionParser,
        actions: &[String],
        cancel: Option<&AtomicBool>,
    ) -> Result<Resample, String> {
        let seeds: Vec<u64> = (0..n.max(1) as u64)
            .map(|i| mix_seed(&[seed, 0x5a, i]))
            .collect();
        let drawn = self.draw(prompt, &seeds, cancel)?;
        let mut counts: Vec<ActionCount> = vec![];
        let mut logprob = 0.0;
        for c in &drawn {
            let text = self.tok().decode(&c.token_ids);
            let action = parser.parse(&text).map(str::to_string);
            let unknown = action
                .as_ref()
                .is_some_and(|a| !actions.is_empty() && !actions.contains(a));
            match counts.iter_mut().find(|k| k.action == action) {
                Some(k) => k.count += 1,
                None => counts.push(ActionCount {
                    action,
                    unknown,
                    count: 1,
                }),
            }
            logprob += c.logprobs.iter().map(|&l| f64::from(l)).sum::<f64>();
        }
        counts.sort_by(|a, b| b.count.cmp(&a.count).then(a.action.cmp(&b.action)));
        Ok(Resample {
            draws: drawn.len(),
            counts,
            mean_logprob: logprob / drawn.len().max(1) as f64,
        })
    }

    /// Log-prob, entropy and the likeliest alternatives of each output token after `prompt`,
    /// under the sampling temperature (1 for greedy, as the sampler reports it).
    pub fn token_views(&self, prompt: &[u32], output: &[u32]) -> Result<Vec<TokenView>, String> {
        if output.is_empty() {
            return Ok(vec![]);
        }
        let err = |e: candle_core::Error| format!("scoring the output failed: {e}");
        let m = &self.model.transformer;
        let batch = TrainBatch::new(
            &[(prompt, output)],
            self.model.pad_id,
            m.config().kv_groups(),
            m.device(),
        )
        .map_err(err)?;
        let hidden = response_hidden(m, &batch, Numerics::Fast, None).map_err(err)?;
        let logits: Vec<Vec<f32>> = m
            .logits(&hidden, Numerics::Fast)
            .and_then(|l| l.squeeze(0))
            .and_then(|l| l.to_dtype(DType::F32))
            .and_then(|l| l.to_vec2())
            .map_err(err)?;
        let temperature = match self.sampling.temperature {
            t if t > 0.0 => t,
            _ => 1.0,
        };
        let piece = |id: u32| {
            self.model
                .tokenizer
                .tokenizer
                .decode(&[id], false)
                .unwrap_or_else(|_| format!("<{id}>"))
        };
        Ok(output
            .iter()
            .zip(&logits)
            .map(|(&id, row)| {
                let logp = log_softmax(row, temperature);
                let entropy = -logp.iter().map(|&l| l.exp() * l).sum::<f64>();
                let mut order: Vec<usize> = (0..logp.len()).collect();
                order.sort_by(|&a, &b| logp[b].total_cmp(&logp[a]).then(a.cmp(&b)));
                TokenView {
                    id,
                    text: piece(id),
                    logprob: logp.get(id as usize).copied().unwrap_or(f64::NEG_INFINITY) as f32,
                    entropy: entropy as f32,
                    alternatives: order
                        .iter()
                        .take(self.alternatives)
                        .map(|&i| (piece(i as u32), logp[i].exp() as f32))
                        .collect(),
                }
            })
            .collect())
    }
}

/// log_softmax(row / temperature), in f64.
fn log_softmax(row: &[f32], temperature: f64) -> Vec<f64> {
    let scaled: Vec<f64> = row.iter().map(|&l| f64::from(l) / temperature).collect();
    let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let log_z = max + scaled.iter().map(|&s| (s - max).exp()).sum::<f64>().ln();
    scaled.iter().map(|&s| s - log_z).collect()
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
