//! Continuous-batching generation.
//!
//! Requests wait in a queue; up to `max_batch` run at once, sharing one [`KvCache`]. Every
//! [`Engine::step`] admits queued requests into free slots (one batched prefill), then runs one batched
//! decode step for all running sequences. A sequence that hits an EOS id, a stop string or its token
//! limit leaves at once and its slot is reused at the next step — so callers can score finished samples
//! while others are still generating.

use std::collections::{HashMap, VecDeque};

use candle_core::{Result, Tensor};
use rand::{SeedableRng, rngs::StdRng};
use serde::{Deserialize, Serialize};

use super::prefixes::{Prefixes, Saved};
use super::sampling::{SamplingParams, sample};
use crate::model::kv_cache::RowKv;
use crate::model::threads::on_the_pool;
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

/// Vocabularies from this size on draw their rows' tokens in parallel: a draw reads every logit
/// (~0.5 ms a row at Qwen's 151,936 tokens, 16 rows a decode step in one lane); a small
/// vocabulary's row costs less than handing it to another thread.
const PARALLEL_SAMPLING_VOCAB: usize = 4096;

/// Each sequence's next token and its log-prob, drawn from its row of `rows` with its own RNG:
/// the same draws whichever thread makes them.
fn sample_next(seqs: &mut [Running], rows: &[&[f32]]) {
    use rayon::prelude::*;
    fn draw((seq, row): (&mut Running, &&[f32])) {
        let (tok, lp) = sample(row, &seq.req.params, &mut seq.rng);
        seq.tokens.push(tok);
        seq.logprobs.push(lp);
    }
    if rows
        .first()
        .is_some_and(|row| row.len() >= PARALLEL_SAMPLING_VOCAB)
    {
        seqs.par_iter_mut().zip(rows.par_iter()).for_each(draw);
    } else {
        seqs.iter_mut().zip(rows).for_each(draw);
    }
}

struct Running {
    req: Request,
    rng: StdRng,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
}

/// Decodes token ids to text for stop-string checks (called from every lane's thread).
pub type Detokenize<'a> = &'a (dyn Fn(&[u32]) -> String + Sync);

/// What every lane reads: the model and when a sequence ends.
struct Shared<'a> {
    model: &'a Transformer,
    eos_ids: Vec<u32>,
    detokenize: Option<Detokenize<'a>>,
    /// Whether finished sequences' caches are kept ([`Engine::with_prefix_reuse`]).
    keep_prefixes: bool,
}

/// A part of the batch with its own sequences and KV cache. Lanes decode side by side, one per
/// thread (see [`crate::model::threads::lanes`]): at small shapes each of a step's matrix products
/// is too small to split across cores, so splitting the batch is what keeps them busy.
#[derive(Default)]
struct Lane {
    /// Most sequences this lane runs at once (the lanes' capacities sum to `max_batch`).
    capacity: usize,
    /// Admitted at this step, not yet prefilled.
    admitted: Vec<(Request, Option<Saved>)>,
    /// Row i of `cache` belongs to `running[i]`; its last sampled token is not yet in the cache.
    running: Vec<Running>,
    cache: Option<KvCache>,
    /// Prompt positions run through the model so far (padding included).
    prefilled: usize,
    /// Caches of sequences that finished at this step, for the engine's [`Prefixes`].
    finished_caches: Vec<(u64, Saved)>,
}

pub struct Engine<'a> {
    shared: Shared<'a>,
    queue: VecDeque<Request>,
    lanes: Vec<Lane>,
    prefixes: Option<Prefixes>,
}

impl<'a> Engine<'a> {
    /// An engine with as many lanes as [`crate::model::threads::lanes`] gives this model.
    pub fn new(model: &'a Transformer, eos_ids: Vec<u32>, max_batch: usize) -> Self {
        let lanes = model.lanes();
        Self::with_lanes(model, eos_ids, max_batch, lanes)
    }

    /// An engine whose batch is split into `lanes` parts decoded side by side (at most one per
    /// sequence slot). A sample does not depend on the lane it runs in.
    pub fn with_lanes(
        model: &'a Transformer,
        eos_ids: Vec<u32>,
        max_batch: usize,
        lanes: usize,
    ) -> Self {
        let max_batch = max_batch.max(1);
        let n = lanes.clamp(1, max_batch);
        Engine {
            shared: Shared {
                model,
                eos_ids,
                detokenize: None,
                keep_prefixes: false,
            },
            queue: VecDeque::new(),
            lanes: (0..n)
                .map(|i| Lane {
                    capacity: max_batch / n + usize::from(i < max_batch % n),
                    ..Lane::default()
                })
                .collect(),
            prefixes: None,
        }
    }

    /// Keep each finished sequence's cache (up to twice the batch of them, the oldest dropped
    /// first) for a later request with the same id whose prompt continues it: that request
    /// prefills only what follows (`rollout::prefixes`). For multi-turn rollouts, whose next
    /// turn's prompt is the last turn's prompt and completion and the environment's answer.
    pub fn with_prefix_reuse(mut self) -> Self {
        let batch: usize = self.lanes.iter().map(|l| l.capacity).sum();
        self.prefixes = Some(Prefixes::new(2 * batch));
        self.shared.keep_prefixes = true;
        self
    }

    /// Drop every kept cache: they hold keys and values of the weights they were made with, and
    /// the engine's model has just taken others.
    pub fn forget_prefixes(&mut self) {
        if let Some(p) = self.prefixes.as_mut() {
            p.clear();
        }
    }

    /// Needed only for requests with stop strings.
    pub fn with_detokenizer(mut self, detokenize: Detokenize<'a>) -> Self {
        self.shared.detokenize = Some(detokenize);
        self
    }

    pub fn submit(&mut self, req: Request) {
        self.queue.push_back(req);
    }

    pub fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.lanes.iter().all(|l| l.running.is_empty())
    }

    pub fn running(&self) -> usize {
        self.lanes.iter().map(|l| l.running.len()).sum()
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
        for lane in &mut self.lanes {
            cancelled += lane.abort(&cancel)?;
        }
        Ok(cancelled)
    }

    /// Admit queued requests into free slots, decode one token for every running sequence, and return
    /// the sequences that finished during this step.
    pub fn step(&mut self) -> Result<Vec<Completion>> {
        // Each queued request goes to the least loaded lane with a free slot (the first of
        // equals), so a few requests in a big batch still spread over the lanes; which lane a
        // request lands in depends only on the requests, never on timing.
        while !self.queue.is_empty() {
            let Some(lane) = self
                .lanes
                .iter_mut()
                .filter(|l| l.load() < l.capacity)
                .min_by_key(|l| l.load())
            else {
                break;
            };
            if let Some(req) = self.queue.pop_front() {
                let saved = self.prefixes.as_mut().and_then(|p| p.take(&req));
                lane.admitted.push((req, saved));
            }
        }
        let shared = &self.shared;
        let busy = self
            .lanes
            .iter()
            .filter(|l| !l.running.is_empty() || !l.admitted.is_empty())
            .count();
        let results: Vec<Result<Vec<Completion>>> = if busy > 1 {
            use rayon::prelude::*;
            self.lanes.par_iter_mut().map(|l| l.step(shared)).collect()
        } else {
            // One busy lane has every thread to itself, and runs on one of them: from the
            // caller's thread each of its parallel ops would be handed to the pool in turn
            // (`on_the_pool`; a worker process steps from its main thread).
            let lanes = &mut self.lanes;
            on_the_pool(|| lanes.iter_mut().map(|l| l.step(shared)).collect())
        };
        let mut done = vec![];
        for r in results {
            done.extend(r?);
        }
        if let Some(prefixes) = self.prefixes.as_mut() {
            for lane in &mut self.lanes {
                for (id, saved) in lane.finished_caches.drain(..) {
                    prefixes.keep(id, saved);
                }
            }
        }
        Ok(done)
    }

    /// Step until queue and slots are empty; completions come back in finishing order.
    ///
    /// The loop runs on one of rayon's threads ([`on_the_pool`]): tiny generation 1.035x (AVX2)
    /// to 1.08x (AVX-512) faster than stepped from outside (benches/RESULTS.md, twenty-third
    /// slice).
    pub fn run_to_completion(&mut self) -> Result<Vec<Completion>> {
        on_the_pool(|| {
            let mut out = vec![];
            while !self.is_idle() {
                out.extend(self.step()?);
            }
            Ok(out)
        })
    }
}

impl Lane {
    /// Sequences running or admitted.
    fn load(&self) -> usize {
        self.running.len() + self.admitted.len()
    }

    fn abort(&mut self, cancel: &impl Fn(u64) -> bool) -> Result<usize> {
        let keep: Vec<usize> = (0..self.running.len())
            .filter(|&i| !cancel(self.running[i].req.id))
            .collect();
        let cancelled = self.running.len() - keep.len();
        if cancelled > 0 {
            self.keep_rows(&keep)?;
        }
        Ok(cancelled)
    }

    /// Only the running sequences `keep`, in the cache too.
    fn keep_rows(&mut self, keep: &[usize]) -> Result<Vec<Option<Running>>> {
        if let Some(cache) = self.cache.as_mut() {
            cache.retain_rows(keep)?;
            cache.trim_left()?;
        }
        let mut slots: Vec<Option<Running>> = self.running.drain(..).map(Some).collect();
        self.running = keep.iter().filter_map(|&i| slots[i].take()).collect();
        Ok(slots)
    }

    fn step(&mut self, shared: &Shared) -> Result<Vec<Completion>> {
        let mut done = self.admit(shared)?;
        if !self.running.is_empty() {
            done.extend(self.decode(shared)?);
        }
        Ok(done)
    }

    fn admit(&mut self, shared: &Shared) -> Result<Vec<Completion>> {
        if self.admitted.is_empty() {
            return Ok(vec![]);
        }
        let (reqs, saved): (Vec<Request>, Vec<Option<Saved>>) =
            std::mem::take(&mut self.admitted).into_iter().unzip();
        if let Some(empty) = reqs.iter().find(|r| r.prompt_ids.is_empty()) {
            candle_core::bail!("request {} has an empty prompt", empty.id);
        }
        let model = shared.model;
        let max_pos = model.config().max_position_embeddings;
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
        // Requests with the same prompt (a GRPO group's samples, the debugger's draws) are
        // prefilled once: the prompt's cache row and last logits are copied to each of them.
        let (distinct, source) = distinct_prompts(&reqs);
        // Each row feeds its prompt's last `t` tokens (all of it, left-padded, if shorter): `t`
        // is the longest part that no saved cache holds. The columns before a row's fed tokens
        // come from its saved cache, right-aligned at `past` columns.
        let unsaved = |i: usize| {
            let cached = saved[i].as_ref().map_or(0, |s| s.tokens.len());
            reqs[i].prompt_ids.len() - cached
        };
        let t = distinct.iter().map(|&i| unsaved(i)).max().unwrap_or(0);
        let fed_from = |i: usize| reqs[i].prompt_ids.len().saturating_sub(t);
        let past = distinct.iter().map(|&i| fed_from(i)).max().unwrap_or(0);
        let (mut ids, mut pos, mut valid_from) = (vec![], vec![], vec![]);
        for &i in &distinct {
            let prompt = &reqs[i].prompt_ids;
            let from = fed_from(i);
            let pad = t - (prompt.len() - from);
            valid_from.push(past + t - prompt.len());
            ids.extend(std::iter::repeat_n(0u32, pad).chain(prompt[from..].iter().copied()));
            pos.extend(std::iter::repeat_n(0u32, pad).chain(from as u32..prompt.len() as u32));
        }
        let device = model.device();
        let b = distinct.len();
        let ids = Tensor::from_vec(ids, (b, t), device)?;
        let pos = Tensor::from_vec(pos, (b, t), device)?;
        let groups = model.config().kv_groups();
        let mask = attention_mask(&valid_from, past, t, groups, device)?;
        let layers = model.config().num_hidden_layers;
        let mut cache = match past {
            0 => KvCache::new(layers, valid_from),
            _ => {
                let pasts: Vec<(Option<&RowKv>, usize)> = distinct
                    .iter()
                    .map(|&i| (saved[i].as_ref().map(|s| &s.layers), fed_from(i)))
                    .collect();
                let axis = distinct
                    .iter()
                    .find_map(|&i| saved[i].as_ref().map(|s| s.axis))
                    .unwrap_or(1);
                KvCache::from_pasts(&pasts, axis, past, valid_from)?
            }
        };
        let hidden = model.forward_hidden(&ids, &pos, &mask, Some(&mut cache), Numerics::Fast)?;
        self.prefilled += b * t;
        let last = hidden.narrow(1, t - 1, 1)?;
        let logits = model
            .logits(&last, Numerics::Fast)?
            .squeeze(1)?
            .to_vec2::<f32>()?;
        if b < reqs.len() {
            cache.retain_rows(&source)?;
        }
        self.cache
            .get_or_insert_with(|| KvCache::new(layers, vec![]))
            .merge(cache)?;
        let rows: Vec<&[f32]> = source.iter().map(|&d| logits[d].as_slice()).collect();
        let first = self.running.len();
        self.running.extend(reqs.into_iter().map(|req| Running {
            rng: StdRng::seed_from_u64(req.seed),
            req,
            tokens: vec![],
            logprobs: vec![],
        }));
        sample_next(&mut self.running[first..], &rows);
        self.retire(shared)
    }

    fn decode(&mut self, shared: &Shared) -> Result<Vec<Completion>> {
        let model = shared.model;
        let device = model.device();
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
        let groups = model.config().kv_groups();
        let Some(cache) = self.cache.as_mut() else {
            candle_core::bail!("decoding a lane without a cache");
        };
        let mask = attention_mask(cache.valid_from(), cache.len(), 1, groups, device)?;
        let hidden = model.forward_hidden(&ids, &pos, &mask, Some(cache), Numerics::Fast)?;
        let logits = model
            .logits(&hidden, Numerics::Fast)?
            .squeeze(1)?
            .to_vec2::<f32>()?;
        let rows: Vec<&[f32]> = logits.iter().map(Vec::as_slice).collect();
        sample_next(&mut self.running, &rows);
        self.retire(shared)
    }

    /// The caches of running sequences `rows` (finishing now), for the engine's [`Prefixes`]:
    /// their prompt and every generated token but the last (not fed yet).
    fn save_caches(&mut self, rows: impl Iterator<Item = usize>) -> Result<()> {
        let Some(cache) = self.cache.as_ref() else {
            return Ok(());
        };
        for i in rows {
            let seq = &self.running[i];
            let Some((axis, layers)) = cache.row_columns(i)? else {
                continue;
            };
            let fed = &seq.tokens[..seq.tokens.len().saturating_sub(1)];
            let tokens: Vec<u32> = seq.req.prompt_ids.iter().chain(fed).copied().collect();
            // The cache holds exactly those columns (it would not after a failed step).
            if layers
                .first()
                .is_some_and(|(k, _)| k.dims()[axis] == tokens.len())
            {
                let saved = Saved {
                    tokens,
                    layers,
                    axis,
                };
                self.finished_caches.push((seq.req.id, saved));
            }
        }
        Ok(())
    }

    /// Remove finished sequences from the batch and the cache.
    fn retire(&mut self, shared: &Shared) -> Result<Vec<Completion>> {
        let mut keep = vec![];
        let mut done = vec![];
        for (i, seq) in self.running.iter().enumerate() {
            match finish_reason(shared, seq) {
                Some(reason) => done.push((i, reason)),
                None => keep.push(i),
            }
        }
        if done.is_empty() {
            return Ok(vec![]);
        }
        if shared.keep_prefixes {
            self.save_caches(done.iter().map(|&(i, _)| i))?;
        }
        let mut slots = self.keep_rows(&keep)?;
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
}

/// The first request of each distinct prompt (`distinct`, indices into `reqs`), and for each
/// request the position in `distinct` of its prompt (`source`).
fn distinct_prompts(reqs: &[Request]) -> (Vec<usize>, Vec<usize>) {
    let mut first: HashMap<&[u32], usize> = HashMap::new();
    let mut distinct = vec![];
    let source = reqs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            *first.entry(&r.prompt_ids).or_insert_with(|| {
                distinct.push(i);
                distinct.len() - 1
            })
        })
        .collect();
    (distinct, source)
}

fn finish_reason(shared: &Shared, seq: &Running) -> Option<FinishReason> {
    let last = *seq.tokens.last()?;
    if shared.eos_ids.contains(&last) {
        return Some(FinishReason::Eos);
    }
    if !seq.req.params.stop_strings.is_empty()
        && let Some(detok) = shared.detokenize
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

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
