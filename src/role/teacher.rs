//! The teacher role of distillation: a frozen model of its own (`distill.teacher`), which gives,
//! for every response position of a batch, its k most likely next tokens and their log-probs
//! renormalised over those k (what ROLL's teacher sends the student). Only the top k leave the
//! role: (ids u32, log-probs f32) per position, 8 k bytes per token, never a vocabulary's row.
//!
//! The teacher must tokenize as the student does (the ids of one are the ids of the other):
//! [`Teacher::load`] compares the two vocabularies and refuses a mismatch, naming what differs.
//! A teacher whose head is wider than the student's (vocabularies padded to different sizes, as
//! Qwen2.5's are) offers only the student's ids.

use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::{RoleError, TensorContext};
use crate::model::{LoadedModel, Numerics, load_model_dir};
use crate::train::TrainBatch;
use crate::train::batch::response_hidden;

/// A batch's top k per response position: ids (n, R, k) u32, most likely first, and their
/// log-probs renormalised over the k (n, R, k) f32.
pub struct TopK {
    pub ids: Tensor,
    pub logp: Tensor,
}

pub struct Teacher {
    model: LoadedModel,
    /// The student's head width: ids at or past it are not offered.
    student_vocab: usize,
}

impl Teacher {
    /// The teacher at `dir` in `dtype` on `device`, checked against the student's tokenizer.
    pub fn load(
        dir: &Path,
        dtype: DType,
        device: &Device,
        student: &LoadedModel,
    ) -> Result<Teacher, RoleError> {
        let model = load_model_dir(dir, Some(dtype), device)
            .map_err(|e| RoleError::Setup(format!("distill.teacher '{}': {e}", dir.display())))?;
        same_vocabulary(&model, student)
            .map_err(|e| RoleError::Setup(format!("distill.teacher '{}': {e}", dir.display())))?;
        Ok(Teacher {
            model,
            student_vocab: student.config().vocab_size,
        })
    }

    /// The teacher's model.
    pub fn model(&self) -> &LoadedModel {
        &self.model
    }

    /// The ids the teacher can offer: those both heads have.
    pub fn vocab(&self) -> usize {
        self.student_vocab.min(self.model.config().vocab_size)
    }

    /// The top `k` of every response position of the (prompt, response) rows, `micro` rows per
    /// forward, under the teacher's logits divided by `temperature` (ROLL: `kd_temperature`
    /// times `teacher_temperature`).
    pub fn top_k(
        &self,
        rows: &[(&[u32], &[u32])],
        micro: usize,
        k: usize,
        temperature: f64,
    ) -> Result<TopK, RoleError> {
        let vocab = self.vocab();
        if k > vocab {
            return Err(RoleError::Setup(format!(
                "distill.logits_topk {k} is larger than the vocabulary ({vocab} ids)"
            )));
        }
        let t = &self.model.transformer;
        let width = rows.iter().map(|(_, r)| r.len()).max().unwrap_or(0);
        let (mut ids, mut logp) = (vec![], vec![]);
        for chunk in rows.chunks(micro.max(1)) {
            let tb = TrainBatch::new(chunk, self.model.pad_id, t.config().kv_groups(), t.device())
                .during("teacher batch")?;
            let hidden = response_hidden(t, &tb, Numerics::Fast, None).during("teacher forward")?;
            let logits = t
                .logits(&hidden, Numerics::Fast)
                .and_then(|l| l.narrow(2, 0, vocab))
                .and_then(|l| l.to_dtype(DType::F32))
                .and_then(|l| l.to_vec3::<f32>())
                .during("teacher logits")?;
            for row in logits {
                for pos in 0..width {
                    // Past this row's response: the first position again (masked out later).
                    let at = row.get(pos).unwrap_or(&row[0]);
                    let (i, l) = top_k_of(at, k, temperature);
                    ids.extend(i);
                    logp.extend(l);
                }
            }
        }
        let n = rows.len();
        let dev = t.device();
        Ok(TopK {
            ids: Tensor::from_vec(ids, (n, width, k), dev).during("teacher top-k")?,
            logp: Tensor::from_vec(logp, (n, width, k), dev).during("teacher top-k")?,
        })
    }
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

/// Whether the teacher tokenizes as the student does: the same token for every id.
fn same_vocabulary(teacher: &LoadedModel, student: &LoadedModel) -> Result<(), String> {
    let (t, s) = (
        teacher.tokenizer.tokenizer.get_vocab(true),
        student.tokenizer.tokenizer.get_vocab(true),
    );
    if t.len() != s.len() {
        return Err(format!(
            "its tokenizer has {} tokens and the student's {}: distillation needs one tokenizer",
            t.len(),
            s.len()
        ));
    }
    let mut differ: Vec<(&String, u32, Option<u32>)> = s
        .iter()
        .filter_map(|(token, &id)| {
            let theirs = t.get(token).copied();
            (theirs != Some(id)).then_some((token, id, theirs))
        })
        .collect();
    differ.sort_by_key(|(_, id, _)| *id);
    match differ.first() {
        None => Ok(()),
        Some((token, id, theirs)) => Err(format!(
            "its tokenizer differs from the student's in {} tokens, the first {token:?}: id {id} \
             for the student, {} for the teacher; distillation needs one tokenizer",
            differ.len(),
            theirs.map_or("none".to_string(), |i| i.to_string())
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
