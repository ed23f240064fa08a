//! The per-device residency ledger: which roles are on their devices now, and the offload/reload
//! orders that bring the roles of the next phase onto them.
//!
//! Entering a phase first offloads every resident role the phase does not need that shares a device
//! with a role it does need (time-sharing), then reloads the needed roles that are not resident.
//! Offloads come first so that a device never holds both sets at once.

use std::time::Instant;

use super::placement::Placement;
use crate::names::{Direction, Phase, Role, Transfer};

#[derive(Debug, Clone)]
pub struct Ledger {
    placement: Placement,
    resident: Vec<Role>,
}

impl Ledger {
    /// Models start in host memory: nothing is resident until the first phase places it.
    pub fn new(placement: Placement) -> Ledger {
        Ledger {
            placement,
            resident: vec![],
        }
    }

    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    pub fn is_resident(&self, role: Role) -> bool {
        self.resident.contains(&role)
    }

    /// Bytes the ledger counts on `device` of `node` (`None`: the head's machine) now.
    pub fn resident_bytes(&self, node: Option<&str>, device: usize) -> u64 {
        self.placement
            .slots
            .iter()
            .filter(|s| {
                self.resident.contains(&s.role)
                    && s.node.as_deref() == node
                    && s.devices.contains(&device)
            })
            .map(|s| s.bytes_per_device())
            .sum()
    }

    /// The moves that enter `phase`, offloads first.
    pub fn plan(&self, phase: Phase) -> Vec<(Role, Direction)> {
        let p = &self.placement;
        let needed: Vec<Role> = p.phase_roles(phase).map(|s| s.role).collect();
        let offloads = self
            .resident
            .iter()
            .filter(|r| !needed.contains(r) && needed.iter().any(|n| p.colocated(**r, *n)));
        let reloads = needed.iter().filter(|r| !self.resident.contains(r));
        offloads
            .map(|r| (*r, Direction::Offload))
            .chain(reloads.map(|r| (*r, Direction::Reload)))
            .collect()
    }

    /// Carry out the moves into `phase` through `mover`, which moves one role's state and returns
    /// the bytes it copied (0 when there was nothing to copy, as on a role's first placement).
    /// Returns the moves that copied bytes, timed.
    pub fn enter<E>(
        &mut self,
        phase: Phase,
        mut mover: impl FnMut(Role, Direction) -> Result<u64, E>,
    ) -> Result<Vec<Transfer>, E> {
        let mut done = vec![];
        for (role, direction) in self.plan(phase) {
            let t0 = Instant::now();
            let bytes = mover(role, direction)?;
            let seconds = t0.elapsed().as_secs_f64();
            match direction {
                Direction::Offload => self.resident.retain(|r| *r != role),
                Direction::Reload => self.resident.push(role),
            }
            if bytes > 0 {
                done.push(Transfer {
                    role,
                    direction,
                    phase,
                    devices: self
                        .placement
                        .slot(role)
                        .map(|s| s.devices.clone())
                        .unwrap_or_default(),
                    bytes,
                    seconds,
                    memory: vec![],
                });
            }
        }
        debug_assert!(
            self.placement.slots.iter().all(|s| {
                (0..self.placement.device_count).all(|d| {
                    self.resident_bytes(s.node.as_deref(), d) <= self.placement.memory_per_device
                })
            }),
            "the placement check admitted a phase that overflows a device"
        );
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::super::placement::RoleSlot;
    use super::*;

    fn ledger(infer_devices: &[usize], async_rollout: bool) -> Ledger {
        let slot = |role, devices: &[usize], mib: u64| RoleSlot {
            role,
            node: None,
            devices: devices.to_vec(),
            workers: 1,
            bytes_per_worker: mib << 20,
        };
        Ledger::new(
            Placement::new(
                2,
                100 << 20,
                vec![
                    slot(Role::ActorTrain, &[0], 60),
                    slot(Role::Reference, &[0], 20),
                    slot(Role::ActorInfer, infer_devices, 40),
                ],
                async_rollout,
            )
            .expect("fits"),
        )
    }

    fn run(l: &mut Ledger, phase: Phase) -> Vec<(Role, Direction)> {
        let mut moves = vec![];
        l.enter(phase, |r, d| {
            moves.push((r, d));
            Ok::<u64, ()>(1)
        })
        .expect("moves");
        moves
    }

    #[test]
    fn colocated_phases_alternate_offload_then_reload() {
        use Direction::*;
        let mut l = ledger(&[0], false);
        assert_eq!(run(&mut l, Phase::Generate), [(Role::ActorInfer, Reload)]);
        assert_eq!(l.resident_bytes(None, 0), 40 << 20);
        assert_eq!(
            run(&mut l, Phase::Train),
            [
                (Role::ActorInfer, Offload),
                (Role::ActorTrain, Reload),
                (Role::Reference, Reload)
            ]
        );
        assert_eq!(l.resident_bytes(None, 0), 80 << 20);
        assert_eq!(
            run(&mut l, Phase::Generate),
            [
                (Role::ActorTrain, Offload),
                (Role::Reference, Offload),
                (Role::ActorInfer, Reload)
            ]
        );
        // Entering the phase it is already in moves nothing.
        assert!(run(&mut l, Phase::Generate).is_empty());
    }

    #[test]
    fn separate_devices_never_offload() {
        let mut l = ledger(&[1], false);
        run(&mut l, Phase::Generate);
        run(&mut l, Phase::Train);
        assert!(run(&mut l, Phase::Generate).is_empty());
        assert!(run(&mut l, Phase::Train).is_empty());
        assert_eq!(
            (l.resident_bytes(None, 0), l.resident_bytes(None, 1)),
            (80 << 20, 40 << 20)
        );
    }

    #[test]
    fn moves_that_copy_nothing_are_not_reported_and_errors_stop_the_phase() {
        let mut l = ledger(&[0], false);
        let done = l
            .enter(Phase::Generate, |_, _| Ok::<u64, ()>(0))
            .expect("ok");
        assert!(done.is_empty() && l.is_resident(Role::ActorInfer));
        let err = l.enter(Phase::Train, |_, _| Err("disk full"));
        assert_eq!(err, Err("disk full"));
    }
}
