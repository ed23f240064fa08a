//! The token rows that model roles score (reference log-probs, critic values), cut into
//! micro-batches and stitched back into (n, width) tensors.

use candle_core::Tensor;

use crate::algo::advantage::AdvantageEstimator;
use crate::model::threads::{micro_batches_in_lanes, side_by_side};
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
    let (mut parts, mut taken) = (vec![], vec![]);
    let groups = model.config().kv_groups();
    let n = rows.prompts.len();
    let lens: Vec<(usize, usize)> = (0..n)
        .map(|i| (rows.prompts[i].len(), rows.responses[i].len()))
        .collect();
    for in_lanes in micro_batches_in_lanes(&lens, rows.micro, lanes) {
        let outs = side_by_side(&in_lanes, |part| {
            let pairs: Vec<(&[u32], &[u32])> = part
                .iter()
                .map(|&i| (rows.prompts[i].as_slice(), rows.responses[i].as_slice()))
                .collect();
            let tb = TrainBatch::new(&pairs, pad_id, groups, model.device())?;
            let out = f(&tb)?;
            let r = out.dim(1)?;
            out.pad_with_zeros(1, 0, rows.width - r)
        });
        for out in outs {
            parts.push(out?);
        }
        taken.extend(in_lanes.concat());
    }
    // The micro-batches took the rows by length: back to the rows' order.
    let mut place = vec![0u32; n];
    for (at, &row) in taken.iter().enumerate() {
        place[row] = at as u32;
    }
    let place = Tensor::from_vec(place, n, model.device())?;
    Tensor::cat(&parts, 0)?.index_select(&place, 0)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::hf_dir::tiny_test_model;

    /// The lanes take rows by length (`lane_rows`), not in order; each row's log-probs still
    /// land in its own row, as when it is scored alone (padding to `width` with zeros).
    #[test]
    fn rows_scored_in_lanes_come_back_in_their_own_order() {
        let model = tiny_test_model("0123456789", 32, 4);
        let m = &model.transformer;
        // Long and short rows interleaved, so ordering by length moves them.
        let prompts: Vec<Vec<u32>> = (0..7u32)
            .map(|i| vec![3 + i % 5; 1 + (i % 2) as usize])
            .collect();
        let responses: Vec<Vec<u32>> = (0..7u32)
            .map(|i| {
                (0..if i % 2 == 0 { 9 } else { 2 })
                    .map(|k| 3 + (i + k) % 9)
                    .collect()
            })
            .collect();
        let rows = Rows {
            prompts: &prompts,
            responses: &responses,
            micro: 4,
            width: 9,
        };
        let all = response_logprobs(m, 0, &rows, 1.0)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        for i in 0..7 {
            let one = Rows {
                prompts: &prompts[i..i + 1],
                responses: &responses[i..i + 1],
                micro: 1,
                width: 9,
            };
            let alone = response_logprobs(m, 0, &one, 1.0)
                .unwrap()
                .to_vec2::<f32>()
                .unwrap();
            for (a, b) in all[i].iter().zip(&alone[0]) {
                assert!(
                    (a - b).abs() < 1e-5,
                    "row {i}: {:?} vs {:?}",
                    all[i],
                    alone[0]
                );
            }
        }
    }
}
