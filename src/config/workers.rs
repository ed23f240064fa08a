//! `workers:` — the devices of a run and where each role runs: on which devices (`device_mapping`, as
//! in ROLL), in how many workers, with which memory footprint, in the trainer's process or in child
//! processes. Roles whose device sets overlap are colocated and time-share those devices.

use serde::{Deserialize, Serialize};

use super::Role;
pub use super::devices::{DeviceKind, DevicesConfig, Kernels, MAX_DEVICES};

/// Upper bound on workers of one role (a typo like `num_workers: 1000` should not fork-bomb).
pub const MAX_WORKERS_PER_ROLE: usize = 64;

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
    /// Reward scoring: rules and programs need no device; judge models (`llm_judge`) are placed
    /// on `device_mapping` and time-shared like every model role.
    pub reward: RolePlacement,
    /// The environments of an agentic stage (no device): `process` hosts the env instances in
    /// `num_workers` processes (`roll-tui env serve`), so a crash or a kill costs the episodes of
    /// one worker, never the run.
    pub env: RolePlacement,
    /// Distillation's teacher (`distill.teacher`).
    pub teacher: RolePlacement,
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
    /// Device indices this role's workers use, split evenly among them; unset = `[0]` (everything
    /// colocated on device 0). The reward role uses its devices only for judge models.
    pub device_mapping: Option<Vec<usize>>,
    /// Memory per worker in MiB, overriding the estimate made from the model's shape.
    pub memory_mb: Option<f64>,
    /// Compute threads of each of this role's worker processes; unset = the machine's cores
    /// shared among the roles that compute at the same time (see [`WorkersConfig::threads`]).
    pub threads: Option<usize>,
}

impl Default for RolePlacement {
    fn default() -> Self {
        RolePlacement {
            mode: PlacementMode::InProcess,
            num_workers: 1,
            device_mapping: None,
            memory_mb: None,
            threads: None,
        }
    }
}

/// Upper bound on `threads` (a typo should not start thousands of threads).
pub const MAX_THREADS: usize = 1024;

impl WorkersConfig {
    pub fn role(&self, role: Role) -> Option<&RolePlacement> {
        match role {
            Role::ActorTrain => Some(&self.actor_train),
            Role::ActorInfer => Some(&self.actor_infer),
            Role::Reference => Some(&self.reference),
            Role::Critic => Some(&self.critic),
            Role::Reward => Some(&self.reward),
            Role::Env => Some(&self.env),
            Role::Teacher => Some(&self.teacher),
        }
    }

    /// The devices `role` runs on (empty for roles without a device).
    pub fn device_mapping(&self, role: Role) -> Vec<usize> {
        match self.role(role) {
            Some(p) if role.uses_device() => p.device_mapping.clone().unwrap_or_else(|| vec![0]),
            _ => vec![],
        }
    }

    /// The compute threads of a worker process of `role` on a machine of `cores` cores: its
    /// `threads`, or else the cores shared among the sides that compute at the same time, so
    /// that worker processes never oversubscribe the machine. Roles take turns in a synchronous
    /// run (each may use every core while it works); with `async_ratio > 0` actor_infer generates
    /// while the trainer's side (actor_train, reference, critic) works, so each side gets half.
    /// Two processes spinning on the same cores each run several times slower than alone
    /// (benches/RESULTS.md, co-scheduling).
    pub fn threads(&self, role: Role, async_ratio: usize, cores: usize) -> usize {
        if let Some(t) = self.role(role).and_then(|p| p.threads) {
            return t;
        }
        let sides = if async_ratio > 0 { 2 } else { 1 };
        (cores / sides).max(1)
    }

    /// The device worker `worker` of `role` computes on: the first of its share of the
    /// role's `device_mapping` (split evenly among its workers), as `workers.devices.kind`
    /// names it. In-process roles compute on [`Self::trainer_device`].
    pub fn device_of(&self, role: Role, worker: usize) -> crate::device::DeviceSpec {
        let map = self.device_mapping(role);
        let workers = self.role(role).map_or(1, |p| p.num_workers.max(1));
        let share = (map.len() / workers).max(1);
        let index = map
            .get(worker * share)
            .or(map.first())
            .copied()
            .unwrap_or(0);
        crate::device::DeviceSpec::of(self.devices.kind, index)
    }

    /// Where the trainer's process computes, and so every in-process role: actor_train's device.
    pub fn trainer_device(&self) -> crate::device::DeviceSpec {
        self.device_of(Role::ActorTrain, 0)
    }

    /// Whether two roles share at least one device.
    pub fn colocated(&self, a: Role, b: Role) -> bool {
        let other = self.device_mapping(b);
        self.device_mapping(a).iter().any(|d| other.contains(d))
    }

    pub fn validate(&self, async_ratio: usize, p: &mut Vec<String>) {
        self.devices.validate(p);
        for role in [
            Role::ActorTrain,
            Role::ActorInfer,
            Role::Reference,
            Role::Critic,
            Role::Reward,
            Role::Env,
            Role::Teacher,
        ] {
            if let Some(r) = self.role(role) {
                self.validate_role(role, r, p);
            }
        }
        // One process computes on one device: an in-process role cannot sit on another GPU.
        if self.devices.kind == DeviceKind::Cuda {
            let trainer = self.trainer_device();
            for role in [
                Role::ActorInfer,
                Role::Reference,
                Role::Critic,
                Role::Reward,
                Role::Teacher,
            ] {
                let Some(r) = self.role(role) else { continue };
                if r.mode == PlacementMode::InProcess
                    && r.device_mapping.is_some()
                    && self.device_of(role, 0) != trainer
                {
                    p.push(format!(
                        "workers.{role} runs in the trainer's process, which computes on {trainer} \
                         (actor_train's device), but its device_mapping puts it on {}: set \
                         workers.{role}.mode: process to give it a device of its own",
                        self.device_of(role, 0)
                    ));
                }
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

    fn validate_threads(&self, role: Role, r: &RolePlacement, p: &mut Vec<String>) {
        if let Some(t) = r.threads
            && !(1..=MAX_THREADS).contains(&t)
        {
            p.push(format!(
                "workers.{role}.threads must be in 1..={MAX_THREADS}, got {t}"
            ));
        }
    }

    fn validate_role(&self, role: Role, r: &RolePlacement, p: &mut Vec<String>) {
        self.validate_threads(role, r, p);
        let at = format!("workers.{role}");
        if r.num_workers == 0 || r.num_workers > MAX_WORKERS_PER_ROLE {
            p.push(format!(
                "{at}.num_workers must be in 1..={MAX_WORKERS_PER_ROLE}, got {}",
                r.num_workers
            ));
        }
        // One engine serves the rollout; several actor_infer processes would need a request router.
        let single_worker = matches!(
            role,
            Role::ActorTrain | Role::Reference | Role::Critic | Role::Teacher
        ) || (role == Role::ActorInfer && r.mode == PlacementMode::Process);
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
        // Reward workers may also share devices (several judge replicas on one device).
        let shared = role == Role::Reward && r.num_workers.is_multiple_of(map.len().max(1));
        if !map.is_empty()
            && r.num_workers > 0
            && !map.len().is_multiple_of(r.num_workers)
            && !shared
        {
            p.push(format!(
                "{at}.device_mapping has {} devices, which cannot be split evenly among {} workers",
                map.len(),
                r.num_workers
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_share_the_cores_among_the_sides_that_compute_at_once() {
        let mut w = WorkersConfig::default();
        // Synchronous: roles take turns, each may use every core.
        assert_eq!(w.threads(Role::ActorInfer, 0, 8), 8);
        // Asynchronous: generation beside training, half each (at least one).
        assert_eq!(w.threads(Role::ActorInfer, 1, 8), 4);
        assert_eq!(w.threads(Role::ActorTrain, 2, 2), 1);
        assert_eq!(w.threads(Role::Reference, 1, 1), 1);
        // A setting wins.
        w.actor_infer.threads = Some(3);
        assert_eq!(w.threads(Role::ActorInfer, 1, 8), 3);
        let mut problems = vec![];
        w.actor_infer.threads = None;
        w.validate(0, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        w.actor_infer.threads = Some(0);
        w.validate(0, &mut problems);
        assert_eq!(
            problems,
            ["workers.actor_infer.threads must be in 1..=1024, got 0"]
        );
    }

    #[test]
    fn judges_may_share_a_device_but_environments_have_none() {
        let mut w = WorkersConfig::default();
        // Two reward workers, each with its judge, on device 0.
        w.reward.num_workers = 2;
        w.reward.device_mapping = Some(vec![0]);
        let mut problems = vec![];
        w.validate(0, &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        // Two actor_infer workers cannot share one device.
        w.actor_infer.num_workers = 2;
        w.actor_infer.device_mapping = Some(vec![0]);
        w.validate(0, &mut problems);
        assert!(
            problems
                .iter()
                .any(|p| p.contains("workers.actor_infer.device_mapping has 1 devices")),
            "{problems:?}"
        );
        let mut w = WorkersConfig::default();
        w.env.device_mapping = Some(vec![0]);
        let mut problems = vec![];
        w.validate(0, &mut problems);
        assert_eq!(
            problems,
            ["workers.env.device_mapping: the env role uses no device; remove the key"]
        );
    }
}
