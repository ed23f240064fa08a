//! The closed sets of names every layer shares: a run's stages, ROLL's roles, the phases roles
//! time-share devices by, and the record of one offload or reload. They import nothing from the
//! crate, so the store and the metrics, which record them, sit below the config and the scheduler,
//! which act on them. Adding a stage or a role starts here.

use serde::{Deserialize, Serialize};

/// A stage of a run: each has its own config section (`sft:`, `rl:`), its pipeline, its metric
/// series and checkpoints in the store, and its panels in the workbench.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Supervised fine-tuning on (prompt, ground truth) pairs (`sft:`).
    Sft,
    /// Knowledge distillation from a teacher's top-k (`distill:`).
    Distill,
    /// Preference optimisation on (prompt, chosen, rejected) pairs (`dpo:`).
    Dpo,
    /// RL with verifiable rewards (`rl:`).
    Rl,
    /// An evaluation run's one step (`roll-tui eval`): a model scored on held-out prompts. No
    /// config section asks for it and it trains nothing.
    Eval,
}

impl Stage {
    /// Every stage this build knows, in the order a run goes through those its config has.
    pub const ALL: [Stage; 5] = [
        Stage::Sft,
        Stage::Distill,
        Stage::Dpo,
        Stage::Rl,
        Stage::Eval,
    ];

    /// The stage's name: its config section, and how the store and the workbench name it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Stage::Sft => "sft",
            Stage::Distill => "distill",
            Stage::Dpo => "dpo",
            Stage::Rl => "rl",
            Stage::Eval => "eval",
        }
    }

    pub fn parse(name: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// Where a stored stage name sorts: known stages in [`Stage::ALL`] order, then any other name
    /// (written by a newer version).
    pub fn rank_of(name: &str) -> usize {
        Stage::ALL
            .iter()
            .position(|s| s.as_str() == name)
            .unwrap_or(Stage::ALL.len())
    }

    /// Whether the stage records samples each step (the Samples view's): rl its scored
    /// rollouts, dpo its pairs with their implicit rewards, eval its scored answers.
    pub const fn records_samples(self) -> bool {
        matches!(self, Stage::Dpo | Stage::Rl | Stage::Eval)
    }

    /// The stages after this one in [`Stage::ALL`] order.
    pub fn later(self) -> &'static [Stage] {
        let at = Stage::ALL.iter().position(|s| *s == self).unwrap_or(0);
        &Stage::ALL[at + 1..]
    }
}

/// A stage equals its name, as the store and checkpoints write it.
impl PartialEq<&str> for Stage {
    fn eq(&self, name: &&str) -> bool {
        self.as_str() == *name
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

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

/// The phases of a run that roles time-share devices by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Generate,
    Train,
    /// A distillation stage's teacher computes the batch's top k.
    Teach,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Generate => "generate",
            Phase::Train => "train",
            Phase::Teach => "teach",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which way a role's state moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    Offload,
    Reload,
}

impl Direction {
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Offload => "offload",
            Direction::Reload => "reload",
        }
    }
}

/// One completed move of a role's state between its devices and host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct Transfer {
    pub role: Role,
    pub direction: Direction,
    pub phase: Phase,
    pub devices: Vec<usize>,
    pub bytes: u64,
    pub seconds: f64,
    /// On GPUs, each device's memory as its driver reported it around the move (empty on the
    /// CPU, whose devices are budgets).
    pub memory: Vec<DeviceReading>,
}

/// A GPU's free memory before and after one move, and its total, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceReading {
    pub device: usize,
    pub free_before: u64,
    pub free_after: u64,
    pub total: u64,
}
