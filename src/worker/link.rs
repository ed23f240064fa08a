//! What the run's links to its TCP workers do, by worker, for the run's metrics and the Workers
//! view: the heartbeat's round-trip time, and the bytes and seconds each worker's mirror of its
//! host area moved ([`super::mirror`]). One run per process, so process-wide tables.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use super::Role;
use super::mirror::Moved;

/// Round-trip times are smoothed over about this many heartbeats.
const RTT_WEIGHT: f64 = 0.2;

static RTT_MS: Mutex<BTreeMap<(Role, usize), f64>> = Mutex::new(BTreeMap::new());
static MOVED: Mutex<BTreeMap<(Role, usize), Moved>> = Mutex::new(BTreeMap::new());

/// A heartbeat of worker `index` of `role` came back after `rtt`.
pub fn heard(role: Role, index: usize, rtt: Duration) {
    let ms = rtt.as_secs_f64() * 1e3;
    if let Ok(mut t) = RTT_MS.lock() {
        t.entry((role, index))
            .and_modify(|m| *m += RTT_WEIGHT * (ms - *m))
            .or_insert(ms);
    }
}

/// Count `moved` through the mirror of worker `index` of `role`.
pub fn moved(role: Role, index: usize, moved: Moved) {
    if let Ok(mut t) = MOVED.lock() {
        t.entry((role, index)).or_default().add(moved);
    }
}

/// The link's figures as metrics: `workers/<role>-<i>/rtt_ms` (smoothed heartbeat round trip),
/// `.../mirror_mb` and `.../mirror_gb_per_s` (all the mirror moved so far, both ways, and its
/// rate while moving).
pub fn metrics() -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for ((role, index), ms) in RTT_MS.lock().map(|t| t.clone()).unwrap_or_default() {
        m.insert(format!("workers/{role}-{index}/rtt_ms"), ms);
    }
    for ((role, index), moved) in MOVED.lock().map(|t| t.clone()).unwrap_or_default() {
        let key = format!("workers/{role}-{index}/mirror");
        m.insert(format!("{key}_mb"), moved.bytes as f64 / 1e6);
        if moved.secs > 0.0 {
            m.insert(
                format!("{key}_gb_per_s"),
                moved.bytes as f64 / 1e9 / moved.secs,
            );
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first round trip is taken as it is; later ones move the figure a fifth of the way:
    /// 10 ms, then 20 ms: 10 + 0.2 × (20 − 10) = 12 ms. Mirror traffic adds up: 3 MB in 1 ms
    /// and 1 MB in 1 ms are 4 MB at 4 MB / 2 ms = 2 GB/s.
    #[test]
    fn round_trips_are_smoothed_and_traffic_adds_up() {
        heard(Role::Critic, 7, Duration::from_millis(10));
        heard(Role::Critic, 7, Duration::from_millis(20));
        for bytes in [3_000_000, 1_000_000] {
            moved(
                Role::Critic,
                7,
                Moved {
                    files: 1,
                    bytes,
                    secs: 0.001,
                },
            );
        }
        let m = metrics();
        assert!((m["workers/critic-7/rtt_ms"] - 12.0).abs() < 1e-9);
        assert!((m["workers/critic-7/mirror_mb"] - 4.0).abs() < 1e-9);
        assert!((m["workers/critic-7/mirror_gb_per_s"] - 2.0).abs() < 1e-9);
    }
}
