//! `workers.devices:` — what the roles' `device_mapping` indices name. `kind: cpu` (the default)
//! makes them virtual devices with a memory budget each, so that placement and time-sharing run
//! (and are tested) as they do on GPUs; `kind: cuda` makes device i the GPU `cuda:i`, with the
//! driver's memory (capped by `memory_mb` if set). `kernels` picks the CPU's fused kernels or the
//! device-generic path that a GPU runs (see `crate::device`).

use serde::{Deserialize, Serialize};

use crate::device::{DeviceError, DeviceSpec};
pub use crate::device::{DeviceKind, Kernels};

/// Upper bound on virtual devices (the simulator goes further; a run has no use for more).
pub const MAX_DEVICES: usize = 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DevicesConfig {
    pub kind: DeviceKind,
    pub count: usize,
    /// Memory of each device in MiB. CPU: unset = this machine's memory divided among the
    /// devices. CUDA: unset = what the driver reports; set, it caps that.
    pub memory_mb: Option<f64>,
    pub kernels: Kernels,
}

impl Default for DevicesConfig {
    fn default() -> Self {
        DevicesConfig {
            kind: DeviceKind::Cpu,
            count: 1,
            memory_mb: None,
            kernels: Kernels::Auto,
        }
    }
}

impl DevicesConfig {
    /// The memory of each device that placement may fill: for `cpu` devices `memory_mb`, else
    /// this machine's memory divided among them; for `cuda` the smallest device's total as its
    /// driver reports it, capped by `memory_mb`.
    pub fn budget_bytes(&self) -> Result<u64, DeviceError> {
        let cap = self.memory_mb.map(|mb| (mb * (1u64 << 20) as f64) as u64);
        match self.kind {
            DeviceKind::Cpu => Ok(cap
                .unwrap_or_else(|| crate::device::host_memory_bytes() / self.count.max(1) as u64)),
            DeviceKind::Cuda => {
                let mut smallest = u64::MAX;
                for i in 0..self.count {
                    if let Some(m) = crate::device::memory(DeviceSpec::cuda(i))? {
                        smallest = smallest.min(m.total_bytes);
                    }
                }
                Ok(cap.map_or(smallest, |c| c.min(smallest)))
            }
        }
    }

    pub fn validate(&self, p: &mut Vec<String>) {
        if self.count == 0 || self.count > MAX_DEVICES {
            p.push(format!(
                "workers.devices.count must be in 1..={MAX_DEVICES}, got {}",
                self.count
            ));
        }
        if let Some(mb) = self.memory_mb
            && !(mb.is_finite() && mb > 0.0)
        {
            p.push(format!(
                "workers.devices.memory_mb must be a positive number of MiB, got {mb}"
            ));
        }
        if self.kind == DeviceKind::Cuda && !crate::device::CUDA_BUILT {
            p.push(format!(
                "workers.devices.kind is cuda but {}",
                crate::device::NOT_BUILT
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_in_a_build_without_it_says_how_to_get_one() {
        let d = DevicesConfig {
            kind: DeviceKind::Cuda,
            ..DevicesConfig::default()
        };
        let mut p = vec![];
        d.validate(&mut p);
        if crate::device::CUDA_BUILT {
            assert!(p.is_empty(), "{p:?}");
        } else {
            assert_eq!(p.len(), 1, "{p:?}");
            assert!(
                p[0].starts_with(
                    "workers.devices.kind is cuda but this roll-tui was built without CUDA"
                ) && p[0].contains("--features cuda"),
                "{}",
                p[0]
            );
        }
        let mut p = vec![];
        DevicesConfig::default().validate(&mut p);
        assert!(p.is_empty(), "{p:?}");
    }
}
