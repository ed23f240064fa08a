//! `workers:` — the devices of a run and where each role runs: on which devices (`device_mapping`, as
//! in ROLL), in how many workers, with which memory footprint, in the trainer's process or in child
//! processes. Roles whose device sets overlap are colocated and time-share those devices.

use serde::{Deserialize, Serialize};

use super::Role;

/// Upper bound on workers of one role (a typo like `num_workers: 1000` should not fork-bomb).
pub const MAX_WORKERS_PER_ROLE: usize = 64;
/// Upper bound on virtual devices (the simulator goes further; a run has no use for more).
pub const MAX_DEVICES: usize = 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct WorkersConfig {
    pub devices: DevicesConfig,
    /// The policy being trained (weights, gradients, optimizer state).
    pub actor_train: RolePlacement,
    /// Generation (weights and KV cache).
    pub actor_infer: RolePlacement,
    /// The KL reference policy.
    pub reference: RolePlacement,
    /// The value model of `adv_estimator: gae`.
    pub critic: RolePlacement,
    /// Rule-reward scoring (no device).
    pub reward: RolePlacement,
    /// The environments of an agentic stage (no device): `process` hosts the env instances in
    /// `num_workers` processes (`roll-tui env serve`), so a crash or a kill costs the episodes of
    /// one worker, never the run.
    pub env: RolePlacement,
}

/// The devices roles are mapped onto. Without a GPU these are virtual devices: each has a memory
/// budget that the placement check and the residency ledger enforce, so time-sharing runs (and is
/// tested) the same way it does on GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DevicesConfig {
    pub count: usize,
    /// Memory of each device in MiB; unset = this machine's memory divided among the devices.
    pub memory_mb: Option<f64>,
}

impl Default for DevicesConfig {
    fn default() -> Self {
        DevicesConfig {
            count: 1,
            memory_mb: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PlacementMode {
    /// In the trainer's process (debugging, tests, the smallest runs).
    #[default]
    InProcess,
    /// In child processes (`roll-tui worker ROLE`), restarted if they die.
    Process,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolePlacement {
    pub mode: PlacementMode,
    pub num_workers: usize,
    /// Device indices this role's workers use, split evenly among them; unset = `[0]` for the model
    /// roles (everything colocated on device 0), none for reward.
    pub device_mapping: Option<Vec<usize>>,
    /// Memory per worker in MiB, overriding the estimate made from the model's shape.
    pub memory_mb: Option<f64>,
}

impl Default for RolePlacement {
    fn default() -> Self {
        RolePlacement {
            mode: PlacementMode::InProcess,
            num_workers: 1,
            device_mapping: None,
            memory_mb: None,
        }
    }
}

impl WorkersConfig {
    pub fn role(&self, role: Role) -> Option<&RolePlacement> {
        match role {
            Role::ActorTrain => Some(&self.actor_train),
            Role::ActorInfer => Some(&self.actor_infer),
            Role::Reference => Some(&self.reference),
            Role::Critic => Some(&self.critic),
            Role::Reward => Some(&self.reward),
            Role::Env => Some(&self.env),
        }
    }

    /// The devices `role` runs on (empty for roles without a device).
    pub fn device_mapping(&self, role: Role) -> Vec<usize> {
        match self.role(role) {
            Some(p) if role.uses_device() => p.device_mapping.clone().unwrap_or_else(|| vec![0]),
            _ => vec![],
        }
    }

    /// Whether two roles share at least one device.
    pub fn colocated(&self, a: Role, b: Role) -> bool {
        let other = self.device_mapping(b);
        self.device_mapping(a).iter().any(|d| other.contains(d))
    }

    pub fn validate(&self, async_ratio: usize, p: &mut Vec<String>) {
        let d = &self.devices;
        if d.count == 0 || d.count > MAX_DEVICES {
            p.push(format!(
                "workers.devices.count must be in 1..={MAX_DEVICES}, got {}",
                d.count
            ));
        }
        if let Some(mb) = d.memory_mb
            && !(mb.is_finite() && mb > 0.0)
        {
            p.push(format!(
                "workers.devices.memory_mb must be a positive number of MiB, got {mb}"
            ));
        }
        for role in [
            Role::ActorTrain,
            Role::ActorInfer,
            Role::Reference,
            Role::Critic,
            Role::Reward,
            Role::Env,
        ] {
            if let Some(r) = self.role(role) {
                self.validate_role(role, r, p);
            }
        }
        // Training must never offload actor_infer while it generates ahead.
        for other in [Role::ActorTrain, Role::Reference, Role::Critic] {
            if async_ratio > 0 && self.colocated(Role::ActorInfer, other) {
                p.push(format!(
                    "rl.async_generation_ratio is {async_ratio} but workers.actor_infer.device_mapping \
                     {:?} overlaps workers.{other}.device_mapping {:?}: asynchronous rollout needs its \
                     own devices (give actor_infer other devices, or set async_generation_ratio: 0)",
                    self.device_mapping(Role::ActorInfer),
                    self.device_mapping(other)
                ));
            }
        }
    }

    fn validate_role(&self, role: Role, r: &RolePlacement, p: &mut Vec<String>) {
        let at = format!("workers.{role}");
        if r.num_workers == 0 || r.num_workers > MAX_WORKERS_PER_ROLE {
            p.push(format!(
                "{at}.num_workers must be in 1..={MAX_WORKERS_PER_ROLE}, got {}",
                r.num_workers
            ));
        }
        // One engine serves the rollout; several actor_infer processes would need a request router.
        let single_worker = matches!(role, Role::ActorTrain | Role::Reference | Role::Critic)
            || (role == Role::ActorInfer && r.mode == PlacementMode::Process);
        if single_worker && r.num_workers > 1 {
            p.push(format!(
                "{at}.num_workers is {} but {role} runs as one worker in this build",
                r.num_workers
            ));
        }
        if let Some(mb) = r.memory_mb
            && !(mb.is_finite() && mb > 0.0)
        {
            p.push(format!(
                "{at}.memory_mb must be a positive number of MiB, got {mb}"
            ));
        }
        let Some(map) = &r.device_mapping else {
            return;
        };
        if !role.uses_device() {
            p.push(format!(
                "{at}.device_mapping: the {role} role uses no device; remove the key"
            ));
            return;
        }
        if map.is_empty() {
            p.push(format!("{at}.device_mapping must list at least one device"));
        }
        for (i, dev) in map.iter().enumerate() {
            if *dev >= self.devices.count {
                p.push(format!(
                    "{at}.device_mapping[{i}] is device {dev} but there are {} devices \
                     (workers.devices.count)",
                    self.devices.count
                ));
            }
            if map[..i].contains(dev) {
                p.push(format!("{at}.device_mapping lists device {dev} twice"));
            }
        }
        if !map.is_empty() && r.num_workers > 0 && !map.len().is_multiple_of(r.num_workers) {
            p.push(format!(
                "{at}.device_mapping has {} devices, which cannot be split evenly among {} workers",
                map.len(),
                r.num_workers
            ));
        }
    }
}
