//! CUDA devices through cudarc's driver API (`--features cuda`): the driver started, the devices
//! listed, one opened as candle's device, its memory read.
//!
//! candle links the driver library (`libcuda.so.1`) when the process starts, so a cuda build runs
//! only where one is found: the driver's on a GPU machine, the stub of `kernels/cuda/toolkit.sh`
//! elsewhere (whose every call fails, which [`devices`] reports as no usable driver). Nothing
//! here touches a device before the driver said it started.

use candle_core::Device;
use cudarc::driver::{DriverError, result};

use super::{CudaDeviceInfo, DeviceError, DeviceSpec, MemoryInfo};

/// What a driver error means, in words: its name and description where the driver has them.
fn describe(e: &DriverError) -> String {
    let name = e.error_name().map(|s| s.to_string_lossy().into_owned());
    let text = e.error_string().map(|s| s.to_string_lossy().into_owned());
    match (name, text) {
        (Ok(n), Ok(t)) => format!("{n}: {t}"),
        (Ok(n), Err(_)) => n,
        _ => format!("driver error {:?}", e.0),
    }
}

/// The CUDA devices of this machine, or why the driver could not list them.
pub fn devices(asked: DeviceSpec) -> Result<Vec<CudaDeviceInfo>, DeviceError> {
    let no_driver = |what: &str, e: DriverError| DeviceError::NoDriver {
        device: asked,
        detail: format!("{what} failed ({})", describe(&e)),
    };
    result::init().map_err(|e| no_driver("cuInit", e))?;
    let count = result::device::get_count().map_err(|e| no_driver("cuDeviceGetCount", e))?;
    let driver = |e: DriverError| DeviceError::Driver {
        device: asked,
        message: describe(&e),
    };
    (0..count.max(0))
        .map(|i| {
            let dev = result::device::get(i).map_err(driver)?;
            let name = result::device::get_name(dev).map_err(driver)?;
            // SAFETY: `dev` was just returned by cuDeviceGet for an ordinal below the count.
            #[allow(unsafe_code)]
            let total = unsafe { result::device::total_mem(dev) }.map_err(driver)?;
            Ok(CudaDeviceInfo {
                index: i as usize,
                name,
                total_bytes: total as u64,
            })
        })
        .collect()
}

/// The devices this process opened, by ordinal: candle tells devices apart by the instance (two
/// `Device::new_cuda(0)` are two devices whose tensors cannot meet), so every caller of [`open`]
/// gets the same one — one stream and one cuBLAS handle a GPU a process.
static OPENED: std::sync::Mutex<Vec<(usize, Device)>> = std::sync::Mutex::new(Vec::new());

/// candle's device for `spec`, checked against the devices present the first time.
pub fn open(spec: DeviceSpec) -> Result<Device, DeviceError> {
    let mut opened = OPENED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, d)) = opened.iter().find(|(i, _)| *i == spec.index) {
        return Ok(d.clone());
    }
    let present = devices(spec)?;
    if spec.index >= present.len() {
        return Err(DeviceError::NoSuchDevice {
            device: spec,
            present,
        });
    }
    let device = Device::new_cuda(spec.index).map_err(|e| DeviceError::Driver {
        device: spec,
        message: e.to_string(),
    })?;
    opened.push((spec.index, device.clone()));
    Ok(device)
}

/// The driver's free and total memory of the device `spec` names.
pub fn memory(spec: DeviceSpec) -> Result<MemoryInfo, DeviceError> {
    let device = open(spec)?;
    memory_of(&device, spec)
}

/// The driver's free and total memory of an opened device.
pub fn memory_of(device: &Device, spec: DeviceSpec) -> Result<MemoryInfo, DeviceError> {
    let cuda = device.as_cuda_device().map_err(|e| DeviceError::Driver {
        device: spec,
        message: e.to_string(),
    })?;
    let (free, total) =
        cuda.cuda_stream()
            .context()
            .mem_get_info()
            .map_err(|e| DeviceError::Driver {
                device: spec,
                message: describe(&e),
            })?;
    Ok(MemoryInfo {
        free_bytes: free as u64,
        total_bytes: total as u64,
    })
}

/// Wait for the device's work, then give the memory candle's allocator keeps for reuse back to
/// the driver: candle allocates from CUDA's stream-ordered pool, where freed blocks stay until
/// trimmed, so without this the driver (and every other process) would see an offload free
/// nothing.
pub fn trim(device: &Device, spec: DeviceSpec) -> Result<(), DeviceError> {
    let driver = |e: DriverError| DeviceError::Driver {
        device: spec,
        message: describe(&e),
    };
    let cuda = device.as_cuda_device().map_err(|e| DeviceError::Driver {
        device: spec,
        message: e.to_string(),
    })?;
    let stream = cuda.cuda_stream();
    stream.synchronize().map_err(driver)?;
    let context = stream.context();
    context.bind_to_thread().map_err(driver)?;
    let mut pool = std::mem::MaybeUninit::uninit();
    // SAFETY: `cu_device` is the context's own device handle and `pool` a place for the driver
    // to write the pool's handle into; the trim takes that handle as the driver gave it.
    #[allow(unsafe_code)]
    unsafe {
        cudarc::driver::sys::cuDeviceGetDefaultMemPool(pool.as_mut_ptr(), context.cu_device())
            .result()
            .map_err(driver)?;
        cudarc::driver::sys::cuMemPoolTrimTo(pool.assume_init(), 0)
            .result()
            .map_err(driver)?;
    }
    Ok(())
}
