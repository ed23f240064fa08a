//! One virtual inference device: its request queue, its running batch and the cost of a decode
//! step. It knows nothing of groups' fate; the engine tells it what to cancel.

use std::collections::{BTreeSet, VecDeque};

use super::{Batching, CostModel};

/// One sample to generate; its length and reward are drawn when its group is dispatched.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Request {
    pub group: u64,
    pub index: usize,
    pub tokens: usize,
    pub reward: f32,
}

#[derive(Debug)]
struct Running {
    request: Request,
    decoded: usize,
}

#[derive(Debug, Default)]
pub(super) struct VirtualDevice {
    queue: VecDeque<Request>,
    running: Vec<Running>,
    /// A decode step is under way (its end is an event).
    pub stepping: bool,
    /// No step may start before this time (weight sync).
    pub paused_until: f64,
    /// A sync pause to take once the step under way ends.
    pub pause_after_step_ms: f64,
    step_ms: f64,
    step_sequences: usize,
    /// Time spent in finished decode steps.
    pub busy_ms: f64,
    /// Sum over finished steps of running sequences × step time.
    pub sequence_ms: f64,
}

impl VirtualDevice {
    /// Queued plus running sequences: what dispatch balances.
    pub fn load(&self) -> usize {
        self.queue.len() + self.running.len()
    }

    pub fn submit(&mut self, request: Request) {
        self.queue.push_back(request);
    }

    /// Admit queued requests as `batching` allows and start a step; returns its duration, or None
    /// when there is nothing to decode.
    pub fn begin_step(&mut self, batching: Batching, cost: &CostModel) -> Option<f64> {
        let slots = match batching {
            Batching::Continuous => cost.max_batch.saturating_sub(self.running.len()),
            Batching::Static if self.running.is_empty() => cost.max_batch,
            Batching::Static => 0,
        };
        let admitted = slots.min(self.queue.len());
        self.running
            .extend(self.queue.drain(..admitted).map(|request| Running {
                request,
                decoded: 0,
            }));
        if self.running.is_empty() {
            return None;
        }
        self.step_ms = cost.step_base_ms
            + cost.step_per_seq_ms * self.running.len() as f64
            + cost.prefill_ms_per_seq * admitted as f64;
        self.step_sequences = self.running.len();
        self.stepping = true;
        Some(self.step_ms)
    }

    /// The step under way ended: every running sequence gained a token. Returns the finished
    /// requests and the tokens decoded (sequences cancelled during the step decoded nothing).
    pub fn end_step(&mut self) -> (Vec<Request>, u64) {
        self.stepping = false;
        self.busy_ms += self.step_ms;
        self.sequence_ms += self.step_ms * self.step_sequences as f64;
        let decoded = self.running.len() as u64;
        let mut finished = vec![];
        self.running.retain_mut(|r| {
            r.decoded += 1;
            let done = r.decoded >= r.request.tokens;
            if done {
                finished.push(r.request.clone());
            }
            !done
        });
        (finished, decoded)
    }

    /// Drop every request of `groups`, queued or running; returns the tokens they had decoded.
    pub fn cancel(&mut self, groups: &BTreeSet<u64>) -> u64 {
        self.queue.retain(|r| !groups.contains(&r.group));
        let mut decoded = 0;
        self.running.retain(|r| {
            let cancel = groups.contains(&r.request.group);
            if cancel {
                decoded += r.decoded as u64;
            }
            !cancel
        });
        decoded
    }

    /// Tokens decoded so far by sequences still running.
    pub fn decoded_in_flight(&self) -> u64 {
        self.running.iter().map(|r| r.decoded as u64).sum()
    }
}
