//! What a trainable role is asked to optimise, whichever stage asks: how its epochs run over a
//! step's rows and which loss they take. A stage builds its recipe from its config section
//! ([`RlConfig::actor_recipe`], [`RlConfig::critic_recipe`], [`SftConfig::recipe`],
//! [`DpoConfig::recipe`]); the role,
//! in this process or in its worker, runs the forward and backward passes, the micro-batch
//! accumulation and the optimizer step in one loop for every stage (`super::epochs`).

use serde::{Deserialize, Serialize};

use crate::algo::aggregate::LossAgg;
use crate::algo::distill::KdParams;
use crate::algo::kl::{KlEstimator, KlMode};
use crate::algo::loss::PolicyLossParams;
use crate::algo::preference::PreferenceParams;
use crate::config::{DistillConfig, DpoConfig, RlConfig, SftConfig};
use crate::train::OptimizerConfig;

/// How a trainable role's epochs run, and the loss they minimise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainRecipe {
    pub optimizer: OptimizerConfig,
    /// Passes over each step's rows.
    pub epochs: usize,
    /// Optimizer steps per pass: the step's groups are cut into this many mini-batches.
    pub mini_batches: usize,
    /// Whether each pass takes the groups in a seeded random order. RL batches arrive grouped by
    /// domain, and consecutive optimizer steps on one domain would pull the policy back and
    /// forth; SFT batches come mixed from their sampler and are taken in their order.
    pub shuffle: bool,
    pub objective: Objective,
}

impl TrainRecipe {
    /// One optimizer step per batch, its rows in the stage's order (SFT, DPO: their samplers
    /// mix the batches already).
    pub fn step_per_batch(optimizer: &OptimizerConfig, objective: Objective) -> TrainRecipe {
        TrainRecipe {
            optimizer: optimizer.clone(),
            epochs: 1,
            mini_batches: 1,
            shuffle: false,
            objective,
        }
    }
}

/// The loss a role's epochs minimise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Objective {
    /// RL's policy-gradient loss over the step's advantages, with an entropy bonus and, when
    /// `kl_in_loss`, a KL penalty to the reference.
    Policy(PolicyObjective),
    /// The critic's value loss over the step's returns, clipped around the rollout's values.
    Value { clip: Option<f64>, agg: LossAgg },
    /// Supervised fine-tuning: the negative log-likelihood of the response tokens, averaged over
    /// every response token of the batch.
    Likelihood,
    /// Preference optimisation (DPO, cDPO, IPO) over pairs of rows, chosen then rejected, against
    /// the reference's log-probs of the same rows; the loss is the mean over the pairs.
    Preference(PreferenceParams),
    /// Knowledge distillation: `(1 − weight) CE + weight KD` over the response tokens, KD the
    /// divergence from the teacher's top-k at each of them (`algo::distill`).
    Distill { params: KdParams, weight: f64 },
}

/// RL's policy objective.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyObjective {
    pub loss: PolicyLossParams,
    pub entropy_coef: f64,
    /// The KL estimator of a KL penalty in the loss (`rl.kl.mode: in_loss`), if any.
    pub kl_in_loss: Option<KlEstimator>,
}

impl Objective {
    /// How a micro-batch's share of its mini-batch's loss is weighed: by its tokens under a
    /// token mean, by its rows otherwise.
    pub fn agg(&self) -> LossAgg {
        match self {
            Objective::Policy(p) => p.loss.agg,
            Objective::Value { agg, .. } => *agg,
            Objective::Likelihood | Objective::Distill { .. } => LossAgg::TokenMean,
            // Each pair counts once, whatever its length.
            Objective::Preference(_) => LossAgg::SeqMeanTokenMean,
        }
    }

    /// Whether a micro-batch must hold whole groups: a preference pair's loss needs both its rows
    /// in one pass.
    pub fn keeps_groups_whole(&self) -> bool {
        matches!(self, Objective::Preference(_))
    }
}

impl RlConfig {
    /// actor_train's recipe in an RL stage: PPO-style epochs over shuffled mini-batches.
    pub fn actor_recipe(&self) -> TrainRecipe {
        TrainRecipe {
            optimizer: self.optimizer.clone(),
            epochs: self.ppo_epochs,
            mini_batches: self.mini_batches,
            shuffle: true,
            objective: Objective::Policy(PolicyObjective {
                loss: self.policy_loss,
                entropy_coef: self.entropy_coef,
                kl_in_loss: (self.kl.mode == KlMode::InLoss).then_some(self.kl.estimator),
            }),
        }
    }

    /// The critic's recipe: the actor's mini-batch plan (the same seed cuts the same
    /// mini-batches) with the critic's optimizer and value loss. `None` without `rl.critic`.
    pub fn critic_recipe(&self) -> Option<TrainRecipe> {
        let critic = self.critic.as_ref()?;
        Some(TrainRecipe {
            optimizer: critic.optimizer.clone(),
            epochs: self.ppo_epochs,
            mini_batches: self.mini_batches,
            shuffle: true,
            objective: Objective::Value {
                clip: critic.value_clip,
                agg: self.policy_loss.agg,
            },
        })
    }

    /// AdamW steps an RL stage takes: one per mini-batch of every epoch of every step.
    pub fn updates(&self) -> usize {
        self.steps * self.ppo_epochs * self.mini_batches
    }
}

impl SftConfig {
    /// actor_train's recipe in an SFT stage: one optimizer step per batch, in the sampler's order.
    pub fn recipe(&self) -> TrainRecipe {
        TrainRecipe::step_per_batch(&self.optimizer, Objective::Likelihood)
    }

    /// Rows per forward and backward pass.
    pub fn micro(&self) -> usize {
        self.micro_batch_size
            .unwrap_or(self.batch_size)
            .min(self.batch_size)
    }
}

impl DistillConfig {
    /// actor_train's recipe in a distill stage: one optimizer step per batch, in the sampler's
    /// order, as SFT's.
    pub fn recipe(&self) -> TrainRecipe {
        TrainRecipe::step_per_batch(
            &self.optimizer,
            Objective::Distill {
                params: self.params(),
                weight: self.distill_loss_weight,
            },
        )
    }
}

impl DpoConfig {
    /// actor_train's recipe in a DPO stage: one optimizer step per batch of pairs, in order.
    pub fn recipe(&self) -> TrainRecipe {
        TrainRecipe::step_per_batch(&self.optimizer, Objective::Preference(self.params()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::load::from_yaml_str;

    #[test]
    fn stages_make_their_recipes_from_their_sections() {
        let cfg: crate::config::RunConfig = from_yaml_str(
            "name: t\nmodel: { init: { arch: qwen2, hidden: 32, layers: 2, heads: 4, kv_heads: 2, \
             intermediate: 64, chars: \"0\" } }\n\
             data: { domains: [ { name: d, synthetic: { task: addition, count: 1 }, reward: exact_match } ] }\n\
             sft: { steps: 3, batch_size: 8, micro_batch_size: 16, optimizer: { lr: 0.01 } }\n\
             rl: { steps: 5, prompts_per_step: 2, group_size: 4, ppo_epochs: 2, mini_batches: 3, \
                   adv_estimator: gae, critic: { value_clip: 0.5, optimizer: { lr: 0.002 } }, \
                   kl: { mode: in_loss, estimator: k3 }, entropy_coef: 0.01 }\n",
            "<test>",
        )
        .expect("config");
        let sft = cfg.sft.as_ref().expect("sft");
        let r = sft.recipe();
        assert_eq!((r.epochs, r.mini_batches, r.shuffle), (1, 1, false));
        assert_eq!(r.optimizer.lr, 0.01);
        assert_eq!(r.objective, Objective::Likelihood);
        // A micro-batch larger than the batch is the batch.
        assert_eq!(sft.micro(), 8);

        let rl = cfg.rl.as_ref().expect("rl");
        let a = rl.actor_recipe();
        assert_eq!((a.epochs, a.mini_batches, a.shuffle), (2, 3, true));
        assert_eq!(
            a.objective,
            Objective::Policy(PolicyObjective {
                loss: rl.policy_loss,
                entropy_coef: 0.01,
                kl_in_loss: Some(KlEstimator::K3),
            })
        );
        let c = rl.critic_recipe().expect("critic");
        assert_eq!(c.optimizer.lr, 0.002);
        assert_eq!(
            c.objective,
            Objective::Value {
                clip: Some(0.5),
                agg: LossAgg::TokenMean
            }
        );
        assert_eq!(rl.updates(), 5 * 2 * 3);
    }
}
