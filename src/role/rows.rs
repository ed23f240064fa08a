//! The token rows that model roles score (reference log-probs, critic values), cut into
//! micro-batches and stitched back into (n, width) tensors.

use candle_core::Tensor;

use crate::algo::advantage::AdvantageEstimator;
use crate::model::threads::{lane_parts, side_by_side};
use crate::model::{Numerics, Transformer};
use crate::train::{TrainBatch, response_forward};

/// The token rows of a batch as (prompt, response) pairs, cut into micro-batches.
pub struct Rows<'a> {
    pub prompts: &'a [Vec<u32>],
    pub responses: &'a [Vec<u32>],
    pub micro: usize,
    /// Columns of the stitched (n, width) result: the longest response.
    pub width: usize,
}

/// Run `f` over micro-batches of rows (batched for `model`, each cut into the model's
/// [lanes](crate::model::threads::lanes) worked on side by side) and stitch the (rows, r) results
/// into (n, width).
pub fn chunked(
    model: &Transformer,
    pad_id: u32,
    rows: &Rows<'_>,
    f: &(dyn Fn(&TrainBatch) -> candle_core::Result<Tensor> + Sync),
) -> candle_core::Result<Tensor> {
    let lanes = model.lanes();
    let mut parts = vec![];
    let groups = model.config().kv_groups();
    let n = rows.prompts.len();
    for start in (0..n).step_by(rows.micro) {
        let end = (start + rows.micro).min(n);
        let pairs: Vec<(&[u32], &[u32])> = (start..end)
            .map(|i| (rows.prompts[i].as_slice(), rows.responses[i].as_slice()))
            .collect();
        let in_lanes: Vec<&[(&[u32], &[u32])]> = lane_parts(&pairs, lanes).collect();
        let outs = side_by_side(&in_lanes, |pairs| {
            let tb = TrainBatch::new(pairs, pad_id, groups, model.device())?;
            let out = f(&tb)?;
            let r = out.dim(1)?;
            out.pad_with_zeros(1, 0, rows.width - r)
        });
        for out in outs {
            parts.push(out?);
        }
    }
    Tensor::cat(&parts, 0)
}

/// Log-probabilities of every response token under `model` (the KL reference), (n, width).
pub fn response_logprobs(
    model: &Transformer,
    pad_id: u32,
    rows: &Rows<'_>,
    temperature: f64,
) -> candle_core::Result<Tensor> {
    chunked(model, pad_id, rows, &|tb| {
        Ok(response_forward(model, tb, temperature, Numerics::Fast, false, None)?.0)
    })
}

/// Whether this estimator needs the critic.
pub fn needs_critic(est: AdvantageEstimator) -> bool {
    est == AdvantageEstimator::Gae
}
