//! Continuous-batching generation.
//!
//! Requests wait in a queue; up to `max_batch` run at once, sharing one [`KvCache`]. Every
//! [`Engine::step`] admits queued requests into free slots (one batched prefill), then runs one batched
//! decode step for all running sequences. A sequence that hits an EOS id, a stop string or its token
//! limit leaves at once and its slot is reused at the next step — so callers can score finished samples
//! while others are still generating.

use std::collections::VecDeque;

use candle_core::{Result, Tensor};
use rand::{SeedableRng, rngs::StdRng};
use serde::{Deserialize, Serialize};

use super::sampling::{SamplingParams, sample};
use crate::model::{KvCache, Numerics, Transformer, attention_mask};

/// Why a completion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-sequence token was sampled (it is the last token of the completion).
    Eos,
    /// The decoded text reached a stop string.
    Stop,
    /// `max_new_tokens` were generated.
    Length,
}

/// One prompt to complete. `seed` drives this request's own RNG, so a sample does not depend on which
/// other requests happen to share its batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    pub prompt_ids: Vec<u32>,
    pub params: SamplingParams,
    pub seed: u64,
}

#[derive(Debug, Clone)]
pub struct Completion {
    pub id: u64,
    pub prompt_ids: Vec<u32>,
    /// Generated tokens, including the EOS token when `finish == Eos`.
    pub token_ids: Vec<u32>,
    /// Log-probability of each generated token (see [`sample`]).
    pub logprobs: Vec<f32>,
    pub finish: FinishReason,
}

struct Running {
    req: Request,
    rng: StdRng,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
}

/// Decodes token ids to text for stop-string checks.
pub type Detokenize<'a> = &'a dyn Fn(&[u32]) -> String;

pub struct Engine<'a> {
    model: &'a Transformer,
    eos_ids: Vec<u32>,
    max_batch: usize,
    detokenize: Option<Detokenize<'a>>,
    queue: VecDeque<Request>,
    /// Row i of `cache` belongs to `running[i]`; its last sampled token is not yet in the cache.
    running: Vec<Running>,
    cache: KvCache,
}

impl<'a> Engine<'a> {
    pub fn new(model: &'a Transformer, eos_ids: Vec<u32>, max_batch: usize) -> Self {
        let layers = model.config().num_hidden_layers;
        Engine {
            model,
            eos_ids,
            max_batch: max_batch.max(1),
            detokenize: None,
            queue: VecDeque::new(),
            running: vec![],
            cache: KvCache::new(layers, vec![]),
        }
    }

    /// Needed only for requests with stop strings.
    pub fn with_detokenizer(mut self, detokenize: Detokenize<'a>) -> Self {
        self.detokenize = Some(detokenize);
        self
    }

    pub fn submit(&mut self, req: Request) {
        self.queue.push_back(req);
    }

    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.running.is_empty()
    }

    pub fn running(&self) -> usize {
        self.running.len()
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Cancel every queued or running request whose id satisfies `cancel` (early stop, stale
    /// groups); returns how many were cancelled. Their slots are free at the next step.
    pub fn abort(&mut self, cancel: impl Fn(u64) -> bool) -> Result<usize> {
        let queued = self.queue.len();
        self.queue.retain(|r| !cancel(r.id));
        let mut cancelled = queued - self.queue.len();
        let keep: Vec<usize> = (0..self.running.len())
            .filter(|&i| !cancel(self.running[i].req.id))
            .collect();
        if keep.len() < self.running.len() {
            cancelled += self.running.len() - keep.len();
            self.cache.retain_rows(&keep)?;
            self.cache.trim_left()?;
            let mut slots: Vec<Option<Running>> = self.running.drain(..).map(Some).collect();
            self.running = keep.iter().filter_map(|&i| slots[i].take()).collect();
        }
        Ok(cancelled)
    }

    /// Admit queued requests into free slots, decode one token for every running sequence, and return
    /// the sequences that finished during this step.
    pub fn step(&mut self) -> Result<Vec<Completion>> {
        let mut done = self.admit()?;
        if !self.running.is_empty() {
            done.extend(self.decode()?);
        }
        Ok(done)
    }

    /// Step until queue and slots are empty; completions come back in finishing order.
    pub fn run_to_completion(&mut self) -> Result<Vec<Completion>> {
        let mut out = vec![];
        while !self.is_idle() {
            out.extend(self.step()?);
        }
        Ok(out)
    }

    fn admit(&mut self) -> Result<Vec<Completion>> {
        let free = self.max_batch - self.running.len();
        let take = free.min(self.queue.len());
        if take == 0 {
            return Ok(vec![]);
        }
        let reqs: Vec<Request> = self.queue.drain(..take).collect();
        if let Some(empty) = reqs.iter().find(|r| r.prompt_ids.is_empty()) {
            candle_core::bail!("request {} has an empty prompt", empty.id);
        }
        let longest = reqs.iter().map(|r| r.prompt_ids.len()).max().unwrap_or(0);
        let max_pos = self.model.config().max_position_embeddings;
        if let Some(r) = reqs
            .iter()
            .find(|r| r.prompt_ids.len() + r.params.max_new_tokens > max_pos)
        {
            candle_core::bail!(
                "request {}: prompt of {} tokens + max_new_tokens {} exceeds max_position_embeddings {max_pos}",
                r.id,
                r.prompt_ids.len(),
                r.params.max_new_tokens
            );
        }
        let (mut ids, mut pos, mut valid_from) = (vec![], vec![], vec![]);
        for r in &reqs {
            let pad = longest - r.prompt_ids.len();
            valid_from.push(pad);
            ids.extend(std::iter::repeat_n(0u32, pad).chain(r.prompt_ids.iter().copied()));
            pos.extend(std::iter::repeat_n(0u32, pad).chain(0..r.prompt_ids.len() as u32));
        }
        let device = self.model.device();
        let b = reqs.len();
        let ids = Tensor::from_vec(ids, (b, longest), device)?;
        let pos = Tensor::from_vec(pos, (b, longest), device)?;
        let groups = self.model.config().kv_groups();
        let mask = attention_mask(&valid_from, 0, longest, groups, device)?;
        let mut cache = KvCache::new(self.model.config().num_hidden_layers, valid_from);
        let hidden =
            self.model
                .forward_hidden(&ids, &pos, &mask, Some(&mut cache), Numerics::Fast)?;
        let last = hidden.narrow(1, longest - 1, 1)?;
        let logits = self.model.logits(&last)?.squeeze(1)?.to_vec2::<f32>()?;
        self.cache.merge(cache)?;
        for (req, row) in reqs.into_iter().zip(logits) {
            let rng = StdRng::seed_from_u64(req.seed);
            let mut seq = Running {
                req,
                rng,
                tokens: vec![],
                logprobs: vec![],
            };
            let (tok, lp) = sample(&row, &seq.req.params, &mut seq.rng);
            seq.tokens.push(tok);
            seq.logprobs.push(lp);
            self.running.push(seq);
        }
        self.retire()
    }

    fn decode(&mut self) -> Result<Vec<Completion>> {
        let device = self.model.device();
        let b = self.running.len();
        let ids: Vec<u32> = self
            .running
            .iter()
            .map(|s| s.tokens[s.tokens.len() - 1])
            .collect();
        let pos: Vec<u32> = self
            .running
            .iter()
            .map(|s| (s.req.prompt_ids.len() + s.tokens.len() - 1) as u32)
            .collect();
        let ids = Tensor::from_vec(ids, (b, 1), device)?;
        let pos = Tensor::from_vec(pos, (b, 1), device)?;
        let groups = self.model.config().kv_groups();
        let mask = attention_mask(self.cache.valid_from(), self.cache.len(), 1, groups, device)?;
        let hidden =
            self.model
                .forward_hidden(&ids, &pos, &mask, Some(&mut self.cache), Numerics::Fast)?;
        let logits = self.model.logits(&hidden)?.squeeze(1)?.to_vec2::<f32>()?;
        for (seq, row) in self.running.iter_mut().zip(logits) {
            let (tok, lp) = sample(&row, &seq.req.params, &mut seq.rng);
            seq.tokens.push(tok);
            seq.logprobs.push(lp);
        }
        self.retire()
    }

    /// Remove finished sequences from the batch and the cache.
    fn retire(&mut self) -> Result<Vec<Completion>> {
        let mut keep = vec![];
        let mut done = vec![];
        for (i, seq) in self.running.iter().enumerate() {
            match self.finish_reason(seq) {
                Some(reason) => done.push((i, reason)),
                None => keep.push(i),
            }
        }
        if done.is_empty() {
            return Ok(vec![]);
        }
        self.cache.retain_rows(&keep)?;
        self.cache.trim_left()?;
        let mut slots: Vec<Option<Running>> = self.running.drain(..).map(Some).collect();
        self.running = keep.iter().filter_map(|&i| slots[i].take()).collect();
        Ok(done
            .into_iter()
            .filter_map(|(i, finish)| {
                slots[i].take().map(|s| Completion {
                    id: s.req.id,
                    prompt_ids: s.req.prompt_ids,
                    token_ids: s.tokens,
                    logprobs: s.logprobs,
                    finish,
                })
            })
            .collect())
    }

    fn finish_reason(&self, seq: &Running) -> Option<FinishReason> {
        let last = *seq.tokens.last()?;
        if self.eos_ids.contains(&last) {
            return Some(FinishReason::Eos);
        }
        if !seq.req.params.stop_strings.is_empty()
            && let Some(detok) = self.detokenize
        {
            let text = detok(&seq.tokens);
            if seq
                .req
                .params
                .stop_strings
                .iter()
                .any(|s| !s.is_empty() && text.contains(s.as_str()))
            {
                return Some(FinishReason::Stop);
            }
        }
        if seq.tokens.len() >= seq.req.params.max_new_tokens {
            return Some(FinishReason::Length);
        }
        None
    }
}

/// Generate completions for `requests` with up to `max_batch` in flight; results in request order.
pub fn generate(
    model: &Transformer,
    eos_ids: &[u32],
    requests: Vec<Request>,
    max_batch: usize,
    detokenize: Option<Detokenize<'_>>,
) -> Result<Vec<Completion>> {
    let order: Vec<u64> = requests.iter().map(|r| r.id).collect();
    let mut engine = Engine::new(model, eos_ids.to_vec(), max_batch);
    if let Some(d) = detokenize {
        engine = engine.with_detokenizer(d);
    }
    for r in requests {
        engine.submit(r);
    }
    let mut done = engine.run_to_completion()?;
    done.sort_by_key(|c| order.iter().position(|&id| id == c.id));
    Ok(done)
}
