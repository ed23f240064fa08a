//! `roll-tui devices --check`'s host-copy moves on one GPU: a role's state offloaded into its host
//! copy and reloaded from it (`scheduler::host_copy`) by DMA through the copy's page-locked
//! mapping, bit for bit, and how fast, beside a plain page-locked `memcpy` measured in the same
//! sitting (the target: offload and reload at 70% of it or more).

use std::time::Instant;

use anyhow::{Result, anyhow};
use candle_core::{DType, Device, Tensor};

use crate::device;
use crate::parity::Finding;
use crate::scheduler::host_copy::{HostArea, read_host_copy, read_tensors, tensor_bytes};

/// A tensor's elements as bits, whatever its dtype (compared exactly: a move copies bytes).
fn bits(t: &Tensor) -> Result<Vec<u64>> {
    let host = t.to_device(&device::host())?.flatten_all()?;
    Ok(match t.dtype() {
        DType::BF16 => host
            .to_vec1::<half::bf16>()?
            .iter()
            .map(|x| u64::from(x.to_bits()))
            .collect(),
        DType::F32 => host
            .to_vec1::<f32>()?
            .iter()
            .map(|x| u64::from(x.to_bits()))
            .collect(),
        DType::U32 => host
            .to_vec1::<u32>()?
            .iter()
            .map(|x| u64::from(*x))
            .collect(),
        other => return Err(anyhow!("no bits for {other:?}")),
    })
}

fn same(what: &str, a: &[(String, Tensor)], b: &[(String, Tensor)]) -> Result<Finding> {
    let mut differ = 0usize;
    for ((name, x), (_, y)) in a.iter().zip(b) {
        let (x, y) = (bits(x)?, bits(y)?);
        if x.len() != y.len() {
            return Err(anyhow!("{what}: tensor '{name}' changed length"));
        }
        differ += x.iter().zip(&y).filter(|(p, q)| p != q).count();
    }
    Ok(Finding {
        what: format!("{what} ({differ} elements differ)"),
        ok: differ == 0,
        worst: differ as f32,
    })
}

/// Tensors of three dtypes whose byte lengths leave the file's offsets unaligned, drawn with
/// `seed`'s offset so that two sets differ in every element.
fn state(dev: &Device, seed: f64) -> Result<Vec<(String, Tensor)>> {
    let f = Tensor::randn(seed as f32, 1.0, (3, 1001), dev)?;
    let b = Tensor::randn(seed as f32, 1.0, (7, 33), dev)?.to_dtype(DType::BF16)?;
    let ids: Vec<u32> = (0..37).map(|i| i + 1000 * seed as u32).collect();
    let ids = Tensor::from_vec(ids, 37, dev)?;
    Ok(vec![
        ("w.f32".into(), f),
        ("w.bf16".into(), b),
        ("ids.u32".into(), ids),
    ])
}

/// An offload's first write (staged: the file is new), a second offload over it in place (by
/// DMA), and reloads into new and into existing tensors (by DMA), each compared bit for bit.
pub fn round_trip(dev: &Device) -> Result<Vec<Finding>> {
    let area = HostArea::new()?;
    let first = state(dev, 1.0)?;
    area.overwrite("check", &first)?;
    let second = state(dev, 2.0)?;
    let before = device::pinned_bytes_moved();
    area.overwrite("check", &second)?;
    let path = area.path("check");
    let on_host = read_tensors(&path, &device::host())?;
    let written: Vec<(String, Tensor)> = second
        .iter()
        .map(|(name, _)| (name.clone(), on_host[name].clone()))
        .collect();
    let mut found = vec![same(
        "offload in place, read on the host",
        &second,
        &written,
    )?];
    let reloaded = read_host_copy(&path, dev)?;
    let reloaded: Vec<(String, Tensor)> = second
        .iter()
        .map(|(name, _)| (name.clone(), reloaded[name].clone()))
        .collect();
    found.push(same("reload into new tensors", &second, &reloaded)?);
    let targets = state(dev, 3.0)?;
    area.read_into_tensors("check", targets.iter().map(|(n, t)| (n.as_str(), t)))?;
    found.push(same("reload into existing tensors", &second, &targets)?);
    // Each of the three moves went by DMA, or the staged path hid a refusal.
    let bytes: u64 = second.iter().map(|(_, t)| tensor_bytes(t)).sum();
    let pinned = device::pinned_bytes_moved() - before;
    found.push(Finding {
        what: format!(
            "moves by DMA through the page-locked copy ({pinned} of {} bytes)",
            3 * bytes
        ),
        ok: pinned == 3 * bytes,
        worst: 0.0,
    });
    Ok(found)
}

/// GB/s of offloads and reloads of 512 MiB in 8 tensors through a host copy, staged (the first
/// write) and by DMA (the best of three), beside a page-locked `memcpy` of the same bytes each
/// way; one line for the check's output.
pub fn bandwidth(dev: &Device) -> Result<String> {
    const TENSORS: usize = 8;
    const ELEMS: usize = 16 << 20; // 64 MiB of f32 each
    let bytes = (TENSORS * ELEMS * 4) as f64;
    let tensors: Vec<(String, Tensor)> = (0..TENSORS)
        .map(|i| Ok((format!("t{i}"), Tensor::ones(ELEMS, DType::F32, dev)?)))
        .collect::<Result<_>>()?;
    let area = HostArea::new()?;
    let gbps = |seconds: f64| bytes / seconds / 1e9;
    let t0 = Instant::now();
    area.overwrite("bench", &tensors)?;
    let staged = gbps(t0.elapsed().as_secs_f64());
    let mut offload = 0f64;
    let mut reload = 0f64;
    let before = device::pinned_bytes_moved();
    for _ in 0..3 {
        let t0 = Instant::now();
        area.overwrite("bench", &tensors)?;
        offload = offload.max(gbps(t0.elapsed().as_secs_f64()));
        let t0 = Instant::now();
        area.read_into_tensors("bench", tensors.iter().map(|(n, t)| (n.as_str(), t)))?;
        reload = reload.max(gbps(t0.elapsed().as_secs_f64()));
    }
    // Three offloads and three reloads, every byte by DMA, or the figures are the staged path's.
    let how = if device::pinned_bytes_moved() - before == 6 * bytes as u64 {
        "by DMA"
    } else {
        "STAGED, not by DMA"
    };
    let (mut to_host, mut to_device) = (0f64, 0f64);
    for _ in 0..3 {
        let (h, d) = device::pinned_memcpy_seconds(dev, bytes as usize).map_err(|e| anyhow!(e))?;
        to_host = to_host.max(gbps(h));
        to_device = to_device.max(gbps(d));
    }
    Ok(format!(
        "host copy of 512 MiB {how}: offload {offload:.1} GB/s ({:.0}% of a page-locked memcpy's \
         {to_host:.1}), reload {reload:.1} GB/s ({:.0}% of {to_device:.1}); the first, staged \
         write {staged:.1} GB/s",
        100.0 * offload / to_host,
        100.0 * reload / to_device,
    ))
}
