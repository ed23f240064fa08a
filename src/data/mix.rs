//! Domain mixing: which prompts go into each rollout batch.
//!
//! The number of prompts each domain gets in a batch of `n` is a largest-remainder apportionment of
//! `n` by the domain weights, with each domain's fractional remainder carried into the next batch. So
//! with weights 1:1 and `n = 3` the odd prompt alternates between the domains, and after any number of
//! prompts every domain's cumulative count is within one of its exact share (exactly equal whenever
//! the share is a whole number). Within a domain the mixer walks a shuffled order of its examples and
//! reshuffles when it has used them all (one epoch), so every example is seen once per epoch.
//!
//! Everything is deterministic for a given seed. Each epoch of a domain is a fresh shuffle seeded from
//! the mixer seed, the domain's name and the epoch number, so adding or reordering domains does not
//! change the order in which an existing domain's examples come out, and the mixer's whole position is
//! a few numbers per domain ([`MixerState`]) that a checkpoint stores and a resume restores exactly.

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;

use serde::{Deserialize, Serialize};

use super::{DataError, Example};

/// Where a mixer stands: enough to continue exactly where it left off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MixerState {
    pub domains: Vec<DomainCursor>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DomainCursor {
    pub name: String,
    /// FNV-1a over the domain's examples: a resume refuses data that changed since the checkpoint.
    pub fingerprint: u64,
    pub epoch: u64,
    pub cursor: usize,
    pub credit: f64,
}

/// Remainders closer than this are ties: 1/3 + 1/3 + 1/3 must not lose to floating-point noise.
const EPS: f64 = 1e-9;

/// Draws batches from several domains in fixed proportions.
#[derive(Debug)]
pub struct DomainMixer {
    domains: Vec<DomainState>,
}

#[derive(Debug)]
struct DomainState {
    name: String,
    examples: Vec<Example>,
    /// weight / sum of weights.
    share: f64,
    /// Prompts owed to (positive) or taken in advance by (negative) this domain; always in (-1, 1).
    credit: f64,
    order: Vec<usize>,
    cursor: usize,
    epoch: u64,
    /// Seeds every epoch's shuffle (with the epoch number).
    seed: u64,
    fingerprint: u64,
}

impl DomainMixer {
    /// `domains` is `(name, examples, weight)`; weights need not sum to one. Errors on an empty list, a
    /// weight that is not a finite number > 0, a domain without examples, or a name given twice.
    pub fn new(domains: Vec<(String, Vec<Example>, f64)>, seed: u64) -> Result<Self, DataError> {
        if domains.is_empty() {
            return Err(DataError::NoDomains);
        }
        for (index, (name, examples, weight)) in domains.iter().enumerate() {
            if !(weight.is_finite() && *weight > 0.0) {
                return Err(DataError::BadRatio {
                    domain: name.clone(),
                    ratio: *weight,
                });
            }
            if examples.is_empty() {
                return Err(DataError::EmptyDomain {
                    domain: name.clone(),
                });
            }
            if domains[..index].iter().any(|(other, _, _)| other == name) {
                return Err(DataError::DuplicateDomain {
                    domain: name.clone(),
                });
            }
        }
        let total: f64 = domains.iter().map(|(_, _, w)| w).sum();
        let domains = domains
            .into_iter()
            .map(|(name, examples, weight)| {
                let seed = seed ^ fnv1a(name.as_bytes());
                DomainState {
                    fingerprint: fingerprint(&examples),
                    order: epoch_order(examples.len(), seed, 0),
                    name,
                    examples,
                    share: weight / total,
                    credit: 0.0,
                    cursor: 0,
                    epoch: 0,
                    seed,
                }
            })
            .collect();
        Ok(DomainMixer { domains })
    }

    /// The mixer's position, for checkpoints.
    pub fn state(&self) -> MixerState {
        MixerState {
            domains: self
                .domains
                .iter()
                .map(|d| DomainCursor {
                    name: d.name.clone(),
                    fingerprint: d.fingerprint,
                    epoch: d.epoch,
                    cursor: d.cursor,
                    credit: d.credit,
                })
                .collect(),
        }
    }

    /// Continue from `state` (taken from a mixer over the same domains and seed).
    pub fn restore(&mut self, state: &MixerState) -> Result<(), DataError> {
        let names: Vec<&str> = state.domains.iter().map(|d| d.name.as_str()).collect();
        if names
            != self
                .domains
                .iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>()
        {
            return Err(DataError::Resume(format!(
                "the checkpoint's data cursor is for domains {names:?}, the config has {:?}",
                self.domains()
            )));
        }
        for (d, c) in self.domains.iter_mut().zip(&state.domains) {
            if c.fingerprint != d.fingerprint {
                return Err(DataError::Resume(format!(
                    "the examples of domain '{}' changed since the checkpoint (now {} examples with \
                     other content); resuming would not continue the same data order",
                    d.name,
                    d.examples.len()
                )));
            }
            if c.cursor > d.examples.len() {
                return Err(DataError::Resume(format!(
                    "the checkpoint's data cursor for domain '{}' is at example {} but it has only {}",
                    d.name,
                    c.cursor,
                    d.examples.len()
                )));
            }
            d.order = epoch_order(d.examples.len(), d.seed, c.epoch);
            d.epoch = c.epoch;
            d.cursor = c.cursor;
            d.credit = c.credit;
        }
        Ok(())
    }

    /// Domain names in the order given to [`DomainMixer::new`].
    pub fn domains(&self) -> Vec<String> {
        self.domains.iter().map(|d| d.name.clone()).collect()
    }

    /// How many times each domain has reshuffled (0 during its first pass), in domain order.
    pub fn epochs(&self) -> Vec<(String, u64)> {
        self.domains
            .iter()
            .map(|d| (d.name.clone(), d.epoch))
            .collect()
    }

    /// The next `n` prompts: each domain's share in domain order, each share in that domain's
    /// shuffled order. Examples are returned as stored (their `domain` field is not rewritten).
    pub fn next_batch(&mut self, n: usize) -> Vec<Example> {
        let counts = self.apportion(n);
        let mut batch = Vec::with_capacity(n);
        for (domain, count) in self.domains.iter_mut().zip(counts) {
            for _ in 0..count {
                batch.push(domain.draw());
            }
        }
        batch
    }

    /// Splits `n` across domains by largest remainder over `credit + n * share`, and keeps what each
    /// domain was over- or under-served as its credit for the next batch.
    fn apportion(&mut self, n: usize) -> Vec<usize> {
        let quotas: Vec<f64> = self
            .domains
            .iter()
            .map(|d| d.credit + n as f64 * d.share)
            .collect();
        // A negative quota (a domain served in advance) gets nothing rather than a negative count.
        let mut counts: Vec<usize> = quotas
            .iter()
            .map(|q| (q + EPS).floor().max(0.0) as usize)
            .collect();
        let remainder = |i: usize, counts: &[usize]| quotas[i] - counts[i] as f64;
        let mut total: usize = counts.iter().sum();
        // Ties (within EPS) go to the earlier domain, so the result does not depend on rounding.
        while total < n {
            let mut best = 0;
            for i in 1..counts.len() {
                if remainder(i, &counts) > remainder(best, &counts) + EPS {
                    best = i;
                }
            }
            counts[best] += 1;
            total += 1;
        }
        // Only reachable through rounding or clamping: take back from the most over-served domain.
        while total > n {
            let mut worst = None;
            for i in (0..counts.len()).filter(|&i| counts[i] > 0) {
                if worst.is_none_or(|w| remainder(i, &counts) < remainder(w, &counts) - EPS) {
                    worst = Some(i);
                }
            }
            let Some(worst) = worst else { break };
            counts[worst] -= 1;
            total -= 1;
        }
        for (i, domain) in self.domains.iter_mut().enumerate() {
            domain.credit = quotas[i] - counts[i] as f64;
        }
        // The credits sum to zero in exact arithmetic; remove floating-point drift so it cannot build up.
        let drift = self.domains.iter().map(|d| d.credit).sum::<f64>() / self.domains.len() as f64;
        for domain in &mut self.domains {
            domain.credit -= drift;
        }
        counts
    }
}

impl DomainState {
    fn draw(&mut self) -> Example {
        if self.cursor == self.order.len() {
            self.epoch += 1;
            self.order = epoch_order(self.examples.len(), self.seed, self.epoch);
            self.cursor = 0;
        }
        let example = self.examples[self.order[self.cursor]].clone();
        self.cursor += 1;
        example
    }
}

/// The order of a domain's `n` examples in `epoch`: a shuffle of its own, independent of earlier epochs.
fn epoch_order(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let seed = if epoch == 0 {
        seed
    } else {
        super::mix_seed(&[seed, epoch])
    };
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut StdRng::seed_from_u64(seed));
    order
}

/// FNV-1a over every field of every example, in order (fields separated so "ab"+"c" != "a"+"bc").
fn fingerprint(examples: &[Example]) -> u64 {
    let mut bytes = Vec::new();
    for e in examples {
        for field in [&e.prompt, &e.ground_truth, &e.domain] {
            bytes.extend_from_slice(field.as_bytes());
            bytes.push(0);
        }
        bytes.extend_from_slice(e.response.as_deref().unwrap_or("\u{1}").as_bytes());
        bytes.push(0);
    }
    fnv1a(&bytes)
}

pub(crate) use crate::seed::fnv1a;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn examples(domain: &str, n: usize) -> Vec<Example> {
        (0..n)
            .map(|i| Example {
                prompt: format!("{domain}-{i}"),
                ground_truth: i.to_string(),
                domain: domain.to_string(),
                response: None,
                metadata: None,
            })
            .collect()
    }

    fn mixer(weights: &[(&str, usize, f64)], seed: u64) -> DomainMixer {
        let domains = weights
            .iter()
            .map(|&(name, size, weight)| (name.to_string(), examples(name, size), weight))
            .collect();
        DomainMixer::new(domains, seed).unwrap()
    }

    /// Per-domain counts of a batch, in the mixer's domain order.
    fn counts(mixer: &DomainMixer, batch: &[Example]) -> Vec<usize> {
        mixer
            .domains()
            .iter()
            .map(|d| batch.iter().filter(|e| &e.domain == d).count())
            .collect()
    }

    #[test]
    fn equal_weights_split_evenly() {
        let mut m = mixer(&[("a", 10, 1.0), ("b", 10, 1.0)], 0);
        for _ in 0..5 {
            let batch = m.next_batch(8);
            assert_eq!(batch.len(), 8);
            assert_eq!(counts(&m, &batch), [4, 4]);
        }
    }

    #[test]
    fn three_to_one() {
        // 8 * 3/4 = 6, 8 * 1/4 = 2, no remainders. Unnormalised weights give the same split.
        for weights in [(3.0, 1.0), (0.75, 0.25), (30.0, 10.0)] {
            let mut m = mixer(&[("a", 5, weights.0), ("b", 5, weights.1)], 1);
            for _ in 0..4 {
                let batch = m.next_batch(8);
                assert_eq!(counts(&m, &batch), [6, 2]);
            }
        }
    }

    #[test]
    fn odd_prompt_alternates() {
        // Quotas: 1.5/1.5 -> tie, first domain gets 2, credits -0.5/+0.5 -> next quotas 1.0/2.0.
        let mut m = mixer(&[("a", 4, 1.0), ("b", 4, 1.0)], 2);
        let seen: Vec<Vec<usize>> = (0..6)
            .map(|_| {
                let batch = m.next_batch(3);
                counts(&m, &batch)
            })
            .collect();
        assert_eq!(seen, [[2, 1], [1, 2], [2, 1], [1, 2], [2, 1], [1, 2]]);
    }

    #[test]
    fn single_prompt_batches_round_robin() {
        let mut m = mixer(&[("a", 2, 1.0), ("b", 2, 1.0), ("c", 2, 1.0)], 3);
        let order: Vec<String> = (0..9).map(|_| m.next_batch(1)[0].domain.clone()).collect();
        assert_eq!(order, ["a", "b", "c", "a", "b", "c", "a", "b", "c"]);
    }

    #[test]
    fn long_run_proportions_are_exact() {
        // Weights 2:3:5 over 100 batches of 7 = 700 prompts -> exactly 140/210/350, and after every
        // batch each cumulative count is within 1 of its exact share.
        let mut m = mixer(&[("a", 3, 0.2), ("b", 7, 0.3), ("c", 11, 0.5)], 4);
        let shares = [0.2, 0.3, 0.5];
        let mut cumulative = [0usize; 3];
        for step in 1..=100 {
            let batch = m.next_batch(7);
            assert_eq!(batch.len(), 7);
            for (total, got) in cumulative.iter_mut().zip(counts(&m, &batch)) {
                *total += got;
            }
            for (total, share) in cumulative.iter().zip(shares) {
                let exact = (7 * step) as f64 * share;
                assert!(
                    (*total as f64 - exact).abs() < 1.0,
                    "step {step}: {cumulative:?}"
                );
            }
        }
        assert_eq!(cumulative, [140, 210, 350]);
    }

    #[test]
    fn tiny_weight_still_gets_its_share() {
        // 1:99 with batches of 10: domain a is owed 0.1 per batch -> one prompt every 10 batches.
        let mut m = mixer(&[("a", 3, 1.0), ("b", 3, 99.0)], 5);
        let a_total: usize = (0..100)
            .map(|_| {
                let batch = m.next_batch(10);
                counts(&m, &batch)[0]
            })
            .sum();
        assert_eq!(a_total, 10);
    }

    #[test]
    fn same_seed_same_batches() {
        let spec = [("math", 13, 2.0), ("code", 5, 1.0)];
        let (mut m1, mut m2) = (mixer(&spec, 42), mixer(&spec, 42));
        let run1: Vec<Vec<Example>> = (0..10).map(|_| m1.next_batch(6)).collect();
        let run2: Vec<Vec<Example>> = (0..10).map(|_| m2.next_batch(6)).collect();
        assert_eq!(run1, run2);
        let mut m3 = mixer(&spec, 43);
        let run3: Vec<Vec<Example>> = (0..10).map(|_| m3.next_batch(6)).collect();
        assert_ne!(run1, run3);
    }

    #[test]
    fn restored_state_continues_the_same_stream() {
        let spec = [("math", 7, 2.0), ("code", 5, 1.0)];
        let mut whole = mixer(&spec, 3);
        let mut first = mixer(&spec, 3);
        // Uneven batch sizes (as dynamic sampling makes) and several epochs.
        for n in [5, 1, 4, 7, 2] {
            assert_eq!(whole.next_batch(n), first.next_batch(n));
        }
        let json = serde_json::to_string(&first.state()).unwrap();
        let mut resumed = mixer(&spec, 3);
        resumed
            .restore(&serde_json::from_str(&json).unwrap())
            .unwrap();
        for n in [3, 6, 1, 9, 4, 4] {
            assert_eq!(whole.next_batch(n), resumed.next_batch(n));
        }
        let other = mixer(&[("math", 7, 1.0)], 3).state();
        let err = resumed.restore(&other).unwrap_err().to_string();
        assert!(
            err.starts_with("resume: the checkpoint's data cursor is for domains"),
            "{err}"
        );
        // Same names, different examples.
        let mut changed = mixer(&[("math", 8, 2.0), ("code", 5, 1.0)], 3);
        let err = changed.restore(&first.state()).unwrap_err().to_string();
        assert!(
            err.contains("the examples of domain 'math' changed"),
            "{err}"
        );
    }

    #[test]
    fn domain_order_does_not_change_a_domains_stream() {
        let mut m1 = mixer(&[("x", 9, 1.0), ("y", 9, 1.0)], 7);
        let mut m2 = mixer(&[("y", 9, 1.0), ("x", 9, 1.0)], 7);
        let xs = |m: &mut DomainMixer| -> Vec<String> {
            (0..5)
                .flat_map(|_| m.next_batch(4))
                .filter(|e| e.domain == "x")
                .map(|e| e.prompt)
                .collect()
        };
        assert_eq!(xs(&mut m1), xs(&mut m2));
    }

    #[test]
    fn each_epoch_covers_every_example_and_reshuffles() {
        let mut m = mixer(&[("a", 6, 1.0)], 9);
        let mut orders = Vec::new();
        for epoch in 0..8u64 {
            let batch = m.next_batch(6);
            assert_eq!(m.epochs(), [("a".to_string(), epoch)]);
            let mut prompts: Vec<String> = batch.into_iter().map(|e| e.prompt).collect();
            orders.push(prompts.clone());
            prompts.sort();
            assert_eq!(
                prompts,
                examples("a", 6)
                    .into_iter()
                    .map(|e| e.prompt)
                    .collect::<Vec<_>>()
            );
        }
        // 8 shuffles of 6 items all identical has probability (1/720)^7.
        assert!(orders.iter().any(|o| o != &orders[0]));
    }

    #[test]
    fn batches_larger_than_a_domain_wrap_into_the_next_epoch() {
        let mut m = mixer(&[("a", 3, 1.0)], 11);
        let batch = m.next_batch(7);
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        for e in &batch {
            *seen.entry(e.prompt.clone()).or_default() += 1;
        }
        // 7 = 3 + 3 + 1: every example twice, one of them a third time.
        assert_eq!(seen.len(), 3);
        assert_eq!(seen.values().sum::<usize>(), 7);
        assert!(seen.values().all(|&c| c == 2 || c == 3));
        assert_eq!(m.epochs(), [("a".to_string(), 2)]);
    }

    #[test]
    fn empty_batch_changes_nothing() {
        let mut m1 = mixer(&[("a", 4, 1.0), ("b", 4, 1.0)], 13);
        let mut m2 = mixer(&[("a", 4, 1.0), ("b", 4, 1.0)], 13);
        assert!(m1.next_batch(0).is_empty());
        assert_eq!(m1.next_batch(3), m2.next_batch(3));
    }

    #[test]
    fn domains_in_given_order() {
        let m = mixer(&[("math", 1, 1.0), ("code", 1, 2.0), ("logic", 1, 0.5)], 0);
        assert_eq!(m.domains(), ["math", "code", "logic"]);
    }

    #[test]
    fn construction_errors() {
        let err = |domains: Vec<(String, Vec<Example>, f64)>| {
            DomainMixer::new(domains, 0).unwrap_err().to_string()
        };
        assert_eq!(err(Vec::new()), "domain mix: no domains");
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let message = err(vec![("math".into(), examples("math", 1), bad)]);
            assert!(
                message.starts_with("domain mix: domain 'math' has ratio "),
                "{message}"
            );
        }
        assert_eq!(
            err(vec![
                ("math".into(), examples("math", 1), 1.0),
                ("code".into(), Vec::new(), 1.0)
            ]),
            "domain mix: domain 'code' has no examples"
        );
        assert_eq!(
            err(vec![
                ("math".into(), examples("math", 1), 1.0),
                ("math".into(), examples("math", 1), 2.0)
            ]),
            "domain mix: domain 'math' is listed twice"
        );
    }

    #[test]
    fn fnv1a_reference_values() {
        // Published FNV-1a 64 test vectors: "" -> offset basis, "a" -> 0xaf63dc4c8601ec8c.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
