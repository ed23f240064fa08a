//! The per-device memory ledger of a run, rebuilt from its offload/reload events: which role held
//! how many bytes on each device, and every transition. The workbench draws it; the memory-creep
//! rule of [`super`] reads it.
//!
//! Rules. A transfer event names a role (`role`), its devices (`device`: "0" or "0,1") and the bytes
//! it copied for the whole role; each device is charged an even share. A reload sets the role's
//! bytes on the device, an offload clears them. A role's first placement copies nothing and is not
//! recorded, so a role first seen offloading is taken to have been resident since the phase before
//! (the previous batch of transfers, told apart by their `phase`), or since the start when there was
//! none.

use std::collections::BTreeMap;

use crate::config::Role;
use crate::store::reads::StoredEvent;
use crate::store::records::EventKind;

/// Where a role sorts among the roles (the order of [`Role::ALL`]; unknown roles last).
pub fn role_rank(role: &str) -> usize {
    Role::ALL
        .iter()
        .position(|r| r.as_str() == role)
        .unwrap_or(Role::ALL.len())
}

/// One offload or reload as one device saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    pub at: i64,
    pub role: String,
    pub reload: bool,
    /// This device's share of the bytes moved.
    pub bytes: u64,
    /// The bytes the whole transfer moved (all its devices).
    pub total_bytes: u64,
    pub seconds: f64,
    /// All the devices of the transfer, as recorded ("0,1").
    pub devices: String,
    /// Bytes resident on this device right after the transition.
    pub resident_after: u64,
}

/// A role's stay on a device: from, to (`None`: still there), bytes.
type Stay = (i64, Option<i64>, u64);

/// One device's ledger as of a time.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceLedger {
    pub device: String,
    /// Bytes each role holds on the device now; roles seen but offloaded hold 0.
    pub resident: BTreeMap<String, u64>,
    /// Roles resident before their first recorded event: since when, with how many bytes.
    pub initial: Vec<(String, i64, u64)>,
    /// Oldest first.
    pub transitions: Vec<Transition>,
}

impl DeviceLedger {
    pub fn total(&self) -> u64 {
        self.resident.values().sum()
    }

    /// The roles seen on the device, in role order.
    pub fn roles(&self) -> Vec<&str> {
        let mut roles: Vec<&str> = self.resident.keys().map(String::as_str).collect();
        roles.sort_by_key(|r| (role_rank(r), *r));
        roles
    }

    /// Each role's resident intervals `[from, to)` (to = `None`: still resident), and its bytes.
    pub(crate) fn intervals(&self) -> BTreeMap<&str, Vec<Stay>> {
        let mut out: BTreeMap<&str, Vec<Stay>> = BTreeMap::new();
        for (role, since, bytes) in &self.initial {
            out.entry(role).or_default().push((*since, None, *bytes));
        }
        for t in &self.transitions {
            let spans = out.entry(t.role.as_str()).or_default();
            if let Some(open) = spans.last_mut().filter(|s| s.1.is_none()) {
                open.1 = Some(t.at);
            }
            if t.reload {
                spans.push((t.at, None, t.bytes));
            }
        }
        out
    }
}

/// The ledgers of every device that offload/reload events name, as of `until_ms`, by device name
/// (numerically when they are numbers).
pub fn ledgers(events: &[StoredEvent], start_ms: i64, until_ms: Option<i64>) -> Vec<DeviceLedger> {
    let transfers: Vec<&StoredEvent> = events
        .iter()
        .filter(|e| until_ms.is_none_or(|u| e.at <= u))
        .filter(|e| matches!(e.event.kind, EventKind::Offload | EventKind::Reload))
        .collect();
    // For each transfer, when the batch of transfers before its own ended (the start if none).
    let mut previous_batch_end = start_ms;
    let mut before = Vec::with_capacity(transfers.len());
    for (i, e) in transfers.iter().enumerate() {
        // The transfers of one phase entry share the phase.
        if i > 0 && e.event.phase != transfers[i - 1].event.phase {
            previous_batch_end = transfers[i - 1].at;
        }
        before.push(previous_batch_end);
    }
    let mut out: BTreeMap<String, DeviceLedger> = BTreeMap::new();
    for (e, since) in transfers.iter().zip(before) {
        let r = &e.event;
        let role = r.role.clone().unwrap_or_else(|| "?".into());
        let devices_text = r.device.clone().unwrap_or_default();
        let devices: Vec<&str> = devices_text
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .collect();
        let total = r.bytes.unwrap_or(0);
        let n = devices.len() as u64;
        for (k, device) in devices.iter().enumerate() {
            // An even share; the remainder goes to the first devices so the shares add up.
            let share = total / n + u64::from((k as u64) < total % n);
            let ledger = out
                .entry((*device).to_string())
                .or_insert_with(|| DeviceLedger {
                    device: (*device).to_string(),
                    resident: BTreeMap::new(),
                    initial: vec![],
                    transitions: vec![],
                });
            let reload = r.kind == EventKind::Reload;
            if !reload && !ledger.resident.contains_key(&role) {
                ledger.initial.push((role.clone(), since, share));
            }
            ledger
                .resident
                .insert(role.clone(), if reload { share } else { 0 });
            let resident_after = ledger.total();
            ledger.transitions.push(Transition {
                at: e.at,
                role: role.clone(),
                reload,
                bytes: share,
                total_bytes: total,
                seconds: r.duration_s.unwrap_or(0.0),
                devices: devices_text.clone(),
                resident_after,
            });
        }
    }
    let mut ledgers: Vec<DeviceLedger> = out.into_values().collect();
    ledgers.sort_by(|a, b| {
        let num = |d: &str| d.parse::<u64>().ok();
        (num(&a.device), &a.device).cmp(&(num(&b.device), &b.device))
    });
    ledgers
}
