//! Tests of [`super`]: the checksum, the wire bytes of one event, and a written file read back.

use super::*;
use crate::plot::tests::series;

#[test]
fn masked_crc_of_the_check_string() {
    // CRC-32C("123456789") is the catalogue's check value 0xE3069283; masked:
    // (0xE3069283 >> 15 | 0xE3069283 << 17) + 0xA282EAD8 (mod 2^32) = 0xC78AB0E5.
    assert_eq!(CRC32C.checksum(b"123456789"), 0xE306_9283);
    assert_eq!(masked_crc(b"123456789"), 0xC78A_B0E5);
}

#[test]
fn a_scalar_event_in_wire_bytes() {
    // Summary.Value {tag: "a" (field 1: 0x0a, len 1, 'a'), simple_value: 0.5 (field 2, 32-bit:
    // 0x15, 0.5f32 LE = 00 00 00 3f)}; Summary {value (field 1: 0x0a, len 8)}; Event {wall_time
    // 1.0 (0x09, 1.0f64 LE), step 300 (0x10, varint 300 = ac 02), summary (field 5: 0x2a, len 10)}.
    let want = [
        0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0x10, 0xac, 0x02, 0x2a, 10, 0x0a, 8, 0x0a, 1, b'a',
        0x15, 0, 0, 0, 0x3f,
    ];
    assert_eq!(scalar_event(1.0, 300, "a", 0.5), want);
    // The record of an 18-byte event: length 18 as u64 LE, its masked CRC (0x25641F24, computed
    // by a bitwise CRC-32C in Python), the data, the data's masked CRC.
    let mut out = Vec::new();
    let data = [7u8; 18];
    record(&mut out, &data);
    assert_eq!(&out[..8], &18u64.to_le_bytes());
    assert_eq!(&out[8..12], &0x2564_1F24u32.to_le_bytes());
    assert_eq!(&out[12..30], &data);
    assert_eq!(out.len(), 8 + 4 + 18 + 4);
}

#[test]
fn tags_keep_stages_apart() {
    assert_eq!(tag_of("rl", "reward/add/mean"), "rl/reward/add/mean");
    assert_eq!(tag_of("sft", "sft/loss"), "sft/loss");
    assert_eq!(tag_of("sft", "sftx/loss"), "sft/sftx/loss");
    assert_eq!(tag_of("dpo", "time/step"), "dpo/time/step");
}

/// Reads the records back, checking both checksums of each: (wall_time, step, tag, value) of
/// every scalar event, after the version event.
fn read_back(bytes: &[u8]) -> Vec<(f64, u64, String, f32)> {
    let mut at = 0;
    let mut events = Vec::new();
    while at < bytes.len() {
        let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
        let crc = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap());
        assert_eq!(crc(&bytes[at + 8..at + 12]), masked_crc(&bytes[at..at + 8]));
        let data = &bytes[at + 12..at + 12 + len];
        assert_eq!(crc(&bytes[at + 12 + len..at + 16 + len]), masked_crc(data));
        events.push(data.to_vec());
        at += 16 + len;
    }
    assert_eq!(events[0][9..], *b"\x1a\x0dbrain.Event:2");
    events[1..]
        .iter()
        .map(|e| {
            let wall = f64::from_le_bytes(e[1..9].try_into().unwrap());
            let (mut step, mut shift, mut i) = (0u64, 0, 10);
            loop {
                step |= u64::from(e[i] & 0x7f) << shift;
                shift += 7;
                i += 1;
                if e[i - 1] < 0x80 {
                    break;
                }
            }
            let tag_len = e[i + 5] as usize;
            let tag = String::from_utf8(e[i + 6..i + 6 + tag_len].to_vec()).unwrap();
            let value =
                f32::from_le_bytes(e[i + 7 + tag_len..i + 11 + tag_len].try_into().unwrap());
            (wall, step, tag, value)
        })
        .collect()
}

#[test]
fn a_run_written_and_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let runs = [
        series("rl", "reward/add/mean", &[0.25, 0.5]),
        series("sft", "sft/loss", &[3.0]),
    ];
    let path = write_events(&runs, dir.path(), 1_700_000_000.0).unwrap();
    assert_eq!(
        path.file_name().unwrap().to_str().unwrap(),
        "events.out.tfevents.1700000000.roll-tui"
    );
    let events = read_back(&std::fs::read(&path).unwrap());
    // Wall times are the run's start plus the series' seconds (10 s per step in `series`).
    assert_eq!(
        events,
        [
            (1_700_000_010.0, 1, "rl/reward/add/mean".to_string(), 0.25),
            (1_700_000_020.0, 2, "rl/reward/add/mean".to_string(), 0.5),
            (1_700_000_010.0, 1, "sft/loss".to_string(), 3.0),
        ]
    );
    // Exporting again replaces the file rather than adding a second one.
    write_events(&runs, dir.path(), 1_700_000_000.0).unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}
