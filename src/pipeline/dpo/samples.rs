//! A DPO step's pairs as samples, for the Samples view and `roll-tui samples`: each pair two
//! records under its prompt, the chosen completion then the rejected one, each with its implicit
//! reward β (log π(y|x) − log π_ref(y|x)) (summed log-probs, as TRL's `rewards/chosen` and
//! `rewards/rejected` take them) from the policy's log-probs the step's first epoch read
//! (`ActorReport::row_logps`, what the step's metrics are made of) and the reference's.
//!
//! Both records of a pair are `correct` when the pair is ranked right (the chosen completion's
//! implicit reward above the rejected one's): a group's "ok" count is 2/2 or 0/2, and the view's
//! wrong-only filter keeps the pairs the policy still ranks wrong. `finish_reason` says which
//! side a record is; the breakdown holds both log-probs and the pair's margin.

use std::collections::BTreeMap;

use candle_core::Tensor;

use super::PairSet;
use crate::algo::preference::sequence_logps;
use crate::config::Stage;
use crate::metrics::SampleRecord;
use crate::pipeline::{RunError, TensorContext};

/// What the records of one step's pairs are made from.
pub(super) struct StepPairs<'a> {
    pub step: usize,
    pub set: &'a PairSet,
    /// The step's pairs, by their place in the set; row 2k is pair k's chosen completion.
    pub idx: &'a [usize],
    /// The policy's summed log-prob of each row, by row.
    pub row_logps: &'a BTreeMap<u32, f32>,
    /// The reference's per-token log-probs (rows, width) and the response mask over them.
    pub ref_logp: &'a Tensor,
    pub mask: &'a Tensor,
    pub beta: f64,
}

impl StepPairs<'_> {
    /// The records, chosen then rejected per pair, in the step's order. A pair whose rows the
    /// report lacks is left out.
    pub fn records(
        &self,
        decode: impl Fn(&[u32]) -> String,
    ) -> Result<Vec<SampleRecord>, RunError> {
        let ref_sums = sequence_logps(self.ref_logp, self.mask)
            .and_then(|x| x.to_vec1::<f32>())
            .during("dpo samples")?;
        let mut out = Vec::with_capacity(2 * self.idx.len());
        for (k, &i) in self.idx.iter().enumerate() {
            let pair = &self.set.pairs[i];
            let rows = [2 * k, 2 * k + 1];
            let (Some(&c), Some(&r)) = (
                self.row_logps.get(&(rows[0] as u32)),
                self.row_logps.get(&(rows[1] as u32)),
            ) else {
                continue;
            };
            let logps = [c, r];
            let refs = [ref_sums[rows[0]], ref_sums[rows[1]]];
            let reward = |side: usize| self.beta * f64::from(logps[side] - refs[side]);
            let margin = reward(0) - reward(1);
            let prompt = decode(&pair.prompt);
            let domain = self
                .set
                .domains
                .get(pair.domain as usize)
                .cloned()
                .unwrap_or_default();
            for (side, (label, completion)) in
                [("chosen", &pair.chosen), ("rejected", &pair.rejected)]
                    .into_iter()
                    .enumerate()
            {
                out.push(SampleRecord {
                    stage: Stage::Dpo.as_str().into(),
                    step: self.step,
                    domain: domain.clone(),
                    prompt: prompt.clone(),
                    response: decode(completion),
                    ground_truth: String::new(),
                    reward: reward(side) as f32,
                    correct: margin > 0.0,
                    breakdown: [
                        ("logp", f64::from(logps[side])),
                        ("ref_logp", f64::from(refs[side])),
                        ("margin", margin),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect(),
                    advantage: f32::NAN,
                    prompt_tokens: pair.prompt.len(),
                    response_tokens: completion.len(),
                    finish_reason: label.into(),
                    policy_version: self.step - 1,
                    tokens: None,
                });
            }
        }
        Ok(out)
    }
}
