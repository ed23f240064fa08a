//! The device seam: the one module that turns a configured device (`workers.devices` and a
//! role's `device_mapping`, or a command's `--device`) into a candle [`Device`], reads a device's
//! memory, and decides which kernels compute on it.
//!
//! Two kinds of tensor exist and every site says which it makes: compute tensors live on the
//! device a role was placed on ([`open`] of its [`DeviceSpec`]); host tensors (files read before
//! they move, shared-memory host copies, step files, staging) live in host memory ([`host`]).
//! No other code names candle's CPU device outside tests: `tests/device_seam.rs` guards that, so a
//! tensor never lands on the CPU by accident on a GPU run.
//!
//! Kernels: on the CPU in f32 the engine runs our fused kernels (`kernels/cpu`) behind their
//! `applies()` checks; every other device runs candle's device-generic ops. [`use_kernels`] with
//! [`Kernels::Generic`] (config `workers.devices.kernels: generic`, or `ROLL_KERNELS=generic` for
//! any command) turns the fused kernels off for the whole process, so that the generic path — the
//! code a GPU runs — is exercised and tested on a machine without one (`tests/generic_path.rs`).
//! Worker processes inherit the choice through [`worker_env`].
//!
//! Must not know about configs, roles, runs or the store: callers pass what to open.

#[cfg(feature = "cuda")]
mod cuda;
#[cfg(feature = "cuda")]
mod ipc;
#[cfg(feature = "cuda")]
mod pinned;
mod transfer;

use std::fmt;
use std::str::FromStr;

use candle_core::Device;
use serde::{Deserialize, Serialize};

#[cfg(feature = "cuda")]
pub use transfer::pinned_memcpy_seconds;
pub use transfer::{
    IpcHandle, IpcStage, Moved, Way, forget_pinned, ipc_close, ipc_receive, move_pinned,
    pinned_bytes_moved,
};

/// What the devices are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    /// Virtual devices on this machine's CPU and memory.
    #[default]
    Cpu,
    /// NVIDIA GPUs through CUDA (a build with `--features cuda`).
    Cuda,
}

impl DeviceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        }
    }
}

/// Which implementation computes the model (`workers.devices.kernels`, `ROLL_KERNELS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Kernels {
    /// Our fused CPU kernels where they apply (f32 on the CPU), candle's device-generic ops
    /// everywhere else (every CUDA device).
    #[default]
    Auto,
    /// candle's device-generic ops everywhere, the CPU included: the path a GPU runs, for
    /// debugging and testing it on a machine without one (several times slower on the CPU).
    Generic,
}

impl Kernels {
    pub fn as_str(self) -> &'static str {
        match self {
            Kernels::Auto => "auto",
            Kernels::Generic => "generic",
        }
    }
}

/// Whether this executable was built with CUDA (`--features cuda`).
pub const CUDA_BUILT: bool = cfg!(feature = "cuda");

/// What to say where CUDA is asked of a build without it.
pub const NOT_BUILT: &str = "this roll-tui was built without CUDA: build it with \
    `cargo build --release --features cuda` (the toolkit: `kernels/cuda/toolkit.sh`, README \
    section GPU), or compute on the CPU (`workers.devices.kind: cpu`, `ROLL_DEVICE=cpu`)";

/// The environment variable that picks the kernels of any roll-tui process (`auto` or `generic`).
pub const KERNELS_ENV: &str = "ROLL_KERNELS";

/// One device: the CPU, or the CUDA device of an ordinal. Sent to worker processes, which open it
/// themselves ([`open`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DeviceSpec {
    pub kind: DeviceKind,
    /// The CUDA ordinal (`cuda:N`); 0 for the CPU.
    pub index: usize,
}

impl DeviceSpec {
    pub const CPU: DeviceSpec = DeviceSpec {
        kind: DeviceKind::Cpu,
        index: 0,
    };

    pub fn cuda(index: usize) -> DeviceSpec {
        DeviceSpec {
            kind: DeviceKind::Cuda,
            index,
        }
    }

    /// Device `index` of a run's devices of `kind`: for `cpu` every virtual device computes on
    /// the one CPU; for `cuda` device i is `cuda:i`.
    pub fn of(kind: DeviceKind, index: usize) -> DeviceSpec {
        match kind {
            DeviceKind::Cpu => DeviceSpec::CPU,
            DeviceKind::Cuda => DeviceSpec::cuda(index),
        }
    }
}

impl Default for DeviceSpec {
    fn default() -> Self {
        DeviceSpec::CPU
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            DeviceKind::Cpu => f.write_str("cpu"),
            DeviceKind::Cuda => write!(f, "cuda:{}", self.index),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = DeviceError;

    /// `cpu`, `cuda` (= `cuda:0`) or `cuda:N`.
    fn from_str(s: &str) -> Result<Self, DeviceError> {
        let bad = || DeviceError::Unknown(s.to_string());
        match s.trim() {
            "cpu" => Ok(DeviceSpec::CPU),
            "cuda" => Ok(DeviceSpec::cuda(0)),
            t => {
                let n = t.strip_prefix("cuda:").ok_or_else(bad)?;
                n.parse().map(DeviceSpec::cuda).map_err(|_| bad())
            }
        }
    }
}

/// Why a device could not be opened or read. Every variant names the device.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("unknown device '{0}': expected cpu, cuda or cuda:N")]
    Unknown(String),
    #[error("device '{0}': {NOT_BUILT}")]
    NotBuilt(DeviceSpec),
    /// The driver library is absent, or the driver does not start (no GPU, a stub library).
    #[error(
        "device '{device}': no usable CUDA driver: {detail}; a GPU run needs an NVIDIA driver and \
         a visible GPU (check `nvidia-smi`), and a build linked against the driver stub of \
         kernels/cuda/toolkit.sh ends here on a machine without them"
    )]
    NoDriver { device: DeviceSpec, detail: String },
    #[error("device '{device}' does not exist: this machine has {}", list_devices(.present))]
    NoSuchDevice {
        device: DeviceSpec,
        present: Vec<CudaDeviceInfo>,
    },
    #[error("device '{device}': {message}")]
    Driver { device: DeviceSpec, message: String },
    #[error(
        "{}={value:?} is not a kernel choice: expected auto or generic",
        KERNELS_ENV
    )]
    KernelsEnv { value: String },
}

/// One CUDA device as the driver describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaDeviceInfo {
    pub index: usize,
    pub name: String,
    pub total_bytes: u64,
}

fn list_devices(present: &[CudaDeviceInfo]) -> String {
    if present.is_empty() {
        return "no CUDA devices".into();
    }
    let each: Vec<String> = present
        .iter()
        .map(|d| {
            format!(
                "cuda:{} ({}, {})",
                d.index,
                d.name,
                crate::text::human_bytes(d.total_bytes)
            )
        })
        .collect();
    format!("{} CUDA device(s): {}", present.len(), each.join(", "))
}

/// A device's memory as its driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    pub free_bytes: u64,
    pub total_bytes: u64,
}

/// The environment variable naming the device of single-process commands (`cpu` unless set).
pub const DEVICE_ENV: &str = "ROLL_DEVICE";

/// The device that commands outside a run compute on (`model score`, `env debug` with a model
/// policy, `reward score` with a judge, the judges of a reward worker): `ROLL_DEVICE`
/// (`cpu`, `cuda`, `cuda:N`), the CPU unless it is set.
pub fn tool_device() -> Result<Device, DeviceError> {
    match std::env::var(DEVICE_ENV) {
        Ok(name) if !name.trim().is_empty() => open(name.parse()?),
        _ => Ok(Device::Cpu),
    }
}

/// This machine's memory in bytes (`MemTotal`; 16 GiB where /proc/meminfo cannot be read).
pub fn host_memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(16 << 30)
}

/// Host memory: where files are read before their tensors move, and where host copies live.
pub fn host() -> Device {
    Device::Cpu
}

/// The candle device a spec names, with a clear error where it cannot be had.
pub fn open(spec: DeviceSpec) -> Result<Device, DeviceError> {
    match spec.kind {
        DeviceKind::Cpu => Ok(Device::Cpu),
        DeviceKind::Cuda => open_cuda(spec),
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(spec: DeviceSpec) -> Result<Device, DeviceError> {
    cuda::open(spec)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(spec: DeviceSpec) -> Result<Device, DeviceError> {
    Err(DeviceError::NotBuilt(spec))
}

/// The driver's free and total memory of a device; `None` for the CPU, whose devices are virtual
/// budgets (`workers.devices.memory_mb`).
pub fn memory(spec: DeviceSpec) -> Result<Option<MemoryInfo>, DeviceError> {
    match spec.kind {
        DeviceKind::Cpu => Ok(None),
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => cuda::memory(spec).map(Some),
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Cuda => Err(DeviceError::NotBuilt(spec)),
    }
}

/// The CUDA devices of this machine as the driver lists them (with their free memory), or why
/// there are none to list.
pub fn cuda_devices() -> Result<Vec<(CudaDeviceInfo, MemoryInfo)>, DeviceError> {
    #[cfg(feature = "cuda")]
    {
        let present = cuda::devices(DeviceSpec::cuda(0))?;
        present
            .into_iter()
            .map(|d| Ok((d.clone(), cuda::memory(DeviceSpec::cuda(d.index))?)))
            .collect()
    }
    #[cfg(not(feature = "cuda"))]
    Err(DeviceError::NotBuilt(DeviceSpec::cuda(0)))
}

/// The driver's free and total memory of a device candle already opened; `None` for the CPU.
pub fn memory_of(device: &Device) -> Result<Option<MemoryInfo>, DeviceError> {
    match device {
        Device::Cpu => Ok(None),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => cuda::memory_of(device, spec_of(device)).map(Some),
        _ => Ok(None),
    }
}

/// Give the memory a GPU's allocator holds for reuse back to the driver, after the device's work
/// is done (see `cuda::trim`): what an offload freed is then free for other processes and in the
/// driver's figures. Nothing to do on the CPU.
pub fn trim(device: &Device) -> Result<(), DeviceError> {
    match device {
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => cuda::trim(device, spec_of(device)),
        _ => Ok(()),
    }
}

/// The spec of a device candle already opened.
pub fn spec_of(device: &Device) -> DeviceSpec {
    match device.location() {
        candle_core::DeviceLocation::Cuda { gpu_id } => DeviceSpec::cuda(gpu_id),
        _ => DeviceSpec::CPU,
    }
}

/// Turn the fused CPU kernels on (`Auto`) or off (`Generic`) for this process. Call it before
/// any model is built; worker processes get the same choice through [`worker_env`].
pub fn use_kernels(kernels: Kernels) {
    roll_cpu_kernels::set_enabled(kernels == Kernels::Auto);
}

/// The kernels this process runs.
pub fn kernels() -> Kernels {
    if roll_cpu_kernels::enabled() {
        Kernels::Auto
    } else {
        Kernels::Generic
    }
}

/// Apply `ROLL_KERNELS` if it is set (every roll-tui process does at start).
pub fn use_kernels_from_env() -> Result<(), DeviceError> {
    match std::env::var(KERNELS_ENV) {
        Ok(value) => {
            use_kernels(parse_kernels(&value)?);
            Ok(())
        }
        Err(_) => Ok(()),
    }
}

fn parse_kernels(value: &str) -> Result<Kernels, DeviceError> {
    match value.trim() {
        "auto" | "" => Ok(Kernels::Auto),
        "generic" => Ok(Kernels::Generic),
        _ => Err(DeviceError::KernelsEnv {
            value: value.to_string(),
        }),
    }
}

/// The environment a worker process needs to compute as this one does.
pub fn worker_env() -> Vec<(&'static str, &'static str)> {
    vec![(KERNELS_ENV, kernels().as_str())]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_parse_and_print_back() {
        for (text, spec) in [
            ("cpu", DeviceSpec::CPU),
            ("cuda", DeviceSpec::cuda(0)),
            ("cuda:3", DeviceSpec::cuda(3)),
        ] {
            assert_eq!(text.parse::<DeviceSpec>().unwrap(), spec);
        }
        assert_eq!(DeviceSpec::cuda(3).to_string(), "cuda:3");
        assert_eq!(DeviceSpec::CPU.to_string(), "cpu");
        for bad in ["gpu", "cuda:x", "cuda:-1", "cuda3"] {
            let e = bad.parse::<DeviceSpec>().unwrap_err().to_string();
            assert_eq!(
                e,
                format!("unknown device '{bad}': expected cpu, cuda or cuda:N")
            );
        }
        // Virtual CPU devices all compute on the one CPU.
        assert_eq!(DeviceSpec::of(DeviceKind::Cpu, 5), DeviceSpec::CPU);
        assert_eq!(DeviceSpec::of(DeviceKind::Cuda, 5), DeviceSpec::cuda(5));
    }

    #[test]
    fn kernel_choices_parse_and_bad_ones_are_named() {
        assert_eq!(parse_kernels("generic").unwrap(), Kernels::Generic);
        assert_eq!(parse_kernels("auto").unwrap(), Kernels::Auto);
        assert_eq!(
            parse_kernels("fast").unwrap_err().to_string(),
            "ROLL_KERNELS=\"fast\" is not a kernel choice: expected auto or generic"
        );
    }

    #[test]
    fn missing_cuda_devices_are_listed() {
        let e = DeviceError::NoSuchDevice {
            device: DeviceSpec::cuda(3),
            present: vec![CudaDeviceInfo {
                index: 0,
                name: "NVIDIA H200".into(),
                total_bytes: 140 << 30,
            }],
        };
        assert_eq!(
            e.to_string(),
            "device 'cuda:3' does not exist: this machine has 1 CUDA device(s): cuda:0 (NVIDIA H200, 140.0 GiB)"
        );
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_in_a_cpu_build_says_how_to_get_it() {
        let e = open(DeviceSpec::cuda(0)).unwrap_err().to_string();
        assert!(
            e.starts_with("device 'cuda:0': this roll-tui was built without CUDA")
                && e.contains("--features cuda"),
            "{e}"
        );
        assert!(open(DeviceSpec::CPU).unwrap().is_cpu());
    }
}
