//! Is the process that owns a running run still alive?
//!
//! A run row records its host, pid and the pid's start time. On the same Linux host we can answer
//! exactly from `/proc` (the start time guards against pid reuse); elsewhere, or when `/proc` is not
//! there, the heartbeat decides: a run whose heartbeat is older than [`STALE_AFTER_MS`] is dead.

use sqlx::Row;

use super::{RunStatus, Store, StoreError, now_ms};

/// The writer refreshes the heartbeat of its runs this often.
pub const HEARTBEAT_EVERY_MS: u64 = 2_000;
/// A running run whose heartbeat is older than this is taken to be dead.
pub const STALE_AFTER_MS: i64 = 30_000;

/// Who is writing: recorded with a run when it starts or resumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessIdentity {
    pub host: String,
    pub pid: u32,
    /// `<boot id>:<pid namespace>/<start time in clock ticks>` on Linux, `None` elsewhere.
    pub token: Option<String>,
}

impl ProcessIdentity {
    pub fn current() -> Self {
        ProcessIdentity::of(std::process::id())
    }

    /// The process `pid` of this host as it is now (its start time pins the pid to it).
    pub fn of(pid: u32) -> Self {
        ProcessIdentity {
            host: host_name(),
            pid,
            token: token_of(pid),
        }
    }

    /// `Some(alive)` when it can be decided here, `None` when only the heartbeat can tell: another
    /// host, another boot or pid namespace (containers sharing a host name), or a `/proc` that hides
    /// other users' processes.
    pub fn is_alive(&self) -> Option<bool> {
        let (ns, ticks) = self.token.as_deref()?.rsplit_once('/')?;
        if self.host != host_name() || Some(ns) != namespace().as_deref() {
            return None;
        }
        if !std::path::Path::new("/proc/1/stat").exists() {
            return None;
        }
        match start_ticks(self.pid) {
            None => Some(false),
            Some(now) => Some(now.to_string() == ticks),
        }
    }
}

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// This boot and pid namespace: pids are comparable only within both.
fn namespace() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    Some(format!("{}:{}", boot.trim(), ns.display()))
}

fn token_of(pid: u32) -> Option<String> {
    Some(format!("{}/{}", namespace()?, start_ticks(pid)?))
}

/// Whether `pid` is stopped (SIGSTOP, state `T` in `/proc/<pid>/stat`); `None` without /proc.
pub fn is_stopped(pid: u32) -> Option<bool> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    Some(after_name.split_whitespace().next()? == "T")
}

/// Field 22 of `/proc/PID/stat` (after the parenthesised command name, which may contain spaces).
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(19)?.parse().ok()
}

impl Store {
    /// Mark `running` runs whose process is gone as `interrupted`, with an event saying why.
    pub(crate) async fn mark_dead_runs_interrupted(&self) -> Result<Vec<String>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, name, host, pid, process_token, heartbeat_at FROM runs WHERE status = 'running'",
        )
        .fetch_all(self.pool())
        .await
        .map_err(self.err("checking running runs"))?;
        let now = now_ms();
        let mut marked = vec![];
        for row in rows {
            let id: i64 = row.get("id");
            let name: String = row.get("name");
            let heartbeat: i64 = row.get("heartbeat_at");
            let owner = match (
                row.get::<Option<String>, _>("host"),
                row.get::<Option<i64>, _>("pid"),
            ) {
                (Some(host), Some(pid)) => Some(ProcessIdentity {
                    host,
                    pid: pid as u32,
                    token: row.get("process_token"),
                }),
                _ => None,
            };
            let reason = match owner.as_ref().and_then(ProcessIdentity::is_alive) {
                Some(true) => continue,
                Some(false) => format!(
                    "process {} on this host is gone",
                    owner.as_ref().map(|o| o.pid).unwrap_or_default()
                ),
                None if now - heartbeat > STALE_AFTER_MS => format!(
                    "no heartbeat for {:.0} s",
                    (now - heartbeat) as f64 / 1000.0
                ),
                None => continue,
            };
            let updated = sqlx::query(
                "UPDATE runs SET status = ?, updated_at = ?, error = ? \
                 WHERE id = ? AND status = 'running' AND heartbeat_at = ?",
            )
            .bind(RunStatus::Interrupted.as_str())
            .bind(now)
            .bind(format!("interrupted: {reason}"))
            .bind(id)
            // Only if nobody took the run over (a resume) or beat since we looked.
            .bind(heartbeat)
            .execute(self.pool())
            .await
            .map_err(self.err("marking a dead run interrupted"))?;
            if updated.rows_affected() == 1 {
                sqlx::query(
                    "INSERT INTO events (run_id, at, kind, run_status, message) \
                     VALUES (?, ?, 'run_marked_interrupted', 'interrupted', ?)",
                )
                .bind(id)
                .bind(now)
                .bind(format!("run marked interrupted: {reason}"))
                .execute(self.pool())
                .await
                .map_err(self.err("recording an event"))?;
                marked.push(name);
            }
        }
        Ok(marked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_fake_start_time_is_not() {
        let me = ProcessIdentity::current();
        let Some(token) = me.token.clone() else {
            return; // not Linux: only heartbeats apply
        };
        assert_eq!(me.is_alive(), Some(true));
        let (ns, ticks) = token.rsplit_once('/').unwrap();
        let reused = ProcessIdentity {
            token: Some(format!("{ns}/{}", ticks.parse::<u64>().unwrap() + 1)),
            ..me.clone()
        };
        assert_eq!(reused.is_alive(), Some(false));
        let other_namespace = ProcessIdentity {
            token: Some(format!("another-boot:pid:[1]/{ticks}")),
            ..me.clone()
        };
        assert_eq!(other_namespace.is_alive(), None);
        let elsewhere = ProcessIdentity {
            host: "another-host".into(),
            ..me
        };
        assert_eq!(elsewhere.is_alive(), None);
    }
}
