//! `workers:` — where each role runs. Today only the reward role can leave the trainer's process; the
//! scheduler issue moves the others.

use serde::{Deserialize, Serialize};

/// Upper bound on worker processes of one role (a typo like `count: 1000` should not fork-bomb).
pub const MAX_WORKERS_PER_ROLE: usize = 64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct WorkersConfig {
    /// Rule-reward scoring.
    pub reward: RolePlacement,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PlacementMode {
    /// In the trainer's process (debugging, tests, the smallest runs).
    #[default]
    InProcess,
    /// In `count` child processes (`roll-tui worker ROLE`), restarted if they die.
    Process,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolePlacement {
    pub mode: PlacementMode,
    /// Worker processes of this role when `mode: process`.
    pub count: usize,
}

impl Default for RolePlacement {
    fn default() -> Self {
        RolePlacement {
            mode: PlacementMode::InProcess,
            count: 1,
        }
    }
}

impl WorkersConfig {
    pub fn validate(&self, p: &mut Vec<String>) {
        let r = &self.reward;
        if r.count == 0 || r.count > MAX_WORKERS_PER_ROLE {
            p.push(format!(
                "workers.reward.count must be in 1..={MAX_WORKERS_PER_ROLE}, got {}",
                r.count
            ));
        }
    }
}
