//! Time-sharing the devices between the roles of a stage (RL, or distillation's teacher and student): before each phase the ledger orders offloads and
//! reloads, which copy a role's tensors (weights, and for trainable roles the AdamW moments) to its
//! host copy and back; weight sync moves the trained policy to actor_infer.
//!
//! On CPU, device and host memory are the same RAM, so an offloaded role's tensors stay allocated:
//! the copies are real (and timed), the virtual devices' budgets are enforced by the placement check
//! and the ledger, and a reload really restores the state from the host copy (read into the tensors'
//! own memory; an in-process role's copy is rewritten in place, `HostArea::overwrite`). On GPUs
//! (`workers.devices.kind: cuda`) each move's event also carries every device's free memory
//! before and after it as the driver reports it, and an offload hands the allocator's freed
//! blocks back to the driver first (`device::trim`). A role in a worker process frees its GPU
//! memory when it drops its tensors; an in-process role's weights are the trainer's policy
//! mirror and stay (moving the mirror to pinned host memory is what comes next).

use std::collections::HashSet;
use std::time::Instant;

use super::{RunContext, RunError, TensorContext};
use crate::config::Role;
use crate::metrics::Metrics;
use crate::model::LoadedModel;
use crate::role::actor_infer::{Infer, PolicyUpdate};
use crate::role::reference::Reference;
use crate::role::{HostCopy, ResidentRole};
use crate::scheduler::host_copy::{HostArea, HostCopyError};
use crate::scheduler::{Direction, Ledger, Phase, Placement};

pub(super) struct TimeSharing {
    ledger: Ledger,
    area: HostArea,
    /// Roles whose host copy holds their current state.
    offloaded: HashSet<Role>,
    /// The run's GPUs by device index (none for `kind: cpu`): their driver's memory is read
    /// around every move, and an offload gives what it freed back to the driver.
    gpus: Vec<candle_core::Device>,
}

/// Each of `devices`' free memory and total (GPUs only).
fn readings(gpus: &[candle_core::Device], devices: &[usize]) -> Vec<(usize, u64, u64)> {
    devices
        .iter()
        .filter_map(|&d| {
            let m = crate::device::memory_of(gpus.get(d)?).ok()??;
            Some((d, m.free_bytes, m.total_bytes))
        })
        .collect()
}

fn copy_err(e: HostCopyError) -> RunError {
    RunError::Setup(e.to_string())
}

impl TimeSharing {
    pub fn new(
        placement: Placement,
        devices: &crate::config::DevicesConfig,
    ) -> Result<TimeSharing, RunError> {
        let area = HostArea::new().map_err(|e| {
            RunError::Setup(format!("creating the host-memory area for offloads: {e}"))
        })?;
        let gpus = match devices.kind {
            crate::device::DeviceKind::Cpu => vec![],
            crate::device::DeviceKind::Cuda => (0..devices.count)
                .map(|i| crate::device::open(crate::device::DeviceSpec::cuda(i)))
                .collect::<Result<_, _>>()?,
        };
        Ok(TimeSharing {
            ledger: Ledger::new(placement),
            area,
            offloaded: HashSet::new(),
            gpus,
        })
    }

    /// Bring the roles of `phase` onto their devices; every move is recorded as an event and its
    /// seconds are added to `time/offload` and `time/reload`. `roles` are the run's resident roles
    /// and `policy` the trainer's policy (an in-process actor_train's weights).
    pub fn enter(
        &mut self,
        phase: Phase,
        roles: &mut [&mut dyn ResidentRole],
        policy: &LoadedModel,
        ctx: &mut RunContext<'_>,
        m: &mut Metrics,
    ) -> Result<(), RunError> {
        let host = HostCopy {
            area: &self.area,
            policy,
        };
        let offloaded = &mut self.offloaded;
        let gpus = &self.gpus;
        let placement = self.ledger.placement().clone();
        let mut released = false;
        let mut move_role = |role: Role, direction: Direction| -> Result<u64, RunError> {
            // A role that was never offloaded is already where it was built.
            if direction == Direction::Reload && !offloaded.remove(&role) {
                return Ok(0);
            }
            // A role the run does not have holds nothing.
            let Some(resident) = roles.iter_mut().find(|r| r.role() == role) else {
                return Ok(0);
            };
            match direction {
                Direction::Offload => {
                    let bytes = resident.offload(&host)?;
                    offloaded.insert(role);
                    Ok(bytes)
                }
                Direction::Reload => {
                    // This process keeps freed memory a while (src/allocator.rs); a
                    // worker process coming in gets it back first. Roles in this process
                    // reuse it as it is: giving it back would only have the kernel zero
                    // it again for them (in the quickstart, 15% of its time).
                    if resident.in_worker_process() && !released {
                        crate::allocator::release_freed_memory();
                        released = true;
                    }
                    Ok(resident.reload(&host)?)
                }
            }
        };
        // (role, direction) -> each GPU's (device, free before, free after, total).
        let mut memory: Vec<(Role, Direction, Vec<crate::scheduler::DeviceReading>)> = vec![];
        let mut transfers =
            self.ledger
                .enter(phase, |role, direction| -> Result<u64, RunError> {
                    let devices = placement
                        .slot(role)
                        .map(|s| s.devices.clone())
                        .unwrap_or_default();
                    let before = readings(gpus, &devices);
                    let bytes = move_role(role, direction)?;
                    if direction == Direction::Offload {
                        for &d in &devices {
                            if let Some(gpu) = gpus.get(d) {
                                crate::device::trim(gpu)?;
                            }
                        }
                    }
                    let after = readings(gpus, &devices);
                    let paired = before
                        .iter()
                        .zip(&after)
                        .map(|(&(device, free_before, total), &(_, free_after, _))| {
                            crate::scheduler::DeviceReading {
                                device,
                                free_before,
                                free_after,
                                total,
                            }
                        })
                        .collect();
                    memory.push((role, direction, paired));
                    Ok(bytes)
                })?;
        for t in &mut transfers {
            if let Some((_, _, m)) = memory
                .iter()
                .find(|(r, d, _)| *r == t.role && *d == t.direction)
            {
                t.memory = m.clone();
            }
        }
        for t in &transfers {
            ctx.sink.transfer(t)?;
            ctx.emit(super::PipelineEvent::Transfer(t.clone()));
            *m.entry(format!("time/{}", t.direction.as_str()))
                .or_default() += t.seconds;
        }
        Ok(())
    }

    /// Send the trained weights to actor_infer: straight into its tensors when it is on its devices,
    /// into its host copy when it is offloaded (its next reload brings the new version). Returns
    /// seconds spent and the bytes sent (under LoRA the adapter's).
    pub fn sync_weights(
        &self,
        policy: &LoadedModel,
        infer: &Infer,
    ) -> Result<(f64, u64), RunError> {
        let t0 = Instant::now();
        let bytes = match infer {
            // An offloaded replica in this process takes the weights it generates with at its
            // next reload: under LoRA the adapter, kept until then; else from its host copy.
            Infer::Local { .. } if self.offloaded.contains(&Role::ActorInfer) => {
                // A copy of the adapter (kilobytes), whatever trains before the reload.
                let update = match policy.transformer.lora() {
                    Some(_) => PolicyUpdate::snapshot(policy).during("weight sync")?,
                    None => PolicyUpdate::of(policy),
                };
                let bytes = update.bytes();
                if infer.keep_for_reload(update) {
                    return Ok((t0.elapsed().as_secs_f64(), bytes));
                }
                let merged = policy
                    .transformer
                    .weights_for_inference()
                    .during("weight sync")?;
                self.area
                    .overwrite(Role::ActorInfer.as_str(), &merged.named_tensors())
                    .map_err(copy_err)?
            }
            _ => {
                let update = PolicyUpdate::of(policy);
                infer.set_weights(&update)?;
                update.bytes()
            }
        };
        Ok((t0.elapsed().as_secs_f64(), bytes))
    }

    /// `rl.kl.refresh_every`: the reference becomes the current policy — in its tensors, or in its
    /// host copy while it is offloaded.
    pub fn refresh_reference(
        &self,
        policy: &LoadedModel,
        reference: &mut Reference,
    ) -> Result<(), RunError> {
        let name = Role::Reference.as_str();
        let offloaded = self.offloaded.contains(&Role::Reference);
        reference.refresh(&policy.transformer, offloaded.then_some((&self.area, name)))
    }
}
