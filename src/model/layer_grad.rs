//! One transformer layer on the fused CPU kernels, differentiated by hand: the training forward
//! keeps the activations its backward needs, and [`LayerRecord::backward`] runs the kernels'
//! backward functions and the matrix products of the chain rule directly.
//!
//! candle's `backward` over the same layer walks about thirty graph nodes (reshapes, the weights'
//! transposes, the products, the kernels, the residual sums) and gives each input's gradient a
//! zero-filled tensor plus a sum, even where there is one contribution: at the tiny shape that
//! bookkeeping (memset, elementwise sums, page faults of the fresh buffers) was a quarter of a
//! forward+backward (benches/RESULTS.md). Here each gradient is made once, in the weight's own
//! layout (no transposed sum), the products' outputs are not zero-filled first
//! (`roll_cpu_kernels::product`), and the few true sums are taken where a pass already writes:
//! the residual stream's by RMSNorm's backward as it writes the norm's part, the projections
//! reading one normed input by gemm as it multiplies.
//!
//! The record keeps what is costly to make again (the projections' outputs, attention's, the
//! residual stream) and recomputes in the backward what one cheap pass makes from it: the two
//! normed inputs and SwiGLU's output, a third of a layer's activations by bytes (SwiGLU's is as
//! wide as the MLP). At the Qwen2.5-0.5B shape that is 0.5 GB off a forward+backward's peak at no
//! measurable time (benches/RESULTS.md's git history); the recomputed tensors are the
//! forward's bits (the same kernels on the same inputs), so the gradients are unchanged. SwiGLU's
//! output is made in the pass that takes SwiGLU's gradients, which computes the same sigmoid.
//!
//! The values are the fused forward's bit for bit (the same kernels and products in the same
//! order); the gradients are candle's to the last bits (sums taken in another order; tested
//! against candle's backward of the same forward in tests/model_numerics.rs).

use candle_core::{Result, Tensor};
use roll_cpu_kernels as fused;

use super::config::ModelConfig;
use super::transformer::{LayerWeights, Product, affine, residual};

mod adapter;
pub(super) use adapter::{Adapted, Dropout, Factor, LayerFactors};
use adapter::{add_input_grad, input_grad};

/// A layer's forward as its backward needs it. Holds the layer's activations (freed with it), less
/// those its backward recomputes (the normed inputs, SwiGLU's output), and its weights as the
/// model holds them: their gradients are keyed by them.
pub(super) struct LayerRecord {
    w: LayerWeights,
    /// Under LoRA, the adapter's factors (`w` is then the frozen base).
    factors: LayerFactors,
    eps: f64,
    scale: f64,
    mask: Tensor,
    cos: Tensor,
    sin: Tensor,
    /// The layer's input (b, t, hidden), detached; its norm is what q, k and v read.
    x: Tensor,
    /// q and k before their norms (b, t, heads, hd), with q/k norms (Qwen3).
    qk_lin: Option<(Tensor, Tensor)>,
    /// After the rotary embedding: q (b, t, heads, hd), k and v (b, t, kv_heads, hd).
    q: Tensor,
    k: Tensor,
    v: Tensor,
    /// Attention's output (b, t, heads * hd).
    attn: Tensor,
    /// The residual stream after attention (b, t, hidden); its norm is what gate and up read.
    x2: Tensor,
    /// The MLP's gate and up projections (b, t, intermediate), whose SwiGLU down reads.
    gate: Tensor,
    up: Tensor,
}

/// Whether this layer can be differentiated here: its weights are the model's variables (or
/// frozen), not tensors computed from others, whose gradients candle would carry further.
pub(super) fn applies(w: &LayerWeights) -> bool {
    w.all().iter().all(|t| t.is_variable() || !t.track_op())
}

/// The layer's output (b, t, hidden), detached, and its record. The same operations as
/// `Transformer::fused_layer` at `Numerics::Differentiable` without a cache (its products
/// through the same gemm call), so the same bits. Under LoRA `w` holds the merged weights
/// `W + s B A` and `adapted` the base and the factors that the backward differentiates
/// (`adapter`); under LoRA dropout `w` is the base, and each adapted projection adds its
/// adapter's product of the masked input apart.
pub(super) fn forward(
    x: &Tensor,
    w: &LayerWeights,
    adapted: Option<Adapted>,
    cfg: &ModelConfig,
    cos: &Tensor,
    sin: &Tensor,
    mask: &Tensor,
) -> Result<(Tensor, LayerRecord)> {
    let eps = cfg.rms_norm_eps;
    let (b, t, _) = x.dims3()?;
    let (nh, nkv, hd) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    );
    // The weights' values out of candle's graph, in x's dtype (a bf16 model's widened: see
    // `Transformer::compute_dtype`); the record keeps `w` itself (its gradients are keyed by it).
    let wd = w.detached_in(x.dtype())?;
    let x = x.detach();
    let f = adapted.as_ref().map(|a| &a.factors);
    // Under dropout, `x Wᵀ (+ b)` then the adapter's term; else the merged weight's product.
    let adapt = |y: Tensor, factor: Option<&Factor>, input: &Tensor| -> Result<Tensor> {
        if let Some(factor) = factor.filter(|f| f.dropout.is_some()) {
            factor.add_output(&y, input)?;
        }
        Ok(y)
    };
    let h1 = fused::rms_norm::rms_norm(&x, &wd.input_norm, eps)?;
    let bias = |i: usize| wd.qkv_b.as_ref().map(|(q, k, v)| [q, k, v][i]);
    let q_lin = adapt(
        project(&h1, &wd.q_w, bias(0))?,
        f.and_then(|f| f.q.as_ref()),
        &h1,
    )?
    .reshape((b, t, nh, hd))?;
    let k_lin = adapt(
        project(&h1, &wd.k_w, bias(1))?,
        f.and_then(|f| f.k.as_ref()),
        &h1,
    )?
    .reshape((b, t, nkv, hd))?;
    let v = adapt(
        project(&h1, &wd.v_w, bias(2))?,
        f.and_then(|f| f.v.as_ref()),
        &h1,
    )?
    .reshape((b, t, nkv, hd))?;
    // The backward makes the normed inputs and SwiGLU's output again: freed as soon as read.
    drop(h1);
    let (q_in, k_in, qk_lin) = match &wd.qk_norm {
        Some((qn, kn)) => (
            fused::rms_norm::rms_norm(&q_lin, qn, eps)?,
            fused::rms_norm::rms_norm(&k_lin, kn, eps)?,
            Some((q_lin, k_lin)),
        ),
        None => (q_lin, k_lin, None),
    };
    let q = fused::rope::rope(&q_in, cos, sin)?;
    let k = fused::rope::rope(&k_in, cos, sin)?;
    let scale = 1.0 / (hd as f64).sqrt();
    let attn = fused::attention::attention(&q, &k, &v, mask, scale)?;
    let o = adapt(
        project(&attn, &wd.o_w, None)?,
        f.and_then(|f| f.o.as_ref()),
        &attn,
    )?;
    let x2 = residual(&x, o)?;
    let h2 = fused::rms_norm::rms_norm(&x2, &wd.post_norm, eps)?;
    let gate = adapt(
        project(&h2, &wd.gate_w, None)?,
        f.and_then(|f| f.gate.as_ref()),
        &h2,
    )?;
    let up = adapt(
        project(&h2, &wd.up_w, None)?,
        f.and_then(|f| f.up.as_ref()),
        &h2,
    )?;
    drop(h2);
    let mlp = fused::swiglu::swiglu(&gate, &up)?;
    let down = adapt(
        project(&mlp, &wd.down_w, None)?,
        f.and_then(|f| f.down.as_ref()),
        &mlp,
    )?;
    let out = residual(&x2, down)?;
    drop(mlp);
    let (w, factors) = match adapted {
        Some(Adapted { base, factors }) => (base, factors),
        None => (w.clone(), LayerFactors::default()),
    };
    let record = LayerRecord {
        w,
        factors,
        eps,
        scale,
        mask: mask.clone(),
        cos: cos.clone(),
        sin: sin.clone(),
        x,
        qk_lin,
        q,
        k,
        v,
        attn,
        x2,
        gate,
        up,
    };
    Ok((out, record))
}

/// x (b, t, in) times w (out, in) transposed, plus b (out): (b, t, out). The transformer's
/// `linear` but for the output's zero fill: the same bits.
fn project(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    affine(x, w, b, Product::Direct)
}

/// `t` (b, t, ...) as a matrix of one row per token: (b * t, the rest). Heads are flattened into
/// their row, as the projections lay them out.
fn rows(t: &Tensor) -> Result<Tensor> {
    let tokens = t.dims().iter().take(2).product::<usize>().max(1);
    t.contiguous()?.reshape((tokens, t.elem_count() / tokens))
}

/// A norm weight's gradient in storage of its own: the backward kernel packs it behind the
/// input's gradient, which would otherwise stay alive with it until the optimizer step.
fn own(g: &Tensor) -> Result<Tensor> {
    g.copy()
}

/// For y = x wᵀ over rows, given dy (rows, out): w's gradient dyᵀ x in its own (out, in) layout,
/// with w; none for a frozen weight.
fn product_grad(weight: &Tensor, dy: &Tensor, x: &Tensor) -> Result<Option<(Tensor, Tensor)>> {
    if !weight.track_op() {
        return Ok(None);
    }
    Ok(Some((
        weight.clone(),
        fused::product::matmul(&dy.t()?, &rows(x)?)?,
    )))
}

/// The gradients of a layer's weights, each with the weight it belongs to.
pub(super) type WeightGrads = Vec<(Tensor, Tensor)>;

/// For y = x wᵀ over rows, given dy (rows, out): the gradients of what trains of the product,
/// with what they belong to: the adapter's A and B where `factor` adapts it, else w's own.
fn weight_grads(
    weight: &Tensor,
    factor: Option<&Factor>,
    dy: &Tensor,
    x: &Tensor,
) -> Result<WeightGrads> {
    match factor {
        Some(f) => Ok(f.grads(dy, x)?.into()),
        None => Ok(product_grad(weight, dy, x)?.into_iter().collect()),
    }
}

impl LayerRecord {
    /// Given dy, the gradient of the layer's output (b, t, hidden): the gradient of its input
    /// (b, t, hidden) and those of its weights that are trained (see [`applies`]).
    pub(super) fn backward(self, dy: &Tensor) -> Result<(Tensor, WeightGrads)> {
        let w = &self.w;
        // The weights' values in the forward's dtype (widened again for a bf16 model: see
        // `Transformer::compute_dtype`); `w` keys their gradients.
        let wd = w.detached_in(self.x.dtype())?;
        let f = &self.factors;
        // Whether any of these products trains (its weight or its adapter): else their input
        // is not made again.
        let trained =
            |ws: &[(&Tensor, &Option<Factor>)]| ws.iter().any(|(t, f)| t.track_op() || f.is_some());
        let mut grads: WeightGrads = Vec::new();
        let shape = self.x.dims().to_vec();
        let dy = rows(dy)?;

        // out = x2 + down(swiglu(gate(h2), up(h2))). Down's weight gradient reads SwiGLU's
        // output, made again (the forward's bits) in the pass that takes SwiGLU's gradients.
        let d_mlp = input_grad(&dy, &wd.down_w, f.down.as_ref())?.reshape(self.gate.dims())?;
        let (d_gate, d_up) = if trained(&[(&w.down_w, &f.down)]) {
            let (mlp, d_gate, d_up) =
                fused::swiglu::swiglu_backward_and_output(&self.gate, &self.up, &d_mlp)?;
            drop(d_mlp);
            grads.extend(weight_grads(&w.down_w, f.down.as_ref(), &dy, &mlp)?);
            (d_gate, d_up)
        } else {
            let d_gate_up = fused::swiglu::swiglu_backward(&self.gate, &self.up, &d_mlp)?;
            drop(d_mlp);
            d_gate_up
        };
        let (d_gate, d_up) = (rows(&d_gate)?, rows(&d_up)?);
        if trained(&[(&w.gate_w, &f.gate), (&w.up_w, &f.up)]) {
            let h2 = fused::rms_norm::rms_norm(&self.x2, &wd.post_norm, self.eps)?;
            grads.extend(weight_grads(&w.gate_w, f.gate.as_ref(), &d_gate, &h2)?);
            grads.extend(weight_grads(&w.up_w, f.up.as_ref(), &d_up, &h2)?);
        }
        let d_h2 = input_grad(&d_gate, &wd.gate_w, f.gate.as_ref())?;
        add_input_grad(&d_h2, &d_up, &wd.up_w, f.up.as_ref())?;
        drop((d_gate, d_up));
        // The residual: the output's gradient reaches x2 directly too, added as the norm's
        // backward writes its part.
        let (d_x2, d_post) = fused::rms_norm::rms_norm_backward_plus(
            &self.x2,
            &wd.post_norm,
            &d_h2.reshape(shape.as_slice())?,
            self.eps,
            &dy.reshape(shape.as_slice())?,
        )?;
        if w.post_norm.track_op() {
            grads.push((w.post_norm.clone(), own(&d_post)?));
        }
        let d_x2 = rows(&d_x2)?;

        // x2 = x + o(attention(rope(q), rope(k), v))
        grads.extend(weight_grads(&w.o_w, f.o.as_ref(), &d_x2, &self.attn)?);
        let d_attn = input_grad(&d_x2, &wd.o_w, f.o.as_ref())?.reshape(self.attn.dims())?;
        let (dq, dk, dv) = fused::attention::attention_backward(
            &self.q, &self.k, &self.v, &self.mask, self.scale, &self.attn, &d_attn,
        )?;
        drop(d_attn);
        let mut dq = fused::rope::rope_backward(&dq, &self.cos, &self.sin)?;
        let mut dk = fused::rope::rope_backward(&dk, &self.cos, &self.sin)?;
        if let (Some((qn, kn)), Some((qn_d, kn_d)), Some((q_lin, k_lin))) =
            (&w.qk_norm, &wd.qk_norm, &self.qk_lin)
        {
            let (dq_lin, d_qn) = fused::rms_norm::rms_norm_backward(q_lin, qn_d, &dq, self.eps)?;
            let (dk_lin, d_kn) = fused::rms_norm::rms_norm_backward(k_lin, kn_d, &dk, self.eps)?;
            for (norm, g) in [(qn, d_qn), (kn, d_kn)] {
                if norm.track_op() {
                    grads.push((norm.clone(), own(&g)?));
                }
            }
            (dq, dk) = (dq_lin, dk_lin);
        }
        let (dq, dk, dv) = (rows(&dq)?, rows(&dk)?, rows(&dv)?);
        if let Some((qb, kb, vb)) = &w.qkv_b {
            for (bias, g) in [(qb, &dq), (kb, &dk), (vb, &dv)] {
                if bias.track_op() {
                    grads.push((bias.clone(), fused::accumulate::column_sums(g)?));
                }
            }
        }
        if trained(&[(&w.q_w, &f.q), (&w.k_w, &f.k), (&w.v_w, &f.v)]) {
            let h1 = fused::rms_norm::rms_norm(&self.x, &wd.input_norm, self.eps)?;
            grads.extend(weight_grads(&w.q_w, f.q.as_ref(), &dq, &h1)?);
            grads.extend(weight_grads(&w.k_w, f.k.as_ref(), &dk, &h1)?);
            grads.extend(weight_grads(&w.v_w, f.v.as_ref(), &dv, &h1)?);
        }
        let d_h1 = input_grad(&dq, &wd.q_w, f.q.as_ref())?;
        add_input_grad(&d_h1, &dk, &wd.k_w, f.k.as_ref())?;
        add_input_grad(&d_h1, &dv, &wd.v_w, f.v.as_ref())?;
        // And x2's gradient reaches x directly too.
        let (dx, d_in) = fused::rms_norm::rms_norm_backward_plus(
            &self.x,
            &wd.input_norm,
            &d_h1.reshape(shape.as_slice())?,
            self.eps,
            &d_x2.reshape(shape.as_slice())?,
        )?;
        if w.input_norm.track_op() {
            grads.push((w.input_norm.clone(), own(&d_in)?));
        }
        // Each gradient in its weight's dtype (a no-op in f32; a bf16 weight's rounded once).
        let grads = grads
            .into_iter()
            .map(|(w, g)| {
                let g = g.to_dtype(w.dtype())?;
                Ok((w, g))
            })
            .collect::<Result<_>>()?;
        Ok((dx, grads))
    }
}
