//! Continuous-batching generation.
//!
//! Requests wait in a queue; up to `max_batch` run at once, sharing one [`KvCache`]. Every
//! [`Engine::step`] admits queued requests into free slots (one batched prefill), then runs one batched
//! decode step for all running sequences. A sequence that hits an EOS id, a stop string or its token
//! limit leaves at once and its slot is reused at the next step — so callers can score finished samples
//! while others are still generating.

use std::collections::{HashMap, VecDeque};

use candle_core::Result;
use serde::{Deserialize, Serialize};

use super::lane::{Lane, Shared};
use super::prefixes::Prefixes;
use super::sampling::SamplingParams;
use crate::model::Transformer;
use crate::model::threads::on_the_pool;

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

impl FinishReason {
    /// As the store and every view write it: `eos`, `stop`, `length`.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
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

/// Decodes token ids to text for stop-string checks (called from every lane's thread).
pub type Detokenize<'a> = &'a (dyn Fn(&[u32]) -> String + Sync);

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
                .map(|i| Lane::with_capacity(max_batch / n + usize::from(i < max_batch % n)))
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
    /// to 1.08x (AVX-512) faster than stepped from outside (benches/RESULTS.md's git history).
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

/// Generate completions for `requests` with up to `max_batch` in flight; results in request order.
pub fn generate(
    model: &Transformer,
    eos_ids: &[u32],
    requests: Vec<Request>,
    max_batch: usize,
    detokenize: Option<Detokenize<'_>>,
) -> Result<Vec<Completion>> {
    // Each id's first place among the requests: a sort key looked up once per completion, not
    // searched for (a search per comparison was quadratic in the batch).
    let mut order: HashMap<u64, usize> = HashMap::with_capacity(requests.len());
    for (i, r) in requests.iter().enumerate() {
        order.entry(r.id).or_insert(i);
    }
    let mut engine = Engine::new(model, eos_ids.to_vec(), max_batch);
    if let Some(d) = detokenize {
        engine = engine.with_detokenizer(d);
    }
    for r in requests {
        engine.submit(r);
    }
    let mut done = engine.run_to_completion()?;
    done.sort_by_cached_key(|c| order.get(&c.id).copied());
    Ok(done)
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
