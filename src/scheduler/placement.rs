//! Which role sits on which device with how many bytes, and whether that fits.
//!
//! A run alternates phases: `generate` (actor_infer, and the reward role's judge models that score
//! its samples) and `train` (actor_train with the reference, critic and on-policy distillation
//! teachers it reads). A distillation stage alternates `teach` (its teacher gives the batch's top
//! k) and `train` (actor_train). Roles of one phase are resident together; roles of another phase
//! that share a device with them are offloaded meanwhile. With asynchronous rollout (α > 0) actor_infer stays
//! resident through every phase. A placement fits when, in every phase, the resident roles of each
//! device fit its memory; otherwise it is refused before anything starts, naming device and bytes.

use crate::config::{RlConfig, WorkersConfig};
use crate::model::ModelConfig;
use crate::model::params::expected_tensors;
use crate::names::{Phase, Role};

/// One role's share of the devices.
#[derive(Debug, Clone, PartialEq)]
pub struct RoleSlot {
    pub role: Role,
    /// The node its workers run on (a cluster's host); `None`: the head's machine. Device `d` of
    /// one node is not device `d` of another.
    pub node: Option<String>,
    pub devices: Vec<usize>,
    pub workers: usize,
    /// Bytes one worker needs (weights, gradients, optimizer moments, KV cache).
    pub bytes_per_worker: u64,
}

impl RoleSlot {
    /// The bytes on each of the role's devices: a worker's bytes spread evenly over its devices,
    /// times the workers that share a device when there are more workers than devices (a pool of
    /// reward workers on one device each hold their judge).
    pub fn bytes_per_device(&self) -> u64 {
        let workers = self.workers.max(1);
        let devices = self.devices.len().max(1);
        let per_worker = (devices / workers).max(1) as u64;
        let sharing = workers.div_ceil(devices) as u64;
        self.bytes_per_worker.div_ceil(per_worker) * sharing
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub device_count: usize,
    pub memory_per_device: u64,
    pub slots: Vec<RoleSlot>,
    /// α > 0: actor_infer is resident in every phase.
    pub async_rollout: bool,
    /// When the teacher role works: `train` in an RL stage (on-policy distillation scores the
    /// sampled tokens in the update), `teach` in a distillation stage.
    pub teacher_phase: Phase,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "placement does not fit: device {device}{} has {} (workers.devices.memory_mb) but phase '{phase}' \
     needs {} there: {}; give the roles more devices, raise workers.devices.memory_mb, or lower \
     workers.<role>.memory_mb",
    .node.as_ref().map(|n| format!(" of node {n}")).unwrap_or_default(),
    mib(*.budget), mib(*.needed), .parts.iter().map(|(r, b)| format!("{r} {}", mib(*b))).collect::<Vec<_>>().join(" + ")
)]
pub struct PlacementError {
    pub device: usize,
    pub node: Option<String>,
    pub phase: Phase,
    pub budget: u64,
    pub needed: u64,
    pub parts: Vec<(Role, u64)>,
}

/// Bytes as MiB with one decimal, plus the exact byte count.
pub fn mib(bytes: u64) -> String {
    format!(
        "{:.1} MiB ({bytes} bytes)",
        bytes as f64 / (1u64 << 20) as f64
    )
}

impl Placement {
    /// Check that every phase fits on every device.
    pub fn new(
        device_count: usize,
        memory_per_device: u64,
        slots: Vec<RoleSlot>,
        async_rollout: bool,
    ) -> Result<Placement, PlacementError> {
        Placement {
            device_count,
            memory_per_device,
            slots,
            async_rollout,
            teacher_phase: Phase::Train,
        }
        .checked()
    }

    fn checked(self) -> Result<Placement, PlacementError> {
        let p = self;
        let mut nodes: Vec<&Option<String>> = p.slots.iter().map(|s| &s.node).collect();
        nodes.sort();
        nodes.dedup();
        for phase in [Phase::Generate, Phase::Train, Phase::Teach] {
            for node in &nodes {
                for device in 0..p.device_count {
                    let parts: Vec<(Role, u64)> = p
                        .phase_roles(phase)
                        .filter(|s| &s.node == *node && s.devices.contains(&device))
                        .map(|s| (s.role, s.bytes_per_device()))
                        .collect();
                    let needed = parts.iter().map(|(_, b)| b).sum::<u64>();
                    if needed > p.memory_per_device {
                        return Err(PlacementError {
                            device,
                            node: (*node).clone(),
                            phase,
                            budget: p.memory_per_device,
                            needed,
                            parts,
                        });
                    }
                }
            }
        }
        Ok(p)
    }

    /// The same placement with the roles `nodes` names on those nodes (a cluster's workers: the
    /// others are on the head's machine), checked again: roles on different nodes never share a
    /// device, so they neither time-share nor add up.
    pub fn on_nodes(
        mut self,
        nodes: &std::collections::BTreeMap<Role, String>,
    ) -> Result<Placement, PlacementError> {
        for slot in &mut self.slots {
            slot.node = nodes.get(&slot.role).cloned();
        }
        self.checked()
    }

    /// The placement a run's config asks for, with footprints estimated from the model's shape
    /// (or taken from `workers.<role>.memory_mb`), on devices of `budget` bytes each
    /// (`crate::device::budget_bytes`).
    /// `judges` are the shapes of the run's judge models (`llm_judge` rewards), which put the
    /// reward role on devices; `teachers` those of its on-policy distillation teachers
    /// (`rl.opd`), which put the teacher role there.
    pub fn for_run(
        workers: &WorkersConfig,
        rl: &RlConfig,
        model: &ModelConfig,
        dtype_bytes: usize,
        (judges, teachers): (&[ModelConfig], &[ModelConfig]),
        budget: u64,
    ) -> Result<Placement, PlacementError> {
        let mut roles = vec![Role::ActorTrain, Role::ActorInfer];
        if rl.kl.mode != crate::algo::kl::KlMode::None {
            roles.push(Role::Reference);
        }
        if rl.critic.is_some() {
            roles.push(Role::Critic);
        }
        if !judges.is_empty() {
            roles.push(Role::Reward);
        }
        if !teachers.is_empty() {
            roles.push(Role::Teacher);
        }
        let slots = roles
            .into_iter()
            .map(|role| {
                let estimate = match role {
                    // Every judge of the run, loaded in f32, in each reward worker.
                    Role::Reward => judges
                        .iter()
                        .map(|j| estimate_bytes(Role::Reward, j, 4, 0))
                        .sum(),
                    // Every teacher's weights, in the run's dtype.
                    Role::Teacher => teachers
                        .iter()
                        .map(|t| estimate_bytes(Role::Teacher, t, dtype_bytes, 0))
                        .sum(),
                    _ => estimate_bytes(role, model, dtype_bytes, rl.rollout_batch),
                };
                slot_of(workers, role, estimate)
            })
            .collect();
        Placement::new(
            workers.devices.count,
            budget,
            slots,
            rl.async_generation_ratio > 0,
        )
    }

    /// The placement of a distillation stage: actor_train training `student`, and the teacher
    /// of shape `teacher`, which time-share their devices when they share one.
    pub fn for_distill(
        workers: &WorkersConfig,
        student: &ModelConfig,
        teacher: &ModelConfig,
        dtype_bytes: usize,
        budget: u64,
    ) -> Result<Placement, PlacementError> {
        let slots = vec![
            slot_of(
                workers,
                Role::ActorTrain,
                estimate_bytes(Role::ActorTrain, student, dtype_bytes, 0),
            ),
            slot_of(
                workers,
                Role::Teacher,
                estimate_bytes(Role::Teacher, teacher, dtype_bytes, 0),
            ),
        ];
        Placement {
            device_count: workers.devices.count,
            memory_per_device: budget,
            slots,
            async_rollout: false,
            teacher_phase: Phase::Teach,
        }
        .checked()
    }

    pub fn slot(&self, role: Role) -> Option<&RoleSlot> {
        self.slots.iter().find(|s| s.role == role)
    }

    /// Roles resident during `phase`.
    pub fn phase_roles(&self, phase: Phase) -> impl Iterator<Item = &RoleSlot> {
        self.slots
            .iter()
            .filter(move |s| self.needed_in(s.role, phase))
    }

    pub fn needed_in(&self, role: Role, phase: Phase) -> bool {
        match role {
            Role::ActorInfer => phase == Phase::Generate || self.async_rollout,
            Role::ActorTrain | Role::Reference | Role::Critic => phase == Phase::Train,
            // Judges score while the rollout generates (and, asynchronously, while it runs on
            // beside training).
            Role::Reward => phase == Phase::Generate || self.async_rollout,
            Role::Teacher => phase == self.teacher_phase,
            Role::Env => false,
        }
    }

    /// Whether two roles share a device (and so time-share it): one of the same node.
    pub fn colocated(&self, a: Role, b: Role) -> bool {
        match (self.slot(a), self.slot(b)) {
            (Some(x), Some(y)) => {
                x.node == y.node && x.devices.iter().any(|d| y.devices.contains(d))
            }
            _ => false,
        }
    }
}

/// `role`'s slot: its `device_mapping` and workers, and `estimate` bytes a worker unless
/// `workers.<role>.memory_mb` says otherwise.
fn slot_of(workers: &WorkersConfig, role: Role, estimate: u64) -> RoleSlot {
    let cfg = workers.role(role).cloned().unwrap_or_default();
    let bytes = match cfg.memory_mb {
        Some(mb) => (mb * (1u64 << 20) as f64) as u64,
        None => estimate,
    };
    // An in-process role is one copy, whatever num_workers says.
    let copies = match cfg.mode {
        crate::config::PlacementMode::InProcess => 1,
        crate::config::PlacementMode::Process => cfg.num_workers,
    };
    RoleSlot {
        role,
        node: None,
        devices: workers.device_mapping(role),
        workers: copies,
        bytes_per_worker: bytes,
    }
}

/// Bytes a role's worker holds for a model of this shape: weights; plus gradients and two AdamW
/// moments for trainable roles; plus a full KV cache of `rollout_batch` sequences for generation.
/// Activations are not counted (they are transient and small next to these at our batch sizes).
pub fn estimate_bytes(
    role: Role,
    model: &ModelConfig,
    dtype_bytes: usize,
    rollout_batch: usize,
) -> u64 {
    let params: u64 = expected_tensors(model)
        .iter()
        .map(|(_, shape, _)| shape.iter().product::<usize>() as u64)
        .sum();
    let weights = params * dtype_bytes as u64;
    // Gradients in the weights' dtype; AdamW moments in f32, and f32 master weights for
    // parameters stored narrower (bf16).
    let masters = if dtype_bytes < 4 { params * 4 } else { 0 };
    let trainable = weights + weights + 2 * params * 4 + masters;
    match role {
        Role::ActorTrain => trainable,
        Role::Critic => trainable + 4 * (model.hidden_size as u64 + 1) * 4,
        // A judge model is frozen weights; its short verdicts' activations are not counted.
        Role::Reference | Role::Reward | Role::Teacher => weights,
        Role::ActorInfer => {
            let kv_per_token = 2
                * model.num_hidden_layers
                * model.num_key_value_heads
                * model.head_dim
                * dtype_bytes;
            weights + (rollout_batch * model.max_position_embeddings * kv_per_token) as u64
        }
        Role::Env => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(role: Role, devices: &[usize], mib: u64) -> RoleSlot {
        RoleSlot {
            role,
            node: None,
            devices: devices.to_vec(),
            workers: 1,
            bytes_per_worker: mib << 20,
        }
    }

    #[test]
    fn colocated_roles_need_only_the_larger_phase() {
        // 60 + 30 on device 0 in train, 50 in generate: fits 100 MiB though the sum is 140.
        let p = Placement::new(
            1,
            100 << 20,
            vec![
                slot(Role::ActorTrain, &[0], 60),
                slot(Role::Reference, &[0], 30),
                slot(Role::ActorInfer, &[0], 50),
            ],
            false,
        )
        .expect("fits");
        assert!(p.colocated(Role::ActorTrain, Role::ActorInfer));
        let train: Vec<Role> = p.phase_roles(Phase::Train).map(|s| s.role).collect();
        assert_eq!(train, [Role::ActorTrain, Role::Reference]);
    }

    #[test]
    fn a_placement_that_cannot_fit_names_device_phase_and_bytes() {
        let err = Placement::new(
            2,
            100 << 20,
            vec![
                slot(Role::ActorTrain, &[1], 80),
                slot(Role::Reference, &[1], 30),
                slot(Role::ActorInfer, &[0], 50),
            ],
            false,
        )
        .expect_err("110 MiB on device 1");
        assert_eq!(
            (err.device, err.phase, err.needed),
            (1, Phase::Train, 110 << 20)
        );
        let text = err.to_string();
        assert!(
            text.contains("device 1 has 100.0 MiB (104857600 bytes)"),
            "{text}"
        );
        assert!(text.contains("actor_train 80.0 MiB"), "{text}");
        assert!(text.contains("reference 30.0 MiB"), "{text}");
    }

    #[test]
    fn async_rollout_keeps_actor_infer_resident_while_training() {
        let slots = vec![
            slot(Role::ActorTrain, &[0], 60),
            slot(Role::ActorInfer, &[0], 50),
        ];
        assert!(Placement::new(1, 100 << 20, slots.clone(), false).is_ok());
        let err = Placement::new(1, 100 << 20, slots, true).expect_err("60 + 50 resident");
        assert_eq!((err.phase, err.needed), (Phase::Train, 110 << 20));
    }

    /// Device 0 of one node is not device 0 of another: roles there neither add up nor
    /// time-share; a node that is still too small is named.
    #[test]
    fn roles_on_different_nodes_do_not_share_a_device() {
        let slots = vec![
            slot(Role::ActorTrain, &[0], 60),
            slot(Role::Reference, &[0], 50),
            slot(Role::ActorInfer, &[0], 40),
        ];
        // One machine: the train phase needs 110 MiB of device 0's 100.
        let err = Placement::new(1, 100 << 20, slots.clone(), false).expect_err("too big");
        assert_eq!(
            (err.device, err.node.clone(), err.needed),
            (0, None, 110 << 20)
        );
        let p = Placement {
            device_count: 1,
            memory_per_device: 100 << 20,
            slots: slots.clone(),
            async_rollout: false,
            teacher_phase: Phase::Train,
        };
        // The reference on node b: it fits, and it shares nothing with actor_train or the
        // generator, which still time-share device 0 of the head's machine.
        let nodes = [(Role::Reference, "b".to_string())].into();
        let placed = p.clone().on_nodes(&nodes).expect("fits across two nodes");
        assert!(!placed.colocated(Role::ActorTrain, Role::Reference));
        assert!(!placed.colocated(Role::Reference, Role::ActorInfer));
        assert!(placed.colocated(Role::ActorTrain, Role::ActorInfer));
        // Phase after phase, actor_train and the generator take turns on the head's device 0;
        // the reference on node b is never offloaded.
        let mut ledger = super::super::ledger::Ledger::new(placed);
        let mut moves = vec![];
        for phase in [Phase::Generate, Phase::Train, Phase::Generate, Phase::Train] {
            ledger
                .enter(phase, |r, d| {
                    moves.push((r, d));
                    Ok::<u64, ()>(1)
                })
                .expect("moves");
        }
        assert!(
            !moves.contains(&(Role::Reference, crate::names::Direction::Offload)),
            "{moves:?}"
        );
        assert!(
            moves.contains(&(Role::ActorTrain, crate::names::Direction::Offload)),
            "{moves:?}"
        );
        // Too big on its own node: that node's device is named.
        let mut big = p;
        big.slots[1].bytes_per_worker = 120 << 20;
        let err = big.on_nodes(&nodes).expect_err("too big for node b");
        assert_eq!((err.device, err.node.as_deref()), (0, Some("b")));
        assert!(
            err.to_string().contains("device 0 of node b has 100.0 MiB"),
            "{err}"
        );
    }

    #[test]
    fn a_worker_spread_over_devices_splits_its_bytes() {
        let s = RoleSlot {
            role: Role::ActorInfer,
            node: None,
            devices: vec![0, 1, 2, 3],
            workers: 2,
            bytes_per_worker: 101,
        };
        assert_eq!(s.bytes_per_device(), 51);
    }

    #[test]
    fn reward_workers_sharing_a_device_each_count_their_judge() {
        // Three judge replicas of 10 bytes on two devices: two share one of them.
        let s = RoleSlot {
            role: Role::Reward,
            node: None,
            devices: vec![0, 1],
            workers: 3,
            bytes_per_worker: 10,
        };
        assert_eq!(s.bytes_per_device(), 20);
    }

    #[test]
    fn judges_are_resident_while_generating_and_offloaded_for_colocated_training() {
        let slots = vec![
            slot(Role::ActorTrain, &[0], 60),
            slot(Role::ActorInfer, &[0], 30),
            slot(Role::Reward, &[0], 30),
        ];
        let p = Placement::new(1, 100 << 20, slots.clone(), false).expect("fits");
        let generate: Vec<Role> = p.phase_roles(Phase::Generate).map(|s| s.role).collect();
        assert_eq!(generate, [Role::ActorInfer, Role::Reward]);
        let mut ledger = super::super::Ledger::new(p);
        ledger
            .enter(Phase::Generate, |_, _| Ok::<u64, ()>(0))
            .expect("placed");
        let moves = ledger.plan(Phase::Train);
        assert!(moves.contains(&(Role::Reward, super::super::Direction::Offload)));
        // Asynchronously the rollout scores beside training: the judge never leaves, so 60 + 30
        // + 30 must fit at once.
        let err = Placement::new(1, 100 << 20, slots, true).expect_err("120 MiB resident");
        assert_eq!((err.phase, err.needed), (Phase::Train, 120 << 20));
    }

    /// A distillation stage's student and teacher on one device need the larger of the two, not
    /// their sum: the `teach` phase holds the teacher alone and `train` actor_train alone.
    #[test]
    fn a_distillation_stage_time_shares_the_teacher_and_the_student() {
        let cfg = crate::model::config::tests::tiny(crate::model::Arch::Qwen2);
        let workers = WorkersConfig::default();
        let (student, teacher) = (
            estimate_bytes(Role::ActorTrain, &cfg, 4, 0),
            estimate_bytes(Role::Teacher, &cfg, 4, 0),
        );
        let p = Placement::for_distill(&workers, &cfg, &cfg, 4, student).expect("the larger fits");
        let roles = |phase| p.phase_roles(phase).map(|s| s.role).collect::<Vec<_>>();
        assert_eq!(roles(Phase::Teach), [Role::Teacher]);
        assert_eq!(roles(Phase::Train), [Role::ActorTrain]);
        assert!(roles(Phase::Generate).is_empty());
        let mut ledger = super::super::Ledger::new(p);
        for phase in [Phase::Teach, Phase::Train] {
            ledger.enter(phase, |_, _| Ok::<u64, ()>(1)).expect("moves");
        }
        assert_eq!(
            ledger.plan(Phase::Teach),
            [
                (Role::ActorTrain, super::super::Direction::Offload),
                (Role::Teacher, super::super::Direction::Reload)
            ]
        );
        let err = Placement::for_distill(&workers, &cfg, &cfg, 4, student - 1)
            .expect_err("the student alone is too large");
        assert_eq!((err.phase, err.needed), (Phase::Train, student));
        // `workers.teacher.memory_mb` replaces the teacher's estimate.
        let mut big = workers.clone();
        big.teacher.memory_mb = Some(((student + teacher) >> 20) as f64 + 1.0);
        let err = Placement::for_distill(&big, &cfg, &cfg, 4, student + teacher)
            .expect_err("the teacher's stated memory is too large");
        assert_eq!((err.phase, err.parts[0].0), (Phase::Teach, Role::Teacher));
    }

    /// An RL run's on-policy distillation teachers are one teacher role of all their weights,
    /// resident while training beside actor_train.
    #[test]
    fn on_policy_teachers_train_beside_the_student() {
        let cfg = crate::model::config::tests::tiny(crate::model::Arch::Qwen2);
        let run: crate::config::RunConfig = crate::config::load::from_yaml_str(
            "name: t\nmodel: { init: { arch: qwen2, hidden: 32, layers: 2, heads: 4, kv_heads: 2, \
             intermediate: 64, chars: \"0\" } }\n\
             data: { domains: [ { name: d, synthetic: { task: addition, count: 1 }, reward: exact_match } ] }\n\
             rl: { steps: 1, prompts_per_step: 2, group_size: 4, kl: { mode: none } }\n",
            "<test>",
        )
        .expect("config");
        let rl = run.rl.expect("rl");
        let teacher = estimate_bytes(Role::Teacher, &cfg, 4, 0);
        let p = Placement::for_run(
            &WorkersConfig::default(),
            &rl,
            &cfg,
            4,
            (&[], &[cfg.clone(), cfg.clone()]),
            u64::MAX,
        )
        .expect("fits");
        let slot = p.slot(Role::Teacher).expect("a teacher slot");
        assert_eq!(slot.bytes_per_worker, 2 * teacher);
        let train: Vec<Role> = p.phase_roles(Phase::Train).map(|s| s.role).collect();
        assert_eq!(train, [Role::ActorTrain, Role::Teacher]);
        assert!(!p.needed_in(Role::Teacher, Phase::Generate));
    }

    #[test]
    fn estimates_follow_the_model_shape() {
        let cfg = crate::model::config::tests::tiny(crate::model::Arch::Qwen2);
        let params: u64 = expected_tensors(&cfg)
            .iter()
            .map(|(_, s, _)| s.iter().product::<usize>() as u64)
            .sum();
        assert_eq!(estimate_bytes(Role::Reference, &cfg, 4, 8), params * 4);
        assert_eq!(estimate_bytes(Role::ActorTrain, &cfg, 4, 8), params * 16);
        // bf16: weights 2 + gradients 2 + moments 8 + the f32 master 4 bytes a parameter.
        assert_eq!(estimate_bytes(Role::ActorTrain, &cfg, 2, 8), params * 16);
        assert_eq!(estimate_bytes(Role::Reference, &cfg, 2, 8), params * 2);
        let kv = 8
            * cfg.max_position_embeddings
            * 2
            * cfg.num_hidden_layers
            * cfg.num_key_value_heads
            * cfg.head_dim
            * 4;
        assert_eq!(
            estimate_bytes(Role::ActorInfer, &cfg, 4, 8),
            params * 4 + kv as u64
        );
    }
}
