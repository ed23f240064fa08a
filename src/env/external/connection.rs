//! Where an external environment's requests go: a program of its own, or one instance in a
//! shared `roll-tui env serve` worker that hosts many (`workers.env.num_workers`). Requests to a
//! shared worker carry the instance's id and take turns on it (a built-in env steps in
//! microseconds). A worker that fails is stopped and replaced at its next use; the instances it
//! held learn of it because their worker's generation changed, and replay their episode into the
//! new one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value};

use super::program::Program;
use crate::env::EnvFailure;

/// Shared workers: one slot per process, each started when first needed.
pub(super) struct Workers {
    command: Vec<String>,
    slots: Vec<Mutex<Slot>>,
    next_instance: AtomicU64,
}

#[derive(Default)]
struct Slot {
    program: Option<Program>,
    /// Programs started in this slot so far: an instance opened in an older one is gone.
    generation: u64,
}

impl Workers {
    pub fn new(command: Vec<String>, count: usize) -> Arc<Workers> {
        Arc::new(Workers {
            command,
            slots: (0..count.max(1)).map(|_| Mutex::default()).collect(),
            next_instance: AtomicU64::new(0),
        })
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for slot in &mut self.slots {
            if let Ok(slot) = slot.get_mut()
                && let Some(program) = slot.program.take()
            {
                program.close();
            }
        }
    }
}

pub(super) enum Connection {
    Own(Option<Program>),
    Shared {
        workers: Arc<Workers>,
        instance: u64,
        /// The generation of its slot's program this instance was reset in, if any.
        opened: Option<u64>,
    },
}

impl Connection {
    /// A new instance on the next shared worker (round robin).
    pub fn shared(workers: &Arc<Workers>) -> Connection {
        let instance = workers.next_instance.fetch_add(1, Ordering::Relaxed);
        Connection::Shared {
            workers: Arc::clone(workers),
            instance,
            opened: None,
        }
    }

    /// A connection of the same kind for a copy: its own program, or a new shared instance.
    pub fn fresh(&self) -> Connection {
        match self {
            Connection::Own(_) => Connection::Own(None),
            Connection::Shared { workers, .. } => Connection::shared(workers),
        }
    }

    /// The program at the other end holds this environment's episode (else it must be replayed
    /// before a step).
    pub fn in_sync(&self) -> bool {
        match self {
            Connection::Own(program) => program.is_some(),
            Connection::Shared {
                workers,
                instance,
                opened,
            } => {
                let slot = &workers.slots[slot_of(workers, *instance)];
                slot.lock()
                    .is_ok_and(|s| s.program.is_some() && Some(s.generation) == *opened)
            }
        }
    }

    /// Send `request` (a shared instance adds its id) and wait for the reply; the program is
    /// started first when there is none. A failed program is stopped and dropped.
    pub fn call(
        &mut self,
        command: &[String],
        mut request: Value,
        timeout: Duration,
    ) -> Result<Map<String, Value>, EnvFailure> {
        let is_reset = request["cmd"] == "reset";
        match self {
            Connection::Own(slot) => {
                if slot.is_none() {
                    *slot = Some(Program::spawn(command)?);
                }
                let program = slot.as_mut().ok_or_else(gone)?;
                let result = program.call(&request, timeout);
                if result.is_err() {
                    *slot = None;
                }
                result
            }
            Connection::Shared {
                workers,
                instance,
                opened,
            } => {
                request["instance"] = Value::from(*instance);
                let mut slot = workers.slots[slot_of(workers, *instance)]
                    .lock()
                    .map_err(|_| gone())?;
                if slot.program.is_none() {
                    slot.program = Some(Program::spawn(&workers.command)?);
                    slot.generation += 1;
                }
                let generation = slot.generation;
                let program = slot.program.as_mut().ok_or_else(gone)?;
                let result = program.call(&request, timeout);
                match &result {
                    Err(_) => slot.program = None,
                    Ok(_) if is_reset => *opened = Some(generation),
                    Ok(_) => {}
                }
                result
            }
        }
    }

    /// Stop the program because of `what` (a shared worker goes for every instance it held).
    pub fn fail(&mut self, what: &str) -> EnvFailure {
        let program = match self {
            Connection::Own(slot) => slot.take(),
            Connection::Shared {
                workers, instance, ..
            } => workers.slots[slot_of(workers, *instance)]
                .lock()
                .ok()
                .and_then(|mut s| s.program.take()),
        };
        match program {
            Some(mut p) => p.fail(what),
            None => EnvFailure(format!("external env {what}")),
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        match self {
            Connection::Own(slot) => {
                if let Some(program) = slot.take() {
                    program.close();
                }
            }
            // The worker goes on for the other instances; this one's state is freed there.
            Connection::Shared {
                workers,
                instance,
                opened: Some(generation),
            } => {
                if let Ok(mut slot) = workers.slots[slot_of(workers, *instance)].lock()
                    && slot.generation == *generation
                    && let Some(program) = slot.program.as_mut()
                {
                    program.send(&serde_json::json!({"cmd": "close", "instance": *instance}));
                }
            }
            Connection::Shared { .. } => {}
        }
    }
}

fn slot_of(workers: &Workers, instance: u64) -> usize {
    (instance % workers.slots.len() as u64) as usize
}

fn gone() -> EnvFailure {
    EnvFailure("external env: the program is gone".into())
}
