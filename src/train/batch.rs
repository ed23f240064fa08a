//! The padded layout of prompt+response batches for training and scoring.
//!
//! Prompts are left-padded to the longest prompt P and responses right-padded to the longest response
//! R, so response token k of every row sits in column P + k. The model reads columns 0..P+R-1 and the
//! logits at column P-1+k predict response token k: one narrow gives (batch, R, vocab) for all rows.

use candle_core::{DType, Device, Result, Tensor};

use crate::model::{Numerics, Transformer, attention_mask};

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
/// tokens. -> (b, R, hidden)
pub fn response_hidden(
    model: &Transformer,
    batch: &TrainBatch,
    numerics: Numerics,
) -> Result<Tensor> {
    let hidden = model.forward_hidden(
        &batch.input_ids,
        &batch.positions,
        &batch.attn_mask,
        None,
        numerics,
    )?;
    hidden.narrow(1, batch.prompt_width - 1, batch.response_width)
}

/// Per-token log-probs (b, R) of the response tokens under `logits / temperature`, and optionally the
/// entropy (b, R) of that distribution. Both are 0-masked outside the response.
pub fn response_forward(
    model: &Transformer,
    batch: &TrainBatch,
    temperature: f64,
    numerics: Numerics,
    with_entropy: bool,
) -> Result<(Tensor, Option<Tensor>)> {
    let hidden = response_hidden(model, batch, numerics)?;
    let mut logits = model.logits(&hidden, numerics)?;
    if temperature > 0.0 && temperature != 1.0 {
        logits = (logits / temperature)?;
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
    let (logp, _) = response_forward(model, &batch, 1.0, Numerics::Fast, false)?;
    logp.squeeze(0)?.to_dtype(DType::F32)?.to_vec1()
}
