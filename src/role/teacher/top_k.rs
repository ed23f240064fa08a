//! The teacher's top k: for every response position, the k most likely next tokens and their
//! log-probs renormalised over those k (what ROLL's teacher sends the student), computed one row's
//! logits at a time on the host.

use candle_core::{DType, Tensor};

use crate::model::{Numerics, Transformer};
use crate::role::rows::Rows;
use crate::role::{RunError, TensorContext};
use crate::train::TrainBatch;
use crate::train::batch::response_hidden;

/// A batch's top k per response position: ids (n, R, k) u32, most likely first, and their
/// log-probs renormalised over the k (n, R, k) f32.
pub struct TopK {
    pub ids: Tensor,
    pub logp: Tensor,
}

/// The top `k` of every response position of `rows` (padded to `rows.width`) under `model`'s
/// logits over its first `vocab` ids divided by `temperature` (`pad_id` fills short rows): what
/// the teacher role computes, here or in its worker.
pub fn top_k_of_model(
    model: &Transformer,
    pad_id: u32,
    vocab: usize,
    rows: &Rows<'_>,
    k: usize,
    temperature: f64,
) -> Result<TopK, RunError> {
    let t = model;
    let width = rows.width;
    let (mut ids, mut logp) = (vec![], vec![]);
    let pairs: Vec<(&[u32], &[u32])> = rows
        .prompts
        .iter()
        .zip(rows.responses)
        .map(|(p, r)| (p.as_slice(), r.as_slice()))
        .collect();
    for chunk in pairs.chunks(rows.micro.max(1)) {
        let tb = TrainBatch::new(chunk, pad_id, t.config().kv_groups(), t.device())
            .during("teacher batch")?;
        let hidden = response_hidden(t, &tb, Numerics::Fast, None).during("teacher forward")?;
        let logits = t
            .logits(&hidden, Numerics::Fast)
            .and_then(|l| l.narrow(2, 0, vocab))
            .during("teacher logits")?;
        // One row's (R, vocab) logits on the host at a time, not the chunk's.
        for i in 0..chunk.len() {
            let row = logits
                .get(i)
                .and_then(|l| l.to_dtype(DType::F32))
                .and_then(|l| l.to_vec2::<f32>())
                .during("teacher logits")?;
            let first = top_k_of(&row[0], k, temperature);
            for pos in 0..width {
                // Past this row's response (a shorter row, or a narrower chunk than the batch):
                // its first position's top k again, which the loss masks.
                let (i, l) = match row.get(pos) {
                    Some(at) if pos > 0 => top_k_of(at, k, temperature),
                    _ => first.clone(),
                };
                ids.extend(i);
                logp.extend(l);
            }
        }
    }
    let n = rows.prompts.len();
    let host = crate::device::host();
    Ok(TopK {
        ids: Tensor::from_vec(ids, (n, width, k), &host).during("teacher top-k")?,
        logp: Tensor::from_vec(logp, (n, width, k), &host).during("teacher top-k")?,
    })
}

/// The `k` largest of `logits / temperature`, largest first (ties: the lower id first), and their
/// log-softmax over the k.
pub fn top_k_of(logits: &[f32], k: usize, temperature: f64) -> (Vec<u32>, Vec<f32>) {
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    let by_logit = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if k < order.len() {
        order.select_nth_unstable_by(k, by_logit);
        order.truncate(k);
    }
    order.sort_by(by_logit);
    let scaled: Vec<f64> = order
        .iter()
        .map(|&i| logits[i as usize] as f64 / temperature)
        .collect();
    let max = scaled.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = max + scaled.iter().map(|s| (s - max).exp()).sum::<f64>().ln();
    (order, scaled.iter().map(|s| (s - lse) as f32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of unequal lengths in chunks narrower than the batch (a chunk's longest response is
    /// shorter than the batch's) give what one chunk of all rows gives, padding included.
    #[test]
    fn the_top_k_do_not_depend_on_how_rows_are_chunked() {
        let model = crate::model::hf_dir::tiny_test_model("0123456789", 32, 5);
        let prompts = vec![vec![3, 4], vec![5], vec![6, 7, 8]];
        let responses = vec![vec![9, 3], vec![4, 5, 6, 7, 8], vec![3]];
        let top = |micro| {
            let rows = Rows {
                prompts: &prompts,
                responses: &responses,
                micro,
                width: 5,
            };
            let t =
                top_k_of_model(&model.transformer, model.pad_id, 13, &rows, 4, 1.5).expect("top k");
            (
                t.ids.to_vec3::<u32>().expect("ids"),
                t.logp.to_vec3::<f32>().expect("logp"),
            )
        };
        let (whole, chunked) = (top(3), top(1));
        assert_eq!(whole, chunked);
        assert_eq!(whole.0.len(), 3);
        assert_eq!(whole.0[2].len(), 5);
    }

    #[test]
    fn the_top_k_are_the_largest_first_and_renormalised_over_the_k() {
        let logits = [0.5f32, 3.0, -1.0, 3.0, 2.0];
        let (ids, logp) = top_k_of(&logits, 3, 2.0);
        // 3.0 twice (id 1 before id 3), then 2.0.
        assert_eq!(ids, [1, 3, 4]);
        // Over the three at temperature 2: 1.5, 1.5, 1.0.
        let lse = (2.0 * 1.5f64.exp() + 1.0f64.exp()).ln();
        let want = [1.5 - lse, 1.5 - lse, 1.0 - lse];
        for (g, w) in logp.iter().zip(want) {
            assert!((*g as f64 - w).abs() < 1e-6, "{logp:?}");
        }
        let (all, _) = top_k_of(&logits, 5, 1.0);
        assert_eq!(all, [1, 3, 4, 0, 2]);
    }
}
