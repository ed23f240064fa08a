//! The decoder-only transformer forward pass (Qwen2 / Qwen3 / Llama). On the CPU in f32 (training,
//! scoring and decoding) it runs the fused kernels of the `roll-cpu-kernels` package
//! (`kernels/cpu`), each with its own backward; elsewhere it is built from ops that candle can
//! differentiate, plus a fast path using candle's inference kernels.
//!
//! Owns numerics only: it takes token ids, per-token positions and an attention mask and returns hidden
//! states or logits. Batch layout, sampling and training live elsewhere.

use candle_core::{D, DType, Device, Result, Tensor, Var};

use super::config::ModelConfig;
use super::kv_cache::KvCache;
use super::layer_grad;
use super::lora::LoraVars;
use super::params::ParamStore;
use super::tape::Tape;
use roll_cpu_kernels as fused;

/// Which kernels to use. candle's fused rms_norm / softmax / rope have no backward pass, so training
/// must use `Differentiable`; generation and scoring use `Fast` (same values to ~1e-6 in f32). On
/// the CPU in f32 both take our fused kernels, which have a backward pass; `Fast` also takes the
/// few-row products (skinny, streamed) for decode steps and small prefills, which have none, and
/// gemm without candle's op (`Product::Direct`) for larger products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Numerics {
    Fast,
    Differentiable,
    /// candle's differentiable ops everywhere, never the fused kernels: what they are tested against.
    Reference,
}

/// Value used for masked attention scores. Finite (not -inf) so that a fully masked row (a padding
/// query) gives a uniform softmax instead of NaN, which would poison gradients even when masked later.
pub const MASKED: f32 = -1e9;
// The fused attention kernel skips the keys masked below its threshold.
const _: () = assert!(MASKED < fused::attention::MASK_SKIP);

/// One layer's weights (cloning shares them).
#[derive(Clone)]
pub(super) struct LayerWeights {
    pub(super) input_norm: Tensor,
    pub(super) post_norm: Tensor,
    pub(super) q_w: Tensor,
    pub(super) k_w: Tensor,
    pub(super) v_w: Tensor,
    pub(super) o_w: Tensor,
    pub(super) qkv_b: Option<(Tensor, Tensor, Tensor)>,
    pub(super) qk_norm: Option<(Tensor, Tensor)>,
    pub(super) gate_w: Tensor,
    pub(super) up_w: Tensor,
    pub(super) down_w: Tensor,
}

impl LayerWeights {
    /// Every weight of the layer.
    pub(super) fn all(&self) -> Vec<&Tensor> {
        let mut all = vec![
            &self.input_norm,
            &self.post_norm,
            &self.q_w,
            &self.k_w,
            &self.v_w,
            &self.o_w,
            &self.gate_w,
            &self.up_w,
            &self.down_w,
        ];
        if let Some((q, k, v)) = &self.qkv_b {
            all.extend([q, k, v]);
        }
        if let Some((q, k)) = &self.qk_norm {
            all.extend([q, k]);
        }
        all
    }

    /// Each weight through `f`, as a layer's weights of the same shape.
    fn map(&self, f: impl Fn(&Tensor) -> Result<Tensor>) -> Result<LayerWeights> {
        Ok(LayerWeights {
            input_norm: f(&self.input_norm)?,
            post_norm: f(&self.post_norm)?,
            q_w: f(&self.q_w)?,
            k_w: f(&self.k_w)?,
            v_w: f(&self.v_w)?,
            o_w: f(&self.o_w)?,
            qkv_b: match &self.qkv_b {
                Some((q, k, v)) => Some((f(q)?, f(k)?, f(v)?)),
                None => None,
            },
            qk_norm: match &self.qk_norm {
                Some((q, k)) => Some((f(q)?, f(k)?)),
                None => None,
            },
            gate_w: f(&self.gate_w)?,
            up_w: f(&self.up_w)?,
            down_w: f(&self.down_w)?,
        })
    }

    /// The same weights out of candle's graph, in `dtype`: views of the same storage where they
    /// are stored in it, widened copies of a bf16 model's for the fused kernels (f32 only).
    pub(super) fn detached_in(&self, dtype: DType) -> Result<LayerWeights> {
        self.map(|t| t.detach().to_dtype(dtype))
    }

    /// The same weights out of candle's graph, the norms and biases in `dtype` and the
    /// projections as stored: `project` reads a bf16 projection in place where the streamed
    /// product takes the rows (a decode step), and widens it where not.
    fn detached_for_inference(&self, dtype: DType) -> Result<LayerWeights> {
        let mut w = self.map(|t| Ok(t.detach()))?;
        let widen = |t: &mut Tensor| -> Result<()> {
            *t = t.to_dtype(dtype)?;
            Ok(())
        };
        widen(&mut w.input_norm)?;
        widen(&mut w.post_norm)?;
        if let Some((q, k, v)) = &mut w.qkv_b {
            [q, k, v].into_iter().try_for_each(widen)?;
        }
        if let Some((q, k)) = &mut w.qk_norm {
            [q, k].into_iter().try_for_each(widen)?;
        }
        Ok(w)
    }

    /// The same weights in `dtype`, still in candle's graph (a conversion's gradient is the
    /// gradient converted back): the weights themselves where they are stored in it.
    fn converted(&self, dtype: DType) -> Result<LayerWeights> {
        self.map(|t| t.to_dtype(dtype))
    }
}

/// A model: config, parameters, and rotary tables. Cloning is cheap (tensors are shared).
pub struct Transformer {
    cfg: ModelConfig,
    params: ParamStore,
    embed: Tensor,
    lm_head: Tensor,
    final_norm: Tensor,
    layers: Vec<LayerWeights>,
    /// (max_positions, head_dim / 2), f32.
    cos: Tensor,
    sin: Tensor,
    dtype: DType,
    /// A LoRA adapter being trained (`model.lora`): the base is then frozen and the adapted
    /// layers compute with `W + s B A`.
    lora: Option<LoraVars>,
}

impl Transformer {
    /// Build from parameters that were checked against `cfg` (see [`ParamStore::check_against`]).
    pub fn new(cfg: ModelConfig, params: ParamStore) -> Result<Self> {
        let embed = params.tensor("model.embed_tokens.weight")?;
        let dtype = embed.dtype();
        let device = embed.device().clone();
        let lm_head = if cfg.tie_word_embeddings {
            embed.clone()
        } else {
            params.tensor("lm_head.weight")?
        };
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = |s: &str| params.tensor(&format!("model.layers.{l}.{s}"));
            layers.push(LayerWeights {
                input_norm: p("input_layernorm.weight")?,
                post_norm: p("post_attention_layernorm.weight")?,
                q_w: p("self_attn.q_proj.weight")?,
                k_w: p("self_attn.k_proj.weight")?,
                v_w: p("self_attn.v_proj.weight")?,
                o_w: p("self_attn.o_proj.weight")?,
                qkv_b: if cfg.arch.qkv_bias() {
                    Some((
                        p("self_attn.q_proj.bias")?,
                        p("self_attn.k_proj.bias")?,
                        p("self_attn.v_proj.bias")?,
                    ))
                } else {
                    None
                },
                qk_norm: if cfg.arch.qk_norm() {
                    Some((p("self_attn.q_norm.weight")?, p("self_attn.k_norm.weight")?))
                } else {
                    None
                },
                gate_w: p("mlp.gate_proj.weight")?,
                up_w: p("mlp.up_proj.weight")?,
                down_w: p("mlp.down_proj.weight")?,
            });
        }
        let (cos, sin) = rope_tables(&cfg, &device)?;
        Ok(Transformer {
            final_norm: params.tensor("model.norm.weight")?,
            cfg,
            params,
            embed,
            lm_head,
            layers,
            cos,
            sin,
            dtype,
            lora: None,
        })
    }

    /// The same model with `lora` attached (or none): the base's weights are shared, not copied.
    pub fn with_lora(mut self, lora: Option<LoraVars>) -> Self {
        self.lora = lora;
        self
    }

    pub fn lora(&self) -> Option<&LoraVars> {
        self.lora.as_ref()
    }

    /// What training updates: the adapter's matrices when a LoRA adapter is attached, else every
    /// parameter.
    pub fn trainable_vars(&self) -> Vec<(String, Var)> {
        match &self.lora {
            Some(l) => l.named_vars(),
            None => self.params.named_vars(),
        }
    }

    /// The weights generation computes with: the parameters, or under LoRA a copy of them with
    /// the adapter merged in (`W + s B A`: a replica decodes at the base's speed, with no
    /// adapter product per token).
    pub fn weights_for_inference(&self) -> Result<std::borrow::Cow<'_, ParamStore>> {
        if self.lora.is_none() {
            return Ok(std::borrow::Cow::Borrowed(&self.params));
        }
        let merged = self.params.deep_clone()?;
        self.merge_adapter_into(&merged)?;
        Ok(std::borrow::Cow::Owned(merged))
    }

    /// Write [`Self::weights_for_inference`] into `dest` (a replica's parameters of this shape)
    /// in place: the base copied, then the adapter merged, with no copy in between.
    pub fn write_inference_weights(&self, dest: &ParamStore) -> Result<()> {
        dest.copy_from(&self.params)?;
        self.merge_adapter_into(dest)
    }

    fn merge_adapter_into(&self, dest: &ParamStore) -> Result<()> {
        match &self.lora {
            Some(lora) => lora.to_adapter().merge_into(dest),
            None => Ok(()),
        }
    }

    /// Another view of this model whose adapter is a frozen copy of this one's as it is now,
    /// sharing the base's weights (frozen under LoRA): a stage's reference without a second
    /// copy of the base. `None` without an adapter.
    pub fn adapter_snapshot(&self) -> Result<Option<Transformer>> {
        let Some(lora) = &self.lora else {
            return Ok(None);
        };
        let view = Transformer::new(self.cfg.clone(), self.params.clone())?;
        Ok(Some(view.with_lora(Some(lora.snapshot()?))))
    }

    /// Whether a training forward drops the adapter's inputs (`model.lora.dropout` above 0).
    fn lora_dropout(&self) -> bool {
        self.lora.as_ref().is_some_and(|l| l.settings.dropout > 0.0)
    }

    /// A base weight as the forward takes it: detached under LoRA (frozen: no gradient is taken
    /// of it), itself otherwise.
    fn frozen(&self, t: &Tensor) -> Tensor {
        match self.lora {
            Some(_) => t.detach(),
            None => t.clone(),
        }
    }

    /// Layer `l`'s weights as the forward takes them: under LoRA every base weight detached and
    /// each adapted one `W + s B A`.
    fn layer_weights(&self, l: usize) -> Result<std::borrow::Cow<'_, LayerWeights>> {
        let w = &self.layers[l];
        let Some(lora) = &self.lora else {
            return Ok(std::borrow::Cow::Borrowed(w));
        };
        let mut out = w.map(|t| Ok(t.detach()))?;
        for (module, field) in [
            ("q_proj", &mut out.q_w),
            ("k_proj", &mut out.k_w),
            ("v_proj", &mut out.v_w),
            ("o_proj", &mut out.o_w),
            ("gate_proj", &mut out.gate_w),
            ("up_proj", &mut out.up_w),
            ("down_proj", &mut out.down_w),
        ] {
            if let Some(delta) = lora.delta(&super::lora::base_weight(l, module), field.dtype()) {
                *field = (&*field + delta?)?;
            }
        }
        Ok(std::borrow::Cow::Owned(out))
    }

    /// Under LoRA, layer `l` as its hand-differentiated backward takes it: the base out of
    /// candle's graph and the adapter's factors (`layer_grad::adapter`), with LoRA dropout drawn
    /// from `dropout_seed` (a taped forward's: [`Tape`]) when `model.lora.dropout` asks for it.
    fn adapted_layer(
        &self,
        l: usize,
        dropout_seed: Option<u64>,
    ) -> Result<Option<layer_grad::Adapted>> {
        let Some(lora) = &self.lora else {
            return Ok(None);
        };
        let scale = lora.settings.scale();
        let p = lora.settings.dropout;
        let factor = |module: &str| {
            let name = super::lora::base_weight(l, module);
            lora.factors(&name).map(|(a, b)| layer_grad::Factor {
                a: a.as_tensor().clone(),
                b: b.as_tensor().clone(),
                scale,
                dropout: dropout_seed
                    .filter(|_| p > 0.0)
                    .map(|seed| layer_grad::Dropout {
                        p,
                        seed: crate::seed::mix_seed(&[
                            seed,
                            l as u64,
                            crate::seed::fnv1a(module.as_bytes()),
                        ]),
                    }),
            })
        };
        Ok(Some(layer_grad::Adapted {
            base: self.layers[l].map(|t| Ok(t.detach()))?,
            factors: layer_grad::LayerFactors {
                q: factor("q_proj"),
                k: factor("k_proj"),
                v: factor("v_proj"),
                o: factor("o_proj"),
                gate: factor("gate_proj"),
                up: factor("up_proj"),
                down: factor("down_proj"),
            },
        }))
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn params(&self) -> &ParamStore {
        &self.params
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn device(&self) -> &Device {
        self.embed.device()
    }

    /// How many lanes this model's batches are split into: [`super::threads::lanes`] on the CPU;
    /// one on an accelerator, which wants its batches whole.
    pub fn lanes(&self) -> usize {
        if self.device().is_cpu() {
            super::threads::lanes(self.params.bytes()).max(1)
        } else {
            1
        }
    }

    /// Hidden states after the final norm.
    ///
    /// input_ids: (b, t) u32; positions: (b, t) u32 (rotary position of each token);
    /// mask: (b, 1, g*t, past+t) additive f32 from [`attention_mask`] with g = heads / kv_heads;
    /// cache: keys/values of the `past` earlier columns, extended in place. -> (b, t, hidden)
    pub fn forward_hidden(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        cache: Option<&mut KvCache>,
        numerics: Numerics,
    ) -> Result<Tensor> {
        self.hidden_states(input_ids, positions, mask, cache, numerics, None)
    }

    /// [`Self::forward_hidden`] for training, cut after every layer into `tape`: its backward
    /// ([`Tape::backward`]) frees each layer's activations once that layer's gradients exist.
    pub fn forward_hidden_taped(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        numerics: Numerics,
        tape: &mut Tape,
    ) -> Result<Tensor> {
        self.hidden_states(input_ids, positions, mask, None, numerics, Some(tape))
    }

    /// The dtype the layers compute in: the weights' own, except a bf16 model's on the CPU
    /// outside `Numerics::Reference`, which runs the fused kernels (f32 only) in f32 with each
    /// layer's weights widened as the layer runs. The model keeps bf16's memory, its sums are
    /// taken in f32 as a bf16 product's are anyway (candle's widens both factors), and it is not
    /// held to candle's per-op bf16 path, ~3x slower (benches/RESULTS.md). Its keys and values
    /// are cached in f32.
    fn compute_dtype(&self, numerics: Numerics) -> DType {
        if self.dtype == DType::BF16
            && self.device().is_cpu()
            && numerics != Numerics::Reference
            && fused::enabled()
        {
            DType::F32
        } else {
            self.dtype
        }
    }

    fn hidden_states(
        &self,
        input_ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        mut cache: Option<&mut KvCache>,
        numerics: Numerics,
        mut tape: Option<&mut Tape>,
    ) -> Result<Tensor> {
        let (b, t) = input_ids.dims2()?;
        // (b, t, hidden).
        let rows = match tape.as_deref_mut() {
            // The tape's leaf itself, not reshaped: the first layer's input is then a variable.
            // A frozen embedding (under LoRA) takes no gradient: no lookup on the tape.
            Some(tape) if self.lora.is_none() => tape.lookup(&self.embed, input_ids)?,
            _ => {
                // Inference keeps nothing of candle's graph (`Numerics::Fast` has no backward):
                // with the embedding's rows detached, the fused layers' sums are taken in place.
                let table = match numerics {
                    Numerics::Fast => self.embed.detach(),
                    _ => self.frozen(&self.embed),
                };
                table
                    .index_select(&input_ids.flatten_all()?, 0)?
                    .reshape((b, t, ()))?
            }
        };
        let compute = self.compute_dtype(numerics);
        let mut x = rows.to_dtype(compute)?;
        let flat_pos = positions.flatten_all()?;
        let half = self.cfg.head_dim / 2;
        let cos = self
            .cos
            .index_select(&flat_pos, 0)?
            .reshape((b, t, half))?
            .to_dtype(compute)?;
        let sin = self
            .sin
            .index_select(&flat_pos, 0)?
            .reshape((b, t, half))?
            .to_dtype(compute)?;
        let mask = mask.to_dtype(compute)?;
        // LoRA dropout: in a training forward only, through the fused layers' own adapter
        // products (no merged weight computes it).
        let dropout_seed = match tape.as_deref_mut() {
            Some(tape) if self.lora_dropout() => {
                if numerics != Numerics::Differentiable || !fused::applies(&x) {
                    candle_core::bail!(
                        "model.lora.dropout above 0 trains through the fused CPU layers, which \
                         this forward does not take ({numerics:?} numerics, {:?} on {:?}); set \
                         model.lora.dropout to 0",
                        x.dtype(),
                        x.device().location()
                    );
                }
                Some(tape.next_dropout_seed())
            }
            _ => None,
        };
        if numerics != Numerics::Reference && fused::applies(&x) {
            for l in 0..self.layers.len() {
                // Under dropout the layer takes the base and its adapter apart.
                let w = &*match dropout_seed {
                    Some(_) => std::borrow::Cow::Borrowed(&self.layers[l]),
                    None => self.layer_weights(l)?,
                };
                x = match tape.as_deref_mut() {
                    // Training: each layer differentiated by hand (`layer_grad`), a
                    // LoRA-adapted one through its adapter's factors.
                    Some(tape)
                        if numerics == Numerics::Differentiable
                            && (self.lora.is_some() || layer_grad::applies(w)) =>
                    {
                        let adapted = self.adapted_layer(l, dropout_seed)?;
                        let (out, record) =
                            layer_grad::forward(&x, w, adapted, &self.cfg, &cos, &sin, &mask)?;
                        tape.layer(x, out, record)?
                    }
                    Some(tape) => {
                        let out = self.fused_layer(x, w, &cos, &sin, &mask, None, numerics)?;
                        tape.cut(out)?
                    }
                    None => {
                        let layer_cache = cache.as_deref_mut().map(|c| (c, l));
                        self.fused_layer(x, w, &cos, &sin, &mask, layer_cache, numerics)?
                    }
                };
            }
            let final_norm = self.frozen(&self.final_norm).to_dtype(compute)?;
            // Back in the weights' dtype for the heads (a no-op in f32).
            return fused::rms_norm::rms_norm(&x, &final_norm, self.cfg.rms_norm_eps)?
                .to_dtype(self.dtype);
        }
        for l in 0..self.layers.len() {
            let w = &*self.layer_weights(l)?;
            let h = rms_norm(&x, &w.input_norm, self.cfg.rms_norm_eps, numerics)?;
            let layer_cache = cache.as_deref_mut().map(|c| (c, l));
            let attn = self.attention(&h, w, &cos, &sin, &mask, layer_cache, numerics)?;
            x = (x + attn)?;
            let h = rms_norm(&x, &w.post_norm, self.cfg.rms_norm_eps, numerics)?;
            let (gate, up) = match numerics {
                // gate and up in one matmul at inference, for the same reason as q/k/v.
                Numerics::Fast => {
                    let gate_up = linear(&h, &Tensor::cat(&[&w.gate_w, &w.up_w], 0)?, None)?;
                    let inter = self.cfg.intermediate_size;
                    (
                        gate_up.narrow(D::Minus1, 0, inter)?,
                        gate_up.narrow(D::Minus1, inter, inter)?,
                    )
                }
                Numerics::Differentiable | Numerics::Reference => {
                    (linear(&h, &w.gate_w, None)?, linear(&h, &w.up_w, None)?)
                }
            };
            x = (x + linear(&(gate.silu()? * up)?, &w.down_w, None)?)?;
            if let Some(tape) = tape.as_deref_mut() {
                x = tape.cut(x)?;
            }
        }
        rms_norm(
            &x,
            &self.frozen(&self.final_norm),
            self.cfg.rms_norm_eps,
            numerics,
        )
    }

    /// The output head's weight (vocab, hidden): the embedding when the two are tied.
    pub fn lm_head(&self) -> &Tensor {
        &self.lm_head
    }

    /// hidden: (b, t, hidden) -> logits (b, t, vocab), in f32 whatever the weight dtype.
    /// `Numerics::Fast` (inference) may take a few-row product of the CPU kernels.
    pub fn logits(&self, hidden: &Tensor, numerics: Numerics) -> Result<Tensor> {
        let (hidden, head) = self.head_operands(hidden, numerics)?;
        project(&hidden, &head, None, numerics)?.to_dtype(DType::F32)
    }

    /// The hidden states in the dtype the head computes in ([`Self::compute_dtype`]: a bf16
    /// model's widened on the CPU, so that its logits are not rounded to bf16 and the CPU kernels
    /// take the product), and the output head's weight as stored (detached at inference): the
    /// streamed product and the fused head read a bf16 one in place, `project` widens it for the
    /// others.
    pub fn head_operands(&self, hidden: &Tensor, numerics: Numerics) -> Result<(Tensor, Tensor)> {
        let head = match numerics {
            Numerics::Fast => self.lm_head.detach(),
            _ => self.frozen(&self.lm_head),
        };
        Ok((hidden.to_dtype(self.compute_dtype(numerics))?, head))
    }

    /// One layer through the fused CPU kernels, the cache (if any) holding (b, columns, kv_heads,
    /// hd). x: (b, t, hidden) -> (b, t, hidden)
    #[allow(clippy::too_many_arguments)]
    fn fused_layer(
        &self,
        x: Tensor,
        w: &LayerWeights,
        cos: &Tensor,
        sin: &Tensor,
        mask: &Tensor,
        cache: Option<(&mut KvCache, usize)>,
        numerics: Numerics,
    ) -> Result<Tensor> {
        let eps = self.cfg.rms_norm_eps;
        // In x's dtype (`compute_dtype`). Inference: the weights out of candle's graph too, so
        // that no output of the layer is in it (the residual sums and biases are then added in
        // place, `residual`, `affine`).
        let w = if numerics == Numerics::Fast {
            w.detached_for_inference(x.dtype())?
        } else {
            w.converted(x.dtype())?
        };
        let w = &w;
        let linear = |x: &Tensor, w: &Tensor, b: Option<&Tensor>| project(x, w, b, numerics);
        let (b, t, _) = x.dims3()?;
        let (nh, nkv, hd) = (
            self.cfg.num_attention_heads,
            self.cfg.num_key_value_heads,
            self.cfg.head_dim,
        );
        let h = fused::rms_norm::rms_norm(&x, &w.input_norm, eps)?;
        let bias = |i: usize| w.qkv_b.as_ref().map(|(q, k, v)| [q, k, v][i]);
        // Heads stay where the projections put them, (b, t, heads, hd): no transposes.
        let mut q = linear(&h, &w.q_w, bias(0))?.reshape((b, t, nh, hd))?;
        let mut k = linear(&h, &w.k_w, bias(1))?.reshape((b, t, nkv, hd))?;
        let v = linear(&h, &w.v_w, bias(2))?.reshape((b, t, nkv, hd))?;
        if let Some((qn, kn)) = &w.qk_norm {
            q = fused::rms_norm::rms_norm(&q, qn, eps)?;
            k = fused::rms_norm::rms_norm(&k, kn, eps)?;
        }
        let q = fused::rope::rope(&q, cos, sin)?;
        let k = fused::rope::rope(&k, cos, sin)?;
        let (k, v) = match cache {
            Some((c, layer)) => c.append_on(layer, k, v, 1)?,
            None => (k, v),
        };
        let scale = 1.0 / (hd as f64).sqrt();
        let attn = fused::attention::attention(&q, &k, &v, mask, scale)?;
        let x = residual(&x, linear(&attn, &w.o_w, None)?)?;
        let h = fused::rms_norm::rms_norm(&x, &w.post_norm, eps)?;
        let mlp =
            fused::swiglu::swiglu(&linear(&h, &w.gate_w, None)?, &linear(&h, &w.up_w, None)?)?;
        residual(&x, linear(&mlp, &w.down_w, None)?)
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        x: &Tensor,
        w: &LayerWeights,
        cos: &Tensor,
        sin: &Tensor,
        mask: &Tensor,
        cache: Option<(&mut KvCache, usize)>,
        numerics: Numerics,
    ) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let (nh, nkv, hd) = (
            self.cfg.num_attention_heads,
            self.cfg.num_key_value_heads,
            self.cfg.head_dim,
        );
        let split =
            |y: Tensor, heads: usize| y.reshape((b, t, heads, hd))?.transpose(1, 2)?.contiguous();
        let (mut q, mut k, v) = match numerics {
            // One matmul for q, k and v: fewer, larger GEMMs are faster for small models. Training
            // keeps them apart, because the backward pass of each narrow would allocate the full width.
            Numerics::Fast => {
                let qkv_w = Tensor::cat(&[&w.q_w, &w.k_w, &w.v_w], 0)?;
                let qkv_b = match &w.qkv_b {
                    Some((q, k, v)) => Some(Tensor::cat(&[q, k, v], 0)?),
                    None => None,
                };
                let qkv = linear(x, &qkv_w, qkv_b.as_ref())?;
                (
                    split(qkv.narrow(D::Minus1, 0, nh * hd)?, nh)?,
                    split(qkv.narrow(D::Minus1, nh * hd, nkv * hd)?, nkv)?,
                    split(qkv.narrow(D::Minus1, (nh + nkv) * hd, nkv * hd)?, nkv)?,
                )
            }
            Numerics::Differentiable | Numerics::Reference => {
                let b = |i: usize| w.qkv_b.as_ref().map(|(q, k, v)| [q, k, v][i]);
                (
                    split(linear(x, &w.q_w, b(0))?, nh)?,
                    split(linear(x, &w.k_w, b(1))?, nkv)?,
                    split(linear(x, &w.v_w, b(2))?, nkv)?,
                )
            }
        };
        if let Some((qn, kn)) = &w.qk_norm {
            q = rms_norm(&q, qn, self.cfg.rms_norm_eps, numerics)?;
            k = rms_norm(&k, kn, self.cfg.rms_norm_eps, numerics)?;
        }
        let q = rope(&q, cos, sin, numerics)?;
        let k = rope(&k, cos, sin, numerics)?;
        let (k, v) = match cache {
            Some((c, layer)) => c.append(layer, k, v)?,
            None => (k, v),
        };
        // GQA without copying keys: query heads h = kv * groups + r share kv head `kv`, so
        // (b, nh, t, hd) viewed as (b, nkv, groups * t, hd) lines each group up with its keys.
        let groups = nh / nkv;
        let q = q.reshape((b, nkv, groups * t, hd))?;
        let scale = 1.0 / (hd as f64).sqrt();
        // In tiles of query rows: a long sequence never holds its whole score matrix.
        let out = super::attention::attend(&q, &k, &v, mask, scale, numerics, t == 1)?
            .reshape((b, nh, t, hd))?
            .transpose(1, 2)?
            .reshape((b, t, nh * hd))?;
        linear(&out, &w.o_w, None)
    }
}

/// [`linear`], at inference (`Numerics::Fast`, f32 on the CPU) through one of the CPU kernels'
/// few-row products when x has few rows (a decode step, a small prefill): a general GEMM would
/// first copy the whole weight into its packed blocks, one strided element at a time. The skinny
/// product (dot products) for deep rows, else the streamed one (x packed, the weight broadcast
/// where it lies); bounds from `cargo bench --bench engine -- skinny`. Each kernel sums a row's
/// products in one order whatever rows share its call, but which kernel runs depends on the
/// call's row count, so a sequence's logits can differ in the last bits between batch sizes (as
/// they did between candle's GEMM and the skinny product before); greedy tokens and log-probs
/// agree to 1e-5 whatever the lanes (tests/model_numerics.rs).
///
/// A bf16 weight beside f32 rows (a bf16 model on the CPU, [`Transformer::compute_dtype`]) is
/// read in place by the streamed product where that takes the rows, and widened for the others.
fn project(x: &Tensor, w: &Tensor, b: Option<&Tensor>, numerics: Numerics) -> Result<Tensor> {
    if w.dtype() != x.dtype() && !(numerics == Numerics::Fast && fused::streamed::applies(x, w)) {
        return project(x, &w.to_dtype(x.dtype())?, b, numerics);
    }
    let product = match numerics {
        Numerics::Fast if fused::skinny::applies(x, w) => Product::Skinny,
        Numerics::Fast if fused::streamed::applies(x, w) => Product::Streamed,
        // Inference needs no graph: gemm's bits without candle's zero-filled output (a memset
        // or fresh pages the size of it: with the streamed product's buffers, most of the ~8%
        // of a tiny generation that went to zero fills and page clearing).
        Numerics::Fast if fused::applies(x) && fused::applies(w) => Product::Direct,
        _ => Product::Gemm,
    };
    affine(x, w, b, product)
}

/// x: (..., in) @ w: (out, in)^T + b: (out) -> (..., out)
fn linear(x: &Tensor, w: &Tensor, b: Option<&Tensor>) -> Result<Tensor> {
    affine(x, w, b, Product::Gemm)
}

/// Which matrix product [`affine`] takes.
#[derive(Clone, Copy)]
pub(super) enum Product {
    /// candle's matmul (differentiable).
    Gemm,
    /// `fused::product`: the same gemm call as candle's, so the same bits, without zero-filling
    /// the output first; no backward (the hand-differentiated layers of `layer_grad`, and
    /// inference's products of more rows than the few-row ones take).
    Direct,
    /// `fused::skinny` (inference only).
    Skinny,
    /// `fused::streamed` (inference only).
    Streamed,
}

/// x @ w^T + b over x's rows flattened.
pub(super) fn affine(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    product: Product,
) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let inner = dims[dims.len() - 1];
    let rows = x.elem_count() / inner.max(1);
    let x = x.reshape((rows, inner))?;
    let y = match product {
        Product::Skinny => fused::skinny::skinny_matmul(&x, w)?,
        Product::Streamed => fused::streamed::streamed_matmul(&x, w)?,
        Product::Gemm => x.matmul(&w.t()?)?,
        Product::Direct => fused::product::matmul(&x, &w.t()?)?,
    };
    let y = match b {
        // Where neither side is in candle's graph (the hand-differentiated layers' products),
        // the bias goes into the product's fresh output in place: the same bits as the
        // broadcast add, without its third tensor.
        Some(b) if !y.track_op() && !b.track_op() && fused::accumulate::applies(&y, b) => {
            fused::accumulate::add_row_in_place(&y, b)?;
            y
        }
        Some(b) => y.broadcast_add(b)?,
        None => y,
    };
    let mut out_dims = dims;
    let last = out_dims.len() - 1;
    out_dims[last] = w.dim(0)?;
    y.reshape(out_dims)
}

/// `x + y` for a residual connection, `y` a layer's output projection just made (its storage
/// this caller's alone). On the CPU in f32, where neither is in candle's graph, `x` is added into
/// `y` in place: no third tensor, and no pass of candle's elementwise op over two inputs and an
/// output. The same bits either way: each element is one addition, and addition commutes.
pub(super) fn residual(x: &Tensor, y: Tensor) -> Result<Tensor> {
    if !x.track_op() && !y.track_op() && x.shape() == y.shape() && fused::accumulate::applies(&y, x)
    {
        fused::accumulate::add_in_place(&y, x)?;
        Ok(y)
    } else {
        x + y
    }
}

/// RMSNorm over the last dim, computed in f32 like HF (`weight * normed.to(input_dtype)`).
fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64, numerics: Numerics) -> Result<Tensor> {
    match numerics {
        Numerics::Fast => candle_nn::ops::rms_norm(&x.contiguous()?, weight, eps as f32),
        Numerics::Differentiable | Numerics::Reference => {
            let dtype = x.dtype();
            let x32 = x.to_dtype(DType::F32)?;
            let inv = (x32.sqr()?.mean_keepdim(D::Minus1)? + eps)?
                .sqrt()?
                .recip()?;
            x32.broadcast_mul(&inv)?
                .to_dtype(dtype)?
                .broadcast_mul(weight)
        }
    }
}

/// Rotary embedding, HF "rotate_half" layout. x: (b, h, t, d); cos/sin: (b, t, d/2).
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, numerics: Numerics) -> Result<Tensor> {
    match numerics {
        Numerics::Fast => candle_nn::rotary_emb::rope(x, cos, sin),
        Numerics::Differentiable | Numerics::Reference => {
            let half = x.dim(D::Minus1)? / 2;
            let cos = Tensor::cat(&[cos, cos], D::Minus1)?.unsqueeze(1)?;
            let sin = Tensor::cat(&[sin, sin], D::Minus1)?.unsqueeze(1)?;
            let x1 = x.narrow(D::Minus1, 0, half)?;
            let x2 = x.narrow(D::Minus1, half, half)?;
            let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
            x.broadcast_mul(&cos)? + rotated.broadcast_mul(&sin)?
        }
    }
}

/// cos/sin tables (max_positions, head_dim/2) in f32, computed in f64 like HF's inv_freq.
fn rope_tables(cfg: &ModelConfig, device: &Device) -> Result<(Tensor, Tensor)> {
    let half = cfg.head_dim / 2;
    let n = cfg.max_position_embeddings.max(1);
    let mut cos = Vec::with_capacity(n * half);
    let mut sin = Vec::with_capacity(n * half);
    for p in 0..n {
        for k in 0..half {
            let inv_freq = 1.0 / cfg.rope_theta.powf((2 * k) as f64 / cfg.head_dim as f64);
            // HF computes the angle in f32; doing the same keeps long positions bit-close.
            let angle = (p as f32) * (inv_freq as f32);
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    Ok((
        Tensor::from_vec(cos, (n, half), device)?,
        Tensor::from_vec(sin, (n, half), device)?,
    ))
}

/// Additive attention mask (b, 1, groups*t, past+t): query i of row n (at column past+i) may attend
/// key column j iff `valid_from[n] <= j <= past + i`. Columns before `valid_from[n]` are left padding.
pub fn attention_mask(
    valid_from: &[usize],
    past: usize,
    t: usize,
    groups: usize,
    device: &Device,
) -> Result<Tensor> {
    let total = past + t;
    let b = valid_from.len();
    let mut data = vec![0f32; b * groups * t * total];
    for (n, &start) in valid_from.iter().enumerate() {
        for g in 0..groups {
            for i in 0..t {
                let row = ((n * groups + g) * t + i) * total;
                for j in 0..total {
                    if j < start || j > past + i {
                        data[row + j] = MASKED;
                    }
                }
            }
        }
    }
    Tensor::from_vec(data, (b, 1, groups * t, total), device)
}
