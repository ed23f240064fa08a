//! DPO's data as the stage trains on it: the pairs of a file tokenized once (a bad pair refused
//! with its line, a pair too long for the model skipped and counted), the seeded order that deals
//! them into batches, and the rows a batch of pairs is trained as.

use std::path::{Path, PathBuf};

use rand::seq::SliceRandom;
use rand::{SeedableRng, rngs::StdRng};

use super::super::RunError;
use super::super::setup::{MAX_PROMPT_BYTES_PER_POSITION, Tokenizing};
use crate::data::pairs::{PairPrompt, load_pairs};
use crate::data::{DataError, mix_seed};
use crate::role::rows::Rows;

/// One pair as token ids; the completions end with the end-of-sequence token.
pub struct TokenPair {
    pub prompt: Vec<u32>,
    pub chosen: Vec<u32>,
    pub rejected: Vec<u32>,
    /// Its domain: an index into [`PairSet::domains`].
    pub domain: u32,
}

/// The pairs of one file.
pub struct PairSet {
    pub path: PathBuf,
    pub pairs: Vec<TokenPair>,
    /// Pairs longer than the model's positions, left out.
    pub skipped: usize,
    /// FNV-1a over the pairs' tokens: a resume refuses pairs that changed since the checkpoint.
    pub fingerprint: u64,
    /// The pairs' domains in the order they first appear, when any pair has a `domain` tag
    /// (untagged pairs then count as `untagged`); empty when none has.
    pub domains: Vec<String>,
}

impl PairSet {
    /// Read and tokenize the pairs of `path` for a model of `positions` positions.
    pub fn load(path: &Path, tok: Tokenizing<'_>, positions: usize) -> Result<PairSet, RunError> {
        let shown = path.display().to_string();
        let mut pairs = vec![];
        let mut skipped = 0;
        let all = load_pairs(path)?;
        let tagged = all.iter().any(|p| p.domain.is_some());
        let mut domains: Vec<String> = vec![];
        for pair in all {
            let bad = |message: String| {
                RunError::Data(DataError::Line {
                    path: shown.clone(),
                    line: pair.line,
                    message,
                })
            };
            let prompt = match &pair.prompt {
                PairPrompt::Text(text) => {
                    // Refused before tokenizing, as prompt datasets' are (see `setup`).
                    if text.len() > positions * MAX_PROMPT_BYTES_PER_POSITION {
                        return Err(bad(format!(
                            "the prompt is {} bytes; the model holds {positions} positions",
                            text.len()
                        )));
                    }
                    tok.prompt_ids(text)
                }
                PairPrompt::Messages(messages) => tok.messages_ids(messages),
            }
            .map_err(|e| bad(format!("prompt {e}")))?;
            let chosen = tok
                .answer_ids(&pair.chosen)
                .map_err(|e| bad(format!("chosen {e}")))?;
            let rejected = tok
                .answer_ids(&pair.rejected)
                .map_err(|e| bad(format!("rejected {e}")))?;
            if prompt.len() + chosen.len().max(rejected.len()) > positions {
                skipped += 1;
                continue;
            }
            let name = pair.domain.as_deref().unwrap_or("untagged");
            let domain = match domains.iter().position(|d| d == name) {
                Some(i) => i,
                None => {
                    domains.push(name.to_string());
                    domains.len() - 1
                }
            } as u32;
            pairs.push(TokenPair {
                prompt,
                chosen,
                rejected,
                domain,
            });
        }
        if pairs.is_empty() {
            return Err(RunError::Setup(format!(
                "dataset '{shown}': every one of its {skipped} pairs is longer than the model's \
                 {positions} positions (prompt and completion together)"
            )));
        }
        let mut bytes = vec![];
        for p in &pairs {
            for ids in [&p.prompt, &p.chosen, &p.rejected] {
                bytes.extend(ids.iter().flat_map(|id| id.to_le_bytes()));
                bytes.extend(u32::MAX.to_le_bytes());
            }
        }
        Ok(PairSet {
            path: path.to_path_buf(),
            pairs,
            skipped,
            fingerprint: crate::data::mix::fnv1a(&bytes),
            domains: if tagged { domains } else { vec![] },
        })
    }

    /// The domain index of each of the pairs `idx` (empty when the set has no domains).
    pub fn domains_of(&self, idx: &[usize]) -> Vec<u32> {
        if self.domains.is_empty() {
            return vec![];
        }
        idx.iter().map(|&i| self.pairs[i].domain).collect()
    }

    /// Metric keys `<prefix>/<index>/<name>` of the role, named: `<prefix>/<domain>/<name>`.
    pub fn name_domains(&self, m: crate::metrics::Metrics) -> crate::metrics::Metrics {
        m.into_iter()
            .map(|(key, v)| {
                let parts: Vec<&str> = key.split('/').collect();
                let named = match parts.as_slice() {
                    [prefix, index, name] => index
                        .parse::<usize>()
                        .ok()
                        .and_then(|i| self.domains.get(i))
                        .map(|d| format!("{prefix}/{d}/{name}")),
                    _ => None,
                };
                (named.unwrap_or(key), v)
            })
            .collect()
    }

    /// The rows of the pairs `idx`, chosen then rejected for each.
    pub fn rows<'a>(&self, idx: &'a [usize]) -> PairRows<'a> {
        let (prompts, responses) = idx
            .iter()
            .flat_map(|&i| {
                let p = &self.pairs[i];
                [
                    (p.prompt.clone(), p.chosen.clone()),
                    (p.prompt.clone(), p.rejected.clone()),
                ]
            })
            .unzip();
        PairRows {
            idx,
            prompts,
            responses,
        }
    }
}

/// The rows of some pairs of a set, built once for every use a batch has of them (the
/// reference's log-probs, the policy's, the training step).
pub struct PairRows<'a> {
    /// The pairs, by their place in the set.
    pub idx: &'a [usize],
    pub prompts: Vec<Vec<u32>>,
    pub responses: Vec<Vec<u32>>,
}

impl PairRows<'_> {
    /// The longest response.
    pub fn width(&self) -> usize {
        self.responses.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// The rows as a forward pass takes them, `micro` at a time.
    pub fn as_rows(&self, micro: usize) -> Rows<'_> {
        Rows {
            prompts: &self.prompts,
            responses: &self.responses,
            micro,
            width: self.width(),
        }
    }
}

/// The order pairs are dealt in: every pair once an epoch, each epoch in its own seeded random
/// order. A batch depends only on its step, so a resumed stage deals what an uninterrupted one
/// would have without keeping a cursor.
pub struct PairOrder {
    n: usize,
    seed: u64,
    epoch: Option<usize>,
    perm: Vec<usize>,
}

impl PairOrder {
    pub fn new(n: usize, seed: u64) -> PairOrder {
        PairOrder {
            n,
            seed,
            epoch: None,
            perm: vec![],
        }
    }

    /// The pairs of step `step` (from 1), `size` of them.
    pub fn batch(&mut self, step: usize, size: usize) -> Vec<usize> {
        ((step - 1) * size..step * size)
            .map(|position| self.at(position))
            .collect()
    }

    fn at(&mut self, position: usize) -> usize {
        let epoch = position / self.n;
        if self.epoch != Some(epoch) {
            self.perm = (0..self.n).collect();
            self.perm.shuffle(&mut StdRng::seed_from_u64(mix_seed(&[
                self.seed,
                epoch as u64,
            ])));
            self.epoch = Some(epoch);
        }
        self.perm[position % self.n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_take_every_pair_once_an_epoch_and_depend_only_on_their_step() {
        let mut order = PairOrder::new(5, 9);
        let steps: Vec<Vec<usize>> = (1..=5).map(|s| order.batch(s, 2)).collect();
        let mut first_epoch: Vec<usize> = steps.concat()[..5].to_vec();
        first_epoch.sort();
        assert_eq!(first_epoch, [0, 1, 2, 3, 4]);
        let mut second_epoch: Vec<usize> = steps.concat()[5..10].to_vec();
        second_epoch.sort();
        assert_eq!(second_epoch, [0, 1, 2, 3, 4]);
        // A fresh order (a resumed stage) deals step 4 as the first one did.
        assert_eq!(PairOrder::new(5, 9).batch(4, 2), steps[3]);
        // Another seed, another order.
        assert_ne!(
            (1..=5)
                .map(|s| PairOrder::new(5, 10).batch(s, 2))
                .collect::<Vec<_>>(),
            steps
        );
    }
}
