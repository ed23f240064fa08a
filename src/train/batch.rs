//! The padded layout of prompt+response batches for training and scoring.
//!
//! Prompts are left-padded to the longest prompt P and responses right-padded to the longest response
//! R, so response token k of every row sits in column P + k. The model reads columns 0..P+R-1 and the
//! logits at column P-1+k predict response token k: one narrow gives (batch, R, vocab) for all rows.

use candle_core::{DType, Device, Result, Tensor};

use crate::model::{Numerics, Tape, Transformer, attention_mask};
use roll_cpu_kernels::head as fused_head;

pub struct TrainBatch {
    /// (b, P+R-1) u32
    pub input_ids: Tensor,
    /// (b, P+R-1) u32
    pub positions: Tensor,
    /// (b, 1, g*(P+R-1), P+R-1) additive f32
    pub attn_mask: Tensor,
    /// (b, R) u32: response tokens (0 at padding)
    pub targets: Tensor,
    /// (b, R) f32: 1 for real response tokens
    pub response_mask: Tensor,
    pub prompt_width: usize,
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
        let p_w = pairs.iter().map(|(p, _)| p.len()).max().unwrap_or(0);
        let r_w = pairs.iter().map(|(_, r)| r.len()).max().unwrap_or(0);
        let width = p_w + r_w - 1;
        let b = pairs.len();
        let (mut ids, mut pos, mut valid_from) = (
            Vec::with_capacity(b * width),
            Vec::with_capacity(b * width),
            vec![],
        );
        let (mut targets, mut mask) = (Vec::with_capacity(b * r_w), Vec::with_capacity(b * r_w));
        for (prompt, response) in pairs {
            let pad = p_w - prompt.len();
            valid_from.push(pad);
            let real = prompt.len() + response.len() - 1;
            ids.extend(std::iter::repeat_n(pad_id, pad));
            ids.extend(prompt.iter().chain(response.iter()).take(real).copied());
            ids.extend(std::iter::repeat_n(pad_id, width - pad - real));
            pos.extend(std::iter::repeat_n(0u32, pad));
            pos.extend(0..real as u32);
            pos.extend(std::iter::repeat_n(0u32, width - pad - real));
            targets.extend(
                response
                    .iter()
                    .copied()
                    .chain(std::iter::repeat_n(0, r_w - response.len())),
            );
            mask.extend((0..r_w).map(|k| if k < response.len() { 1f32 } else { 0.0 }));
        }
        Ok(TrainBatch {
            input_ids: Tensor::from_vec(ids, (b, width), device)?,
            positions: Tensor::from_vec(pos, (b, width), device)?,
            attn_mask: attention_mask(&valid_from, 0, width, kv_groups, device)?,
            targets: Tensor::from_vec(targets, (b, r_w), device)?,
            response_mask: Tensor::from_vec(mask, (b, r_w), device)?,
            prompt_width: p_w,
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
    hidden.narrow(1, batch.prompt_width - 1, batch.response_width)
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
    let scale = if temperature > 0.0 && temperature != 1.0 {
        1.0 / temperature
    } else {
        1.0
    };
    // Training on the CPU in f32: the head and the log-probs in one op, whose backward walks the
    // vocabulary in chunks instead of holding the (rows, vocab) logits' gradient (the peak of a
    // step at a large vocabulary). The log-probs are the same bits as below.
    if numerics == Numerics::Differentiable && fused_head::applies(&hidden, model.lm_head()) {
        let (logp, entropy) = fused_head::head_logprobs(
            &hidden,
            model.lm_head(),
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
    let mut logits = model.logits(&hidden, numerics)?;
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
