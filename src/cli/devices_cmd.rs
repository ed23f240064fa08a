//! `roll-tui devices [--check]`: the devices this machine offers a run, and (`--check`) whether
//! each GPU computes what the CPU computes.

use anyhow::{Result, bail};

use crate::device::{self, CUDA_BUILT};
use crate::text::human_bytes;

pub fn devices(check: bool) -> Result<i32> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "cpu      {cores} cores, {} of memory (workers.devices.kind: cpu: virtual devices sharing it); kernels {}",
        human_bytes(device::host_memory_bytes()),
        device::kernels().as_str()
    );
    let gpus = match device::cuda_devices() {
        Ok(list) => list,
        Err(e) => {
            println!("cuda     none: {e}");
            if check {
                bail!("no CUDA device to check");
            }
            return Ok(0);
        }
    };
    if gpus.is_empty() {
        println!("cuda     none: the driver reports no device");
    }
    for (info, mem) in &gpus {
        println!(
            "cuda:{:<3} {}, {} free of {}",
            info.index,
            info.name,
            human_bytes(mem.free_bytes),
            human_bytes(mem.total_bytes)
        );
    }
    if !check {
        return Ok(0);
    }
    if gpus.is_empty() || !CUDA_BUILT {
        bail!("no CUDA device to check");
    }
    #[cfg(feature = "cuda")]
    {
        let mut failed = 0;
        for (info, _) in &gpus {
            failed += super::device_check::check(device::DeviceSpec::cuda(info.index))?;
        }
        if failed > 0 {
            println!("{failed} check(s) failed");
            return Ok(1);
        }
        println!("every check passed");
    }
    Ok(0)
}
