//! The layout of prompt+response batches for training and scoring.
//!
//! Each pair is one sequence, its prompt then its response without the last token (whose logits
//! predict nothing): the logits at the sequence's position `P - 1 + k` predict response token
//! `k`. The sequences are packed into rows of the longest one's width ([`crate::model::packing`]), each
//! attending only to itself, and [`response_hidden`] gathers the positions that predict response
//! tokens into (b, R, hidden): row `i` is pair `i`, responses right-padded to the longest, R.

use candle_core::{DType, Device, Result, Tensor};

use crate::model::packing::{pack, segment_mask};
use crate::model::{Numerics, Tape, Transformer};
use roll_cpu_kernels::head as fused_head;

pub struct TrainBatch {
    /// (rows, W) u32: the packed sequences, `W` the longest one's length.
    pub input_ids: Tensor,
    /// (rows, W) u32: each token's position in its own sequence.
    pub positions: Tensor,
    /// (rows, 1, g*W, W) additive f32: block-diagonal and causal.
    pub attn_mask: Tensor,
    /// (b * R) u32: where, in the (rows * W) flattened positions, the hidden state that predicts
    /// response token k of pair i lies (at i * R + k). Past a response's end it repeats its
    /// first position, whose log-prob the response mask zeroes.
    pub response_positions: Tensor,
    /// When every row holds one pair, in order, and all prompts have one length P: P - 1, where
    /// the positions that predict response tokens start in every row. They are then one window of
    /// the rows, taken by a narrow, whose backward is a plain copy (the gather's adds row by row:
    /// 1% of the bench's forward+backward).
    pub response_window: Option<usize>,
    /// (b, R) u32: response tokens (0 at padding)
    pub targets: Tensor,
    /// (b, R) f32: 1 for real response tokens
    pub response_mask: Tensor,
    pub response_width: usize,
    pub response_lens: Vec<usize>,
}

impl TrainBatch {
    /// Build from (prompt, response) token pairs. Every prompt and response must be non-empty.
    pub fn new(
        pairs: &[(&[u32], &[u32])],
        pad_id: u32,
        kv_groups: usize,
        device: &Device,
    ) -> Result<Self> {
        if pairs.is_empty() {
            candle_core::bail!("empty training batch");
        }
        if let Some(i) = pairs.iter().position(|(p, r)| p.is_empty() || r.is_empty()) {
            candle_core::bail!("training batch row {i} has an empty prompt or response");
        }
        let lens: Vec<usize> = pairs.iter().map(|(p, r)| p.len() + r.len() - 1).collect();
        let packing = pack(&lens);
        let width = packing.width;
        let cells = packing.rows.len() * width;
        let (mut ids, mut pos) = (Vec::with_capacity(cells), Vec::with_capacity(cells));
        // Each sequence's first position in the flattened rows.
        let mut starts = vec![0; pairs.len()];
        for (n, row) in packing.rows.iter().enumerate() {
            let mut used = 0;
            for &i in row {
                let (prompt, response) = pairs[i];
                starts[i] = n * width + used;
                ids.extend(prompt.iter().chain(response.iter()).take(lens[i]).copied());
                pos.extend(0..lens[i] as u32);
                used += lens[i];
            }
            ids.extend(std::iter::repeat_n(pad_id, width - used));
            pos.extend(std::iter::repeat_n(0u32, width - used));
        }
        let segments: Vec<Vec<usize>> = packing
            .rows
            .iter()
            .map(|row| row.iter().map(|&i| lens[i]).collect())
            .collect();
        let r_w = pairs.iter().map(|(_, r)| r.len()).max().unwrap_or(0);
        let b = pairs.len();
        let (mut targets, mut mask) = (Vec::with_capacity(b * r_w), Vec::with_capacity(b * r_w));
        let mut gather = Vec::with_capacity(b * r_w);
        for ((prompt, response), &start) in pairs.iter().zip(&starts) {
            let first = start + prompt.len() - 1;
            gather
                .extend((0..r_w).map(|k| (first + if k < response.len() { k } else { 0 }) as u32));
            targets.extend(
                response
                    .iter()
                    .copied()
                    .chain(std::iter::repeat_n(0, r_w - response.len())),
            );
            mask.extend((0..r_w).map(|k| if k < response.len() { 1f32 } else { 0.0 }));
        }
        let rows = packing.rows.len();
        let one_a_row = packing
            .rows
            .iter()
            .enumerate()
            .all(|(n, row)| row[..] == [n]);
        let prompt = pairs[0].0.len();
        let response_window =
            (one_a_row && pairs.iter().all(|(p, _)| p.len() == prompt)).then_some(prompt - 1);
        Ok(TrainBatch {
            input_ids: Tensor::from_vec(ids, (rows, width), device)?,
            positions: Tensor::from_vec(pos, (rows, width), device)?,
            attn_mask: segment_mask(&segments, width, kv_groups, device)?,
            response_positions: Tensor::from_vec(gather, b * r_w, device)?,
            response_window,
            targets: Tensor::from_vec(targets, (b, r_w), device)?,
            response_mask: Tensor::from_vec(mask, (b, r_w), device)?,
            response_width: r_w,
            response_lens: pairs.iter().map(|(_, r)| r.len()).collect(),
        })
    }

    pub fn rows(&self) -> usize {
        self.response_lens.len()
    }
}

/// Run the model over a batch and return the hidden states of the positions that predict response
/// tokens. -> (b, R, hidden). With a `tape` (training), the forward is cut after every layer and
/// the loss must be differentiated by [`Tape::backward`], which frees each layer's activations as
/// it goes.
pub fn response_hidden(
    model: &Transformer,
    batch: &TrainBatch,
    numerics: Numerics,
    tape: Option<&mut Tape>,
) -> Result<Tensor> {
    let (ids, pos, mask) = (&batch.input_ids, &batch.positions, &batch.attn_mask);
    let hidden = match tape {
        Some(tape) => model.forward_hidden_taped(ids, pos, mask, numerics, tape)?,
        None => model.forward_hidden(ids, pos, mask, None, numerics)?,
    };
    if let Some(first) = batch.response_window {
        return hidden.narrow(1, first, batch.response_width);
    }
    let (rows, width, h) = hidden.dims3()?;
    hidden
        .reshape((rows * width, h))?
        .index_select(&batch.response_positions, 0)?
        .reshape((batch.rows(), batch.response_width, h))
}

/// Per-token log-probs (b, R) of the response tokens under `logits / temperature`, and optionally the
/// entropy (b, R) of that distribution. Both are 0-masked outside the response. `tape` as in
/// [`response_hidden`].
pub fn response_forward(
    model: &Transformer,
    batch: &TrainBatch,
    temperature: f64,
    numerics: Numerics,
    with_entropy: bool,
    tape: Option<&mut Tape>,
) -> Result<(Tensor, Option<Tensor>)> {
    let sink = tape.as_deref().map(Tape::head_sink);
    let hidden = response_hidden(model, batch, numerics, tape)?;
    head_logprobs(
        model,
        batch,
        &hidden,
        temperature,
        numerics,
        with_entropy,
        sink,
    )
}

/// [`response_forward`]'s head over the response positions' hidden states `hidden` (b, R,
/// hidden) that [`response_hidden`] gave: the log-probs (b, R) and optionally the entropy.
/// `sink`: the tape's head sink, when training.
pub fn head_logprobs(
    model: &Transformer,
    batch: &TrainBatch,
    hidden: &Tensor,
    temperature: f64,
    numerics: Numerics,
    with_entropy: bool,
    sink: Option<fused_head::WeightGradSink>,
) -> Result<(Tensor, Option<Tensor>)> {
    let scale = if temperature > 0.0 && temperature != 1.0 {
        1.0 / temperature
    } else {
        1.0
    };
    // Training on the CPU in f32 (a bf16 model's head read as stored): the head and the
    // log-probs in one op, whose backward walks the vocabulary in chunks instead of holding the
    // (rows, vocab) logits' gradient (the peak of a step at a large vocabulary). The log-probs
    // are the same bits as below.
    if numerics == Numerics::Differentiable {
        let (head_hidden, head) = model.head_operands(hidden, numerics)?;
        if fused_head::applies(&head_hidden, &head) {
            let (logp, entropy) = fused_head::head_logprobs(
                &head_hidden,
                &head,
                &batch.targets,
                scale,
                with_entropy,
                sink.as_ref(),
            )?;
            let entropy = match with_entropy {
                true => Some((entropy * &batch.response_mask)?),
                false => None,
            };
            return Ok(((logp * &batch.response_mask)?, entropy));
        }
    }
    let mut logits = model.logits(hidden, numerics)?;
    if scale != 1.0 {
        logits = logits.affine(scale, 0.0)?;
    }
    if with_entropy {
        let (logp, entropy) =
            crate::algo::sft::token_logprobs_and_entropy(&logits, &batch.targets)?;
        return Ok((
            (logp * &batch.response_mask)?,
            Some((entropy * &batch.response_mask)?),
        ));
    }
    let logp = crate::algo::sft::token_logprobs(&logits, &batch.targets)?;
    Ok(((logp * &batch.response_mask)?, None))
}

/// Log-probs of `response` after `prompt` for a single pair, as plain numbers (for `model score`).
pub fn score_pair(
    model: &Transformer,
    prompt: &[u32],
    response: &[u32],
    pad_id: u32,
) -> Result<Vec<f32>> {
    let batch = TrainBatch::new(
        &[(prompt, response)],
        pad_id,
        model.config().kv_groups(),
        model.device(),
    )?;
    let (logp, _) = response_forward(model, &batch, 1.0, Numerics::Fast, false, None)?;
    logp.squeeze(0)?.to_dtype(DType::F32)?.to_vec1()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::hf_dir::tiny_test_model;

    /// Sequences (prompt + response - 1) of 6, 4, 2 and 6 tokens: packed in rows of 6, pairs 0
    /// and 3 get a row each and pairs 1 and 2 share one (4 + 2). Each pair's log-probs, and its
    /// part of the gradient, must be the ones it gets alone in a batch: a pair that saw the other
    /// one's tokens would be off by far more than the rounding of sums taken in another order
    /// (checked: with one causal mask over each whole row, the test fails).
    #[test]
    fn a_packed_pair_scores_and_trains_as_it_does_alone() {
        let model = tiny_test_model("abcdefgh", 64, 7);
        let m = &model.transformer;
        let pairs: [(&[u32], &[u32]); 4] = [
            (&[3, 4, 5], &[6, 7, 8, 9]),
            (&[5, 6], &[3, 4, 10]),
            (&[7], &[8, 3]),
            (&[9, 10, 3, 4, 5], &[6, 7]),
        ];
        let groups = m.config().kv_groups();
        let batch_of = |pairs: &[(&[u32], &[u32])]| {
            TrainBatch::new(pairs, model.pad_id, groups, m.device()).expect("batch")
        };
        // log-probs (b, R) and every parameter's gradient of their sum, as training takes them.
        let run = |batch: &TrainBatch| {
            let mut tape = Tape::default();
            let (logp, _) = response_forward(
                m,
                batch,
                1.0,
                Numerics::Differentiable,
                false,
                Some(&mut tape),
            )
            .expect("forward");
            let grads = tape
                .backward(logp.sum_all().expect("sum"))
                .expect("backward");
            let grads: Vec<Vec<f32>> = m
                .params()
                .named_vars()
                .iter()
                .map(|(_, v)| {
                    let g = grads.get(v.as_tensor()).expect("a gradient");
                    g.flatten_all().and_then(|g| g.to_vec1()).expect("values")
                })
                .collect();
            (logp.to_vec2::<f32>().expect("log-probs"), grads)
        };
        let packed = batch_of(&pairs);
        assert_eq!(packed.input_ids.dims(), [3, 6], "three rows of six");
        let (logp, grads) = run(&packed);
        let mut summed: Vec<Vec<f32>> = grads.iter().map(|g| vec![0.0; g.len()]).collect();
        for (i, pair) in pairs.iter().enumerate() {
            let (alone, alone_grads) = run(&batch_of(&[*pair]));
            let n = pair.1.len();
            for (k, (a, b)) in logp[i][..n].iter().zip(&alone[0]).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5,
                    "pair {i} token {k}: {a} packed, {b} alone"
                );
            }
            assert!(logp[i][n..].iter().all(|&v| v == 0.0), "pair {i}'s padding");
            for (s, g) in summed.iter_mut().zip(&alone_grads) {
                s.iter_mut().zip(g).for_each(|(s, g)| *s += g);
            }
        }
        for (p, (g, s)) in grads.iter().zip(&summed).enumerate() {
            let scale = s.iter().fold(0f32, |m, v| m.max(v.abs()));
            let worst = g.iter().zip(s).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                scale > 0.0 && worst <= 1e-4 * scale,
                "parameter {p}: {worst} of {scale}"
            );
        }
    }
}
