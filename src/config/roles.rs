//! The names of ROLL's roles: the closed set a config places (`workers.<role>`), the scheduler
//! time-shares and the role layer (`src/role/`) implements. Adding a role starts here.

use serde::{Deserialize, Serialize};

/// A role of ROLL's multi-role architecture.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Role {
    ActorTrain,
    ActorInfer,
    Reference,
    Critic,
    Reward,
    Env,
    /// Distillation's teacher: a frozen model of its own that gives its top-k per token.
    Teacher,
}

impl Role {
    /// Every role, in the order the workbench lists them.
    pub const ALL: [Role; 7] = [
        Role::ActorTrain,
        Role::ActorInfer,
        Role::Reference,
        Role::Critic,
        Role::Reward,
        Role::Env,
        Role::Teacher,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::ActorTrain => "actor_train",
            Role::ActorInfer => "actor_infer",
            Role::Reference => "reference",
            Role::Critic => "critic",
            Role::Reward => "reward",
            Role::Env => "env",
            Role::Teacher => "teacher",
        }
    }

    /// Whether the role can hold a model on a device (and so has a `device_mapping`): the reward
    /// role does when the run's rewards include judge models (`llm_judge`).
    pub fn uses_device(self) -> bool {
        !matches!(self, Role::Env)
    }

    /// Whether this build can run the role in a worker process.
    pub fn runs_out_of_process(self) -> bool {
        !matches!(self, Role::Env)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
