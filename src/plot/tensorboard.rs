//! A run's series as a TensorBoard event file, so `tensorboard --logdir DIR` shows the run beside
//! whatever else a user keeps there.
//!
//! The format is TensorFlow's record file of `Event` protocol buffers: each record is its length
//! (u64, little-endian), the masked CRC-32C of those 8 bytes (u32), the data, and the data's masked
//! CRC-32C (u32), where `masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8`. The first event carries
//! only `file_version: "brain.Event:2"`; then one event per point: `wall_time` (field 1, double),
//! `step` (2, int64) and `summary` (5) holding one `Summary.Value` with `tag` (1, string) and
//! `simple_value` (2, float), which TensorBoard's scalar dashboard reads. Three small messages do
//! not need a protobuf library; the wire format (tags, varints, little-endian fixed widths) is
//! written out below.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use super::PlotError;
use crate::metrics::Series;

/// TensorBoard finds event files by this part of their name.
pub const FILE_PREFIX: &str = "events.out.tfevents";

const CRC32C: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// The file's name: one per export, so exporting again replaces it instead of doubling every
/// point. The number is the run's start (seconds), as TensorFlow names files by their creation.
pub fn file_name(started_at: f64) -> String {
    format!("{FILE_PREFIX}.{}.roll-tui", started_at.max(0.0) as u64)
}

/// Writes every point of `series` to `out/<file_name>` and returns its path. `started_at` is the
/// run's start in seconds since the epoch; series wall times count from it.
pub fn write_events(series: &[Series], out: &Path, started_at: f64) -> Result<PathBuf, PlotError> {
    super::check_lengths(series)?;
    let path = out.join(file_name(started_at));
    let mut bytes = Vec::new();
    record(&mut bytes, &version_event(started_at));
    for s in series {
        let tag = tag_of(&s.stage, &s.key);
        for ((step, wall), value) in s.steps.iter().zip(&s.wall_time).zip(&s.values) {
            let event = scalar_event(started_at + wall, *step, &tag, *value as f32);
            record(&mut bytes, &event);
        }
    }
    let io = |source| PlotError::Io {
        path: path.clone(),
        source,
    };
    let mut file = std::fs::File::create(&path).map_err(io)?;
    file.write_all(&bytes).map_err(io)?;
    Ok(path)
}

/// A series' tag: its key under its stage (`rl/reward/add/mean`), so stages that count steps from
/// 1 each never share a chart, and TensorBoard groups the charts by stage; a key that already
/// starts with its stage (`sft/loss`) keeps its name.
pub fn tag_of(stage: &str, key: &str) -> String {
    match key.strip_prefix(stage) {
        Some(rest) if rest.starts_with('/') => key.to_string(),
        _ => format!("{stage}/{key}"),
    }
}

fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = CRC32C.checksum(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn record(out: &mut Vec<u8>, data: &[u8]) {
    let len = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field (wire type 2).
fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

fn version_event(wall_time: f64) -> Vec<u8> {
    let mut e = Vec::new();
    e.push(1 << 3 | 1); // wall_time, 64-bit
    e.extend_from_slice(&wall_time.to_le_bytes());
    bytes_field(&mut e, 3, b"brain.Event:2");
    e
}

fn scalar_event(wall_time: f64, step: u64, tag: &str, value: f32) -> Vec<u8> {
    let mut v = Vec::new();
    bytes_field(&mut v, 1, tag.as_bytes());
    v.push(2 << 3 | 5); // simple_value, 32-bit
    v.extend_from_slice(&value.to_le_bytes());
    let mut summary = Vec::new();
    bytes_field(&mut summary, 1, &v);
    let mut e = Vec::new();
    e.push(1 << 3 | 1);
    e.extend_from_slice(&wall_time.to_le_bytes());
    e.push(2 << 3); // step, varint
    varint(&mut e, step);
    bytes_field(&mut e, 5, &summary);
    e
}

#[cfg(test)]
#[path = "tensorboard_tests.rs"]
mod tests;
