//! Replay: a cursor on a run's timeline. While it is set, every view shows the run as of that
//! step (the dashboard marks it and reads the values there, samples show that step, workers and
//! events stop at its time). It steps by hand or plays at a chosen speed.

/// A point on a run's timeline: a step, and when that step was recorded (Unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub step: u64,
    pub at_ms: i64,
}
