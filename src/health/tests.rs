//! Tests of the health rules, against hand-built events and series.

use super::*;
use crate::store::fixtures::{ev, transfer};

const MIB: u64 = 1 << 20;
const NOW: i64 = 1_000_000;

/// A series of `key` with steps 1, 2, … recorded `step` seconds after the run's start.
fn series(key: &str, values: &[f64]) -> Series {
    Series {
        stage: "rl".into(),
        key: key.into(),
        steps: (1..=values.len() as u64).collect(),
        wall_time: (1..=values.len()).map(|s| s as f64).collect(),
        values: values.to_vec(),
    }
}

fn info(id: i64, name: &str, status: RunStatus, created_at: i64) -> RunState {
    RunState::from(&crate::store::fixtures::info(id, name, status, created_at))
}

fn at_step(step: u64) -> Option<AsOf> {
    Some(AsOf {
        step,
        at_ms: step as i64 * 1000,
    })
}

fn kinds(a: &[Alarm]) -> Vec<AlarmKind> {
    a.iter().map(|a| a.kind).collect()
}

fn since(a: &Alarm) -> Option<u64> {
    a.since.as_ref().map(|s| s.step)
}

#[test]
fn a_running_run_without_a_fresh_heartbeat_is_stalled() {
    let mut run = info(1, "r", RunStatus::Running, 0);
    run.pid = Some(77);
    run.heartbeat_at = NOW - STALE_AFTER_MS - 1_000;
    let steps = [series(STEP_KEY, &[1.0, 1.0, 1.0])];
    let found = alarms(&run, &[], &steps, None, NOW);
    assert_eq!(kinds(&found), [AlarmKind::Stalled]);
    assert_eq!(found[0].detail, "no heartbeat for 31 s (pid 77)");
    // The heartbeat stopped after step 3 was recorded: during step 4.
    assert_eq!(since(&found[0]), Some(4));
    // A fresh heartbeat, a finished run, or a replay cursor (heartbeats have no history): none.
    run.heartbeat_at = NOW - 10_000;
    assert!(alarms(&run, &[], &steps, None, NOW).is_empty());
    run.heartbeat_at = 0;
    assert!(alarms(&run, &[], &steps, at_step(2), NOW).is_empty());
    run.status = RunStatus::Finished;
    assert!(alarms(&run, &[], &steps, None, NOW).is_empty());
}

#[test]
fn a_run_the_store_marked_interrupted_is_stalled_until_resumed() {
    let mut run = info(1, "r", RunStatus::Interrupted, 0);
    run.heartbeat_at = 0;
    let mut events = vec![
        ev(0, EventKind::RunStarted, None, "run 'r' started"),
        ev(
            5_500,
            EventKind::RunMarkedInterrupted,
            None,
            "run marked interrupted: no heartbeat for 45 s",
        ),
    ];
    let steps = [series(STEP_KEY, &[1.0; 5])];
    let found = alarms(&run, &events, &steps, None, NOW);
    assert_eq!(kinds(&found), [AlarmKind::Stalled]);
    assert_eq!(since(&found[0]), Some(6));
    // Replay before the mark: nothing yet.
    assert!(alarms(&run, &events, &steps, at_step(5), NOW).is_empty());
    events.push(ev(
        7_000,
        EventKind::RunResumed,
        None,
        "resumed from rl step 5",
    ));
    run.status = RunStatus::Finished;
    assert!(alarms(&run, &events, &steps, None, NOW).is_empty());
}

#[test]
fn failed_workers_are_alarms_from_their_first_failure() {
    let run = info(1, "r", RunStatus::Finished, 0);
    let events = vec![
        ev(
            500,
            EventKind::WorkerStarted,
            Some("reward-1"),
            "started, pid 10",
        ),
        ev(
            2_500,
            EventKind::WorkerFailed,
            Some("reward-1"),
            "pid 10 died (signal: 9)",
        ),
        ev(
            2_600,
            EventKind::WorkerStarted,
            Some("reward-1"),
            "started, pid 11",
        ),
        ev(
            3_500,
            EventKind::WorkerFailed,
            Some("reward-1"),
            "no heartbeat answer for 30.0 s",
        ),
        ev(
            3_600,
            EventKind::WorkerExited,
            Some("reward-0"),
            "pid 9 exited (exit status: 0)",
        ),
    ];
    let steps = [series(STEP_KEY, &[1.0; 5])];
    let found = alarms(&run, &events, &steps, None, NOW);
    assert_eq!(kinds(&found), [AlarmKind::WorkerFailed]);
    assert_eq!(found[0].place, "reward-1");
    assert_eq!(since(&found[0]), Some(3));
    assert_eq!(
        found[0].detail,
        "failed 2×, last: no heartbeat answer for 30.0 s"
    );
    // At step 3 (t=3000): one failure, and it was started again.
    let then = alarms(&run, &events, &steps, at_step(3), NOW);
    assert_eq!(
        then[0].detail,
        "failed 1×, last: pid 10 died (signal: 9); started again"
    );
    assert!(alarms(&run, &events, &steps, at_step(2), NOW).is_empty());
}

#[test]
fn entropy_collapse_below_a_tenth_of_its_early_value_or_the_floor() {
    let run = info(1, "r", RunStatus::Finished, 0);
    // Early mean (2.0 + 2.1 + 1.9) / 3 = 2.0, so the threshold is max(0.05, 0.2) = 0.2: the
    // last two points (0.15, 0.1) are below it, from step 6.
    let s = [series(ENTROPY_KEY, &[2.0, 2.1, 1.9, 1.0, 0.5, 0.15, 0.1])];
    let found = alarms(&run, &[], &s, None, NOW);
    assert_eq!(kinds(&found), [AlarmKind::EntropyCollapse]);
    assert_eq!(
        (found[0].place.as_str(), since(&found[0])),
        (ENTROPY_KEY, Some(6))
    );
    assert_eq!(found[0].detail, "entropy 0.100 < 0.200 (early mean 2.000)");
    // At step 5 the entropy (0.5) was still above.
    assert!(alarms(&run, &[], &s, at_step(5), NOW).is_empty());
    // Healthy, and too short for the ratio rule but above the floor: none.
    let healthy = [series(ENTROPY_KEY, &[2.0, 1.8, 1.9, 1.7, 1.8])];
    assert!(alarms(&run, &[], &healthy, None, NOW).is_empty());
    let short = [series(ENTROPY_KEY, &[2.0, 0.1])];
    assert!(alarms(&run, &[], &short, None, NOW).is_empty());
    // Under the floor from the start.
    let floor = [series(ENTROPY_KEY, &[0.01, 0.02])];
    assert_eq!(since(&alarms(&run, &[], &floor, None, NOW)[0]), Some(1));
}

#[test]
fn all_equal_reward_groups_for_the_last_steps() {
    let run = info(1, "r", RunStatus::Finished, 0);
    let s = [series(
        FLAT_KEY,
        &[0.2, 0.95, 0.5, 0.9, 1.0, 0.95, f64::NAN],
    )];
    let found = alarms(&run, &[], &s, None, NOW);
    assert_eq!(kinds(&found), [AlarmKind::FlatRewards]);
    // Steps 4, 5, 6 are at or above 0.9 (the NaN at step 7 is no point).
    assert_eq!(since(&found[0]), Some(4));
    assert_eq!(
        found[0].detail,
        "95% of groups all-equal (≥ 90% for 3 steps): no learning signal"
    );
    // At step 5 only two steps in a row: not yet.
    assert!(alarms(&run, &[], &s, at_step(5), NOW).is_empty());
    let fine = [series(FLAT_KEY, &[0.95, 0.95, 0.95, 0.3])];
    assert!(alarms(&run, &[], &fine, None, NOW).is_empty());
}

#[test]
fn memory_creeping_up_across_reload_cycles() {
    let run = info(1, "r", RunStatus::Finished, 0);
    let cycle = |bytes: [u64; 3]| {
        vec![
            transfer(1_000, true, "reference", "0", bytes[0], "train"),
            transfer(2_000, false, "reference", "0", bytes[0], "generate"),
            transfer(3_000, true, "reference", "0", bytes[1], "train"),
            transfer(4_000, false, "reference", "0", bytes[1], "generate"),
            transfer(5_000, true, "reference", "0", bytes[2], "train"),
        ]
    };
    let steps = [series(STEP_KEY, &[1.0; 6])];
    let events = cycle([100 * MIB, 110 * MIB, 120 * MIB]);
    let found = alarms(&run, &events, &steps, None, NOW);
    assert_eq!(kinds(&found), [AlarmKind::MemoryCreep]);
    assert_eq!(found[0].place, "reference on device 0");
    assert_eq!(since(&found[0]), Some(1));
    assert_eq!(
        found[0].detail,
        "resident after its last 3 reloads: 100.0 MiB → 110.0 MiB → 120.0 MiB (+20.0 MiB)"
    );
    // Replay at step 4: two reloads only.
    assert!(alarms(&run, &events, &steps, at_step(4), NOW).is_empty());
    // Steady, or down again: none.
    for bytes in [[100, 110, 110], [100, 120, 110]] {
        let events = cycle(bytes.map(|b| b * MIB));
        assert!(alarms(&run, &events, &steps, None, NOW).is_empty());
    }
}

#[test]
fn events_fall_on_the_step_they_happened_during() {
    // time/step points at 1 s (step 1) and 2 s (step 2) from a start at 10 s.
    let s = [series(STEP_KEY, &[1.0, 1.0]), series("other", &[5.0; 9])];
    let at = |ms| step_at(&s, 10_000, None, ms).map(|r| r.to_string());
    assert_eq!(at(10_500).as_deref(), Some("step 1"));
    assert_eq!(at(11_000).as_deref(), Some("step 1"));
    assert_eq!(at(11_001).as_deref(), Some("step 2"));
    assert_eq!(at(99_000).as_deref(), Some("step 3"));
    assert_eq!(step_at(&[], 0, None, 5), None);
    let sft = StepRef {
        stage: "sft".into(),
        step: 2,
    };
    assert_eq!(sft.to_string(), "sft step 2");
}
