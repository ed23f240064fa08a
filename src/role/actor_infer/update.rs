//! What weight sync hands actor_infer after a training step: every weight, or under LoRA only the
//! adapter. A replica of a LoRA policy keeps the frozen base (its weights are the base with the
//! adapter merged in) and re-merges each adapter it is sent, so a sync moves the adapter's few
//! megabytes instead of the model, to a worker process as to an in-process replica.

use candle_core::Tensor;

use crate::model::lora::Adapter;
use crate::model::params::tensor_bytes;
use crate::model::{LoadedModel, ParamStore};

/// New policy weights for actor_infer.
#[derive(Clone)]
pub enum PolicyUpdate {
    /// Every weight (full fine-tuning).
    Weights(ParamStore),
    /// The adapter (LoRA): the replica merges it into its copy of the frozen base.
    Adapter(Adapter),
}

impl PolicyUpdate {
    /// The policy's weights as they are now, sharing their storage: for a sync that completes
    /// before the next training step changes them.
    pub fn of(policy: &LoadedModel) -> PolicyUpdate {
        match policy.transformer.lora() {
            Some(lora) => PolicyUpdate::Adapter(lora.to_adapter()),
            None => PolicyUpdate::Weights(policy.transformer.params().clone()),
        }
    }

    /// A copy of the policy's weights as they are now, which later training steps leave alone
    /// (α > 0: actor_infer takes them while the trainer goes on).
    pub fn snapshot(policy: &LoadedModel) -> candle_core::Result<PolicyUpdate> {
        Ok(match policy.transformer.lora() {
            Some(lora) => PolicyUpdate::Adapter(lora.snapshot()?.to_adapter()),
            None => PolicyUpdate::Weights(policy.transformer.params().deep_clone()?),
        })
    }

    /// Bytes of tensor data the update carries.
    pub fn bytes(&self) -> u64 {
        match self {
            PolicyUpdate::Weights(p) => p.bytes() as u64,
            PolicyUpdate::Adapter(a) => a.pairs.values().map(|(a, b)| pair_bytes(a, b)).sum(),
        }
    }

    /// Make `dest` (a replica's weights) the update's weights; under LoRA `base` is the frozen
    /// base the adapter is merged into (the same operations as the trainer's
    /// `Transformer::write_inference_weights`, so the replica's bits equal the policy's).
    pub fn write_into(
        &self,
        dest: &ParamStore,
        base: Option<&ParamStore>,
    ) -> candle_core::Result<()> {
        match (self, base) {
            (PolicyUpdate::Weights(p), None) => dest.copy_from(p),
            (PolicyUpdate::Adapter(a), Some(base)) => {
                dest.copy_from(base)?;
                a.merge_into(dest)
            }
            (PolicyUpdate::Weights(_), Some(_)) => {
                candle_core::bail!("a LoRA replica was sent whole weights instead of its adapter")
            }
            (PolicyUpdate::Adapter(_), None) => {
                candle_core::bail!("a replica without a base was sent an adapter")
            }
        }
    }
}

fn pair_bytes(a: &Tensor, b: &Tensor) -> u64 {
    tensor_bytes(a) + tensor_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::hf_dir::tiny_test_model;
    use crate::model::lora::{LoraSettings, LoraVars};

    fn values(p: &ParamStore) -> Vec<Vec<f32>> {
        p.named_tensors()
            .iter()
            .map(|(_, t)| t.flatten_all().and_then(|t| t.to_vec1()).expect("values"))
            .collect()
    }

    /// A LoRA policy whose adapter is no longer zero (B set to ones: `s B A` changes every
    /// adapted weight).
    fn lora_policy() -> LoadedModel {
        let model = tiny_test_model("0123456789", 32, 4);
        let settings = LoraSettings {
            rank: 2,
            ..LoraSettings::default()
        };
        let layers = model.config().num_hidden_layers;
        let lora =
            LoraVars::init(&settings, layers, model.transformer.params(), 3, "tiny").expect("init");
        for (name, v) in lora.named_vars() {
            if name.contains("lora_B") {
                v.set(&v.ones_like().expect("ones")).expect("set");
            }
        }
        model.with_lora(Some(lora))
    }

    #[test]
    fn an_adapter_merged_into_the_base_gives_the_policys_inference_weights_bit_for_bit() {
        let policy = lora_policy();
        let update = PolicyUpdate::of(&policy);
        assert!(matches!(update, PolicyUpdate::Adapter(_)));
        let expected = policy.transformer.weights_for_inference().expect("merged");
        let replica = policy.transformer.params().deep_clone().expect("copy");
        // A replica that has generated with an older adapter: the base is written back first.
        replica
            .iter()
            .for_each(|(_, v)| v.set(&v.zeros_like().expect("zeros")).expect("set"));
        let base = policy.transformer.params();
        update.write_into(&replica, Some(base)).expect("write");
        assert_eq!(values(&replica), values(&expected));
        assert_ne!(
            values(&replica),
            values(base),
            "the adapter changed the weights"
        );
        // 7 linear layers x 2 layers of the tiny model, r (in + out) f32s each.
        let cfg = policy.config();
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let kv = cfg.num_key_value_heads * cfg.head_dim;
        let h_q = cfg.num_attention_heads * cfg.head_dim;
        let per_layer = 2 * (h + h_q) + 2 * (h + kv) + 3 * (h + i);
        assert_eq!(
            update.bytes(),
            (4 * 2 * per_layer * cfg.num_hidden_layers) as u64
        );
        // Without a base to merge into, an adapter is refused rather than taken as weights.
        assert!(update.write_into(&replica, None).is_err());
    }

    #[test]
    fn a_snapshot_keeps_the_adapter_as_it_was_while_training_goes_on() {
        let policy = lora_policy();
        let shared = PolicyUpdate::of(&policy);
        let snapshot = PolicyUpdate::snapshot(&policy).expect("snapshot");
        let pairs = |u: &PolicyUpdate| match u {
            PolicyUpdate::Adapter(a) => a
                .pairs
                .values()
                .map(|(_, b)| b.flatten_all().and_then(|t| t.to_vec1::<f32>()).expect("b"))
                .collect::<Vec<_>>(),
            PolicyUpdate::Weights(_) => panic!("a LoRA policy sends its adapter"),
        };
        let before = pairs(&snapshot);
        // The next training step moves B.
        for (name, v) in policy.transformer.lora().expect("lora").named_vars() {
            if name.contains("lora_B") {
                v.set(&(v.as_tensor() * 2.0).expect("scale")).expect("set");
            }
        }
        assert_eq!(pairs(&snapshot), before);
        assert_ne!(pairs(&shared), before, "`of` shares the live adapter");
    }
}
