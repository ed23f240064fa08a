//! Time-sharing the devices between the RL roles: before each phase the ledger orders offloads and
//! reloads, which copy a role's tensors (weights, and for trainable roles the AdamW moments) to its
//! host copy and back; weight sync moves the trained policy to actor_infer.
//!
//! On CPU, device and host memory are the same RAM, so an offloaded role's tensors stay allocated:
//! the copies are real (and timed), the virtual devices' budgets are enforced by the placement check
//! and the ledger, and a reload really restores the state from the host copy. Freeing device memory
//! is what the CUDA backend adds.

use std::collections::HashSet;
use std::time::Instant;

use candle_core::Tensor;

use super::actor_infer::{Infer, lock};
use super::actor_train::ActorTrain;
use super::critic::Critic;
use super::reference::Reference;
use super::{PipelineError, RunContext, TensorContext};
use crate::metrics::Metrics;
use crate::model::{LoadedModel, Transformer};
use crate::scheduler::host_copy::{HostArea, HostCopyError};
use crate::scheduler::{Direction, Ledger, Phase, Placement};
use crate::train::AdamW;
use crate::worker::Role;

/// The in-process roles whose state the ledger moves.
pub(super) struct Roles<'a> {
    pub policy: &'a LoadedModel,
    pub actor: &'a mut ActorTrain,
    pub infer: &'a Infer,
    pub reference: Option<&'a mut Reference>,
    pub critic: Option<&'a mut Critic>,
}

pub(super) struct TimeSharing {
    ledger: Ledger,
    area: HostArea,
    /// Roles whose host copy holds their current state.
    offloaded: HashSet<Role>,
}

fn copy_err(e: HostCopyError) -> PipelineError {
    PipelineError::Setup(e.to_string())
}

impl TimeSharing {
    pub fn new(placement: Placement) -> Result<TimeSharing, PipelineError> {
        let area = HostArea::new().map_err(|e| {
            PipelineError::Setup(format!("creating the host-memory area for offloads: {e}"))
        })?;
        Ok(TimeSharing {
            ledger: Ledger::new(placement),
            area,
            offloaded: HashSet::new(),
        })
    }

    /// Bring the roles of `phase` onto their devices; every move is recorded as an event and its
    /// seconds are added to `time/offload` and `time/reload`.
    pub fn enter(
        &mut self,
        phase: Phase,
        roles: &mut Roles<'_>,
        ctx: &mut RunContext<'_>,
        m: &mut Metrics,
    ) -> Result<(), PipelineError> {
        let (area, offloaded) = (&self.area, &mut self.offloaded);
        let transfers = self.ledger.enter(phase, |role, direction| {
            // A role that was never offloaded is already where it was built.
            if direction == Direction::Reload && !offloaded.remove(&role) {
                return Ok(0);
            }
            if let Some(moved) = worker_move(role, direction, roles) {
                if direction == Direction::Offload && moved.is_ok() {
                    offloaded.insert(role);
                }
                return moved;
            }
            match direction {
                Direction::Offload => {
                    let bytes = area
                        .write(role.as_str(), &role_tensors(role, roles)?)
                        .map_err(copy_err)?;
                    offloaded.insert(role);
                    Ok(bytes)
                }
                Direction::Reload => restore(area, role, roles),
            }
        })?;
        for t in &transfers {
            ctx.sink.transfer(t)?;
            *m.entry(format!("time/{}", t.direction.as_str()))
                .or_default() += t.seconds;
        }
        Ok(())
    }

    /// Send the trained weights to actor_infer: straight into its tensors when it is on its devices,
    /// into its host copy when it is offloaded (its next reload brings the new version). Returns
    /// seconds spent.
    pub fn sync_weights(&self, roles: &Roles<'_>) -> Result<f64, PipelineError> {
        let t0 = Instant::now();
        let Infer::Local(infer) = roles.infer else {
            if let Infer::Remote(r) = roles.infer {
                lock(r).set_weights(roles.policy.transformer.params())?;
            }
            return Ok(t0.elapsed().as_secs_f64());
        };
        if self.offloaded.contains(&Role::ActorInfer) {
            let tensors = named(&roles.policy.transformer);
            self.area
                .write(Role::ActorInfer.as_str(), &tensors)
                .map_err(copy_err)?;
        } else {
            infer
                .params()
                .copy_from(roles.policy.transformer.params())
                .during("weight sync")?;
        }
        Ok(t0.elapsed().as_secs_f64())
    }
}

impl TimeSharing {
    /// `rl.kl.refresh_every`: the reference becomes the current policy — in its tensors, or in its
    /// host copy while it is offloaded.
    pub fn refresh_reference(&self, roles: &mut Roles<'_>) -> Result<(), PipelineError> {
        let Some(reference) = roles.reference.as_deref_mut() else {
            return Ok(());
        };
        let name = Role::Reference.as_str();
        let offloaded = self.offloaded.contains(&Role::Reference);
        reference.refresh(
            roles.policy.transformer.params(),
            offloaded.then_some((&self.area, name)),
        )
    }
}

fn named(model: &Transformer) -> Vec<(String, Tensor)> {
    model.params().named_tensors()
}

/// A role in a worker process moves its own state through its host copy: `None` for the others.
fn worker_move(
    role: Role,
    direction: Direction,
    roles: &mut Roles<'_>,
) -> Option<Result<u64, PipelineError>> {
    let offload = direction == Direction::Offload;
    match role {
        Role::ActorInfer => match roles.infer {
            Infer::Remote(r) => Some(if offload {
                lock(r).offload()
            } else {
                lock(r).reload()
            }),
            Infer::Local(_) => None,
        },
        Role::ActorTrain => match &mut *roles.actor {
            ActorTrain::Remote(r) => Some(if offload { r.offload() } else { r.reload() }),
            ActorTrain::Local(_) => None,
        },
        Role::Reference => {
            let r = roles.reference.as_deref_mut().and_then(Reference::remote)?;
            Some(if offload { r.offload() } else { r.reload() })
        }
        Role::Critic => {
            let r = roles.critic.as_deref_mut().and_then(Critic::remote)?;
            Some(if offload { r.offload() } else { r.reload() })
        }
        Role::Reward | Role::Env => None,
    }
}

fn role_tensors(role: Role, r: &Roles<'_>) -> Result<Vec<(String, Tensor)>, PipelineError> {
    Ok(match role {
        Role::ActorTrain => match &*r.actor {
            ActorTrain::Local(opt) => opt.with_moments(named(&r.policy.transformer)),
            ActorTrain::Remote(_) => vec![], // moved by the worker itself
        },
        Role::ActorInfer => match r.infer {
            Infer::Local(t) => named(t),
            Infer::Remote(_) => vec![], // moved by the worker itself
        },
        Role::Reference => r
            .reference
            .as_deref()
            .and_then(Reference::local)
            .map(named)
            .unwrap_or_default(),
        Role::Critic => match r.critic.as_deref() {
            Some(Critic::Local(c)) => c.opt.with_moments(c.named_tensors()),
            // None, or moved by the worker itself.
            Some(Critic::Remote(_)) | None => vec![],
        },
        Role::Reward | Role::Env => vec![],
    })
}

fn restore(area: &HostArea, role: Role, r: &mut Roles<'_>) -> Result<u64, PipelineError> {
    let model_vars = |t: &Transformer| t.params().named_vars();
    match role {
        Role::ActorTrain => match &mut *r.actor {
            ActorTrain::Local(opt) => {
                let vars = model_vars(&r.policy.transformer);
                restore_trainable(area, role, &vars, opt)
            }
            ActorTrain::Remote(_) => Ok(0), // moved by the worker itself
        },
        Role::ActorInfer => match r.infer {
            Infer::Local(t) => area
                .read_into(role.as_str(), &model_vars(t))
                .map_err(copy_err),
            Infer::Remote(_) => Ok(0), // moved by the worker itself
        },
        Role::Reference => match r.reference.as_deref().and_then(Reference::local) {
            Some(t) => area
                .read_into(role.as_str(), &model_vars(t))
                .map_err(copy_err),
            None => Ok(0), // none, or moved by the worker itself
        },
        Role::Critic => match r.critic.as_deref_mut().and_then(Critic::local_mut) {
            Some(c) => restore_trainable(area, role, &c.vars(), &mut c.opt),
            None => Ok(0), // none, or moved by the worker itself
        },
        Role::Reward | Role::Env => Ok(0),
    }
}

fn restore_trainable(
    area: &HostArea,
    role: Role,
    vars: &[(String, candle_core::Var)],
    opt: &mut AdamW,
) -> Result<u64, PipelineError> {
    let device = vars
        .first()
        .map(|(_, v)| v.device().clone())
        .unwrap_or(candle_core::Device::Cpu);
    let mut tensors = area.read(role.as_str(), &device).map_err(copy_err)?;
    let missing =
        |what: &str| PipelineError::Setup(format!("host copy of {role}: {what} is missing"));
    let mut bytes = 0;
    for (name, var) in vars {
        let t = tensors
            .remove(name)
            .ok_or_else(|| missing(&format!("tensor '{name}'")))?;
        var.set(&t).during("reloading weights")?;
        bytes += (t.elem_count() * t.dtype().size_in_bytes()) as u64;
    }
    let steps = opt.steps_taken();
    bytes += opt
        .take_moments(steps, &mut tensors)
        .map_err(|e| PipelineError::Setup(format!("host copy of {role}: {e}")))?;
    Ok(bytes)
}
