//! Finished sequences' keys and values, kept for the requests that continue them.
//!
//! An agentic episode's next turn asks for a completion of its whole history: the last turn's
//! prompt, the tokens generated for it, and the environment's answer. Prefilled afresh, every
//! turn computes the history again (the agentic FrozenLake run prefilled 347,712 prompt tokens
//! for ~65k generated, benches/RESULTS.md). An engine that keeps prefixes saves each finished
//! sequence's cache under its request id; a later request with that id whose prompt begins with
//! the saved tokens starts from their keys and values and prefills only the rest.

use std::collections::{HashMap, VecDeque};

use super::engine::Request;
use crate::model::kv_cache::RowKv;

/// One finished sequence's cache.
pub(super) struct Saved {
    /// The tokens whose keys and values are kept: the prompt and every generated token but the
    /// last, which was never fed to the model.
    pub tokens: Vec<u32>,
    /// Per layer, keys and values of this sequence alone: (1, tokens, ..) on `axis`.
    pub layers: RowKv,
    pub axis: usize,
}

/// The saved sequences by request id, at most `capacity` of them (the oldest go first).
pub(super) struct Prefixes {
    capacity: usize,
    by_id: HashMap<u64, Saved>,
    order: VecDeque<u64>,
}

impl Prefixes {
    pub fn new(capacity: usize) -> Self {
        Prefixes {
            capacity: capacity.max(1),
            by_id: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Keep `saved` for request `id` (replacing what it had).
    pub fn keep(&mut self, id: u64, saved: Saved) {
        if self.by_id.insert(id, saved).is_some() {
            self.order.retain(|&o| o != id);
        }
        self.order.push_back(id);
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.by_id.remove(&old);
            }
        }
    }

    pub fn clear(&mut self) {
        self.by_id.clear();
        self.order.clear();
    }

    /// What `req` can start from: the sequence saved under its id, taken out, if its prompt
    /// begins with the saved tokens and goes on past them (the last token must be fed for the
    /// logits of the first new one). A saved sequence that does not fit is dropped.
    pub fn take(&mut self, req: &Request) -> Option<Saved> {
        let saved = self.by_id.remove(&req.id)?;
        self.order.retain(|&o| o != req.id);
        let n = saved.tokens.len();
        (n > 0 && n < req.prompt_ids.len() && req.prompt_ids[..n] == saved.tokens[..])
            .then_some(saved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::SamplingParams;

    fn saved(tokens: &[u32]) -> Saved {
        Saved {
            tokens: tokens.to_vec(),
            layers: vec![],
            axis: 1,
        }
    }

    fn request(id: u64, prompt: &[u32]) -> Request {
        Request {
            id,
            prompt_ids: prompt.to_vec(),
            params: SamplingParams::default(),
            seed: 0,
        }
    }

    #[test]
    fn a_request_takes_its_own_prefix_only_when_its_prompt_continues_it() {
        let mut p = Prefixes::new(4);
        p.keep(1, saved(&[5, 6, 7]));
        p.keep(2, saved(&[5, 6, 7]));
        p.keep(3, saved(&[5, 6, 7]));
        assert!(p.take(&request(1, &[5, 6, 7, 8])).is_some());
        // Taken once.
        assert!(p.take(&request(1, &[5, 6, 7, 8])).is_none());
        // Another prompt, or one with nothing past the saved tokens: dropped, not used.
        assert!(p.take(&request(2, &[5, 9, 7, 8])).is_none());
        assert!(p.take(&request(3, &[5, 6, 7])).is_none());
        assert!(p.by_id.is_empty() && p.order.is_empty());
    }

    #[test]
    fn the_oldest_go_first_past_the_capacity() {
        let mut p = Prefixes::new(2);
        p.keep(1, saved(&[1]));
        p.keep(2, saved(&[2]));
        p.keep(1, saved(&[1, 1]));
        p.keep(3, saved(&[3]));
        // 2 was the oldest once 1 was kept again.
        assert!(p.take(&request(2, &[2, 0])).is_none());
        assert!(p.take(&request(1, &[1, 1, 0])).is_some());
        assert!(p.take(&request(3, &[3, 0])).is_some());
    }
}
