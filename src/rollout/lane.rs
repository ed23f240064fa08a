//! A lane of the generation engine: a part of the batch with its own sequences and KV cache,
//! admitted (one batched prefill), decoded a token a step, and retired when a sequence ends. The
//! [`super::engine::Engine`] hands requests to its lanes and steps them side by side.

use std::collections::HashMap;

use candle_core::{Result, Tensor};
use rand::{SeedableRng, rngs::StdRng};

use super::engine::{Completion, Detokenize, FinishReason, Request};
use super::prefixes::Saved;
use super::sampling::sample;
use crate::model::kv_cache::RowKv;
use crate::model::{KvCache, Numerics, Transformer, attention_mask};

/// Vocabularies from this size on draw their rows' tokens in parallel: a draw reads every logit
/// (~0.5 ms a row at Qwen's 151,936 tokens, 16 rows a decode step in one lane); a small
/// vocabulary's row costs less than handing it to another thread.
pub(super) const PARALLEL_SAMPLING_VOCAB: usize = 4096;

/// Each sequence's next token and its log-prob, drawn from its row of `rows` with its own RNG:
/// the same draws whichever thread makes them.
pub(super) fn sample_next(seqs: &mut [Running], rows: &[&[f32]]) {
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

pub(super) struct Running {
    pub(super) req: Request,
    pub(super) rng: StdRng,
    pub(super) tokens: Vec<u32>,
    pub(super) logprobs: Vec<f32>,
}

/// What every lane reads: the model and when a sequence ends.
pub(super) struct Shared<'a> {
    pub(super) model: &'a Transformer,
    pub(super) eos_ids: Vec<u32>,
    pub(super) detokenize: Option<Detokenize<'a>>,
    /// Whether finished sequences' caches are kept ([`super::Engine::with_prefix_reuse`]).
    pub(super) keep_prefixes: bool,
}

/// A part of the batch with its own sequences and KV cache. Lanes decode side by side, one per
/// thread (see [`crate::model::threads::lanes`]): at small shapes each of a step's matrix products
/// is too small to split across cores, so splitting the batch is what keeps them busy.
#[derive(Default)]
pub(super) struct Lane {
    /// Most sequences this lane runs at once (the lanes' capacities sum to `max_batch`).
    pub(super) capacity: usize,
    /// Admitted at this step, not yet prefilled.
    pub(super) admitted: Vec<(Request, Option<Saved>)>,
    /// Row i of `cache` belongs to `running[i]`; its last sampled token is not yet in the cache.
    pub(super) running: Vec<Running>,
    cache: Option<KvCache>,
    /// Prompt positions run through the model so far (padding included).
    pub(super) prefilled: usize,
    /// Caches of sequences that finished at this step, for the engine's [`super::prefixes::Prefixes`].
    pub(super) finished_caches: Vec<(u64, Saved)>,
}

impl Lane {
    /// An empty lane for up to `capacity` sequences at once.
    pub(super) fn with_capacity(capacity: usize) -> Self {
        Lane {
            capacity,
            ..Lane::default()
        }
    }

    /// Sequences running or admitted.
    pub(super) fn load(&self) -> usize {
        self.running.len() + self.admitted.len()
    }

    pub(super) fn abort(&mut self, cancel: &impl Fn(u64) -> bool) -> Result<usize> {
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

    pub(super) fn step(&mut self, shared: &Shared) -> Result<Vec<Completion>> {
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

    /// The caches of running sequences `rows` (finishing now), for the engine's [`super::prefixes::Prefixes`]:
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
