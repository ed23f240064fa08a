//! Which way weight sync reaches actor_infer's worker process ([`route`]): by CUDA IPC on the
//! trainer's own GPU, else through the host copy; and the sentence that says so in the run's
//! events.

use crate::device::{DeviceKind, DeviceSpec};
use crate::metrics::{WorkerNote, WorkerNotice};
use crate::names::Role;

/// How weight sync reaches the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// The host copy in shared memory is written, and the worker reads it.
    HostCopy,
    /// Device to device through a buffer of the trainer's on their one GPU.
    CudaIpc,
}

/// The way weight sync goes from a policy computing on `policy` to a worker on `worker` (on this
/// machine or, with `elsewhere`, on a cluster's other host), and the sentence that says so in the
/// run's events.
pub fn route(
    policy: DeviceSpec,
    worker: DeviceSpec,
    lora: bool,
    elsewhere: bool,
) -> (Route, String) {
    let host = "weight sync to actor_infer goes through the host copy in shared memory";
    if lora {
        return (
            Route::HostCopy,
            format!("{host}: under LoRA only the adapter moves"),
        );
    }
    if elsewhere {
        return (
            Route::HostCopy,
            format!("{host}: the worker runs on another host"),
        );
    }
    match (policy.kind, worker.kind) {
        (DeviceKind::Cuda, DeviceKind::Cuda) if policy == worker && crate::device::CUDA_BUILT => (
            Route::CudaIpc,
            format!(
                "weight sync to actor_infer goes by CUDA IPC on {worker}, the trainer's GPU: \
                 device to device"
            ),
        ),
        (DeviceKind::Cuda, DeviceKind::Cuda) => (
            Route::HostCopy,
            format!(
                "{host}: the trainer computes on {policy} and the worker on {worker} (no \
                 GPU-to-GPU route is built: NCCL is not)"
            ),
        ),
        (DeviceKind::Cpu, DeviceKind::Cuda) => (
            Route::HostCopy,
            format!("{host}: the trainer's weights are in host memory"),
        ),
        _ => (Route::HostCopy, host.to_string()),
    }
}

/// A line for the run's events about weight sync to actor_infer's worker.
pub(super) fn note(text: String) -> WorkerNote {
    WorkerNote {
        role: Role::ActorInfer,
        index: 0,
        pid: None,
        notice: WorkerNotice::Log,
        phase: Some("weight_sync"),
        node: None,
        text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weight_sync_goes_by_cuda_ipc_only_on_the_trainers_own_gpu_on_this_host_without_lora() {
        let (cpu, gpu0, gpu1) = (DeviceSpec::CPU, DeviceSpec::cuda(0), DeviceSpec::cuda(1));
        assert_eq!(route(cpu, cpu, false, false).0, Route::HostCopy);
        let ipc = if crate::device::CUDA_BUILT {
            Route::CudaIpc
        } else {
            Route::HostCopy
        };
        let (same, said) = route(gpu0, gpu0, false, false);
        assert_eq!(same, ipc, "{said}");
        // Under LoRA the adapter moves, kilobytes: the host copy, whatever the devices.
        let (lora, said) = route(gpu0, gpu0, true, false);
        assert_eq!(lora, Route::HostCopy);
        assert!(
            said.ends_with("under LoRA only the adapter moves"),
            "{said}"
        );
        // Two GPUs: no route between them is built; the sentence names both.
        let (two, said) = route(gpu0, gpu1, false, false);
        assert_eq!(two, Route::HostCopy);
        assert!(said.contains("cuda:0") && said.contains("cuda:1"), "{said}");
        // A policy on the CPU and a worker on a GPU: the host copy.
        let (cpu_policy, said) = route(cpu, gpu0, false, false);
        assert_eq!(cpu_policy, Route::HostCopy);
        assert!(
            said.ends_with("the trainer's weights are in host memory"),
            "{said}"
        );
        // A worker on a cluster's other host cannot open a handle of this machine's GPU.
        let (remote, said) = route(gpu0, gpu0, false, true);
        assert_eq!(remote, Route::HostCopy);
        assert!(said.ends_with("the worker runs on another host"), "{said}");
    }
}
