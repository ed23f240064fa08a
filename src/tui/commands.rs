//! What the workbench does to processes: start `roll-tui run` / `roll-tui resume` detached from the
//! terminal (its own process group, output to a log file), so a run outlives the workbench and
//! keeps going headless; and signal a run's process to stop, pause or continue. A run is steered
//! only through its process, never through the store: the run writes its own records.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::store::liveness::ProcessIdentity;

/// What to ask of a running run's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunSignal {
    /// SIGINT: the run stops after its step and writes a checkpoint, as on Ctrl-C.
    Stop,
    /// SIGSTOP: the run's controller halts where it is; its workers wait for it.
    Pause,
    /// SIGCONT.
    Continue,
}

/// Send `what` to `process`, checked again first: a pid read a while ago (the run list, a
/// confirmation left open) may belong to another program by now, which must never be signalled.
/// Where that cannot be told (no `/proc`), the signal is sent.
pub fn signal_process(process: &ProcessIdentity, what: RunSignal) -> Result<(), String> {
    if process.is_alive() == Some(false) {
        return Err(format!(
            "pid {} has ended (or is another program now): nothing was sent",
            process.pid
        ));
    }
    signal(process.pid, what)
}

/// Send `what` to the run process `pid`. A stop also continues a paused run, so it can act on it.
pub fn signal(pid: u32, what: RunSignal) -> Result<(), String> {
    let pid_t = i32::try_from(pid).map_err(|_| format!("pid {pid} is out of range"))?;
    let send = |sig: Signal| {
        kill(Pid::from_raw(pid_t), sig).map_err(|e| format!("sending {sig} to pid {pid}: {e}"))
    };
    match what {
        RunSignal::Stop => {
            send(Signal::SIGINT)?;
            send(Signal::SIGCONT)
        }
        RunSignal::Pause => send(Signal::SIGSTOP),
        RunSignal::Continue => send(Signal::SIGCONT),
    }
}

/// A `roll-tui` command started from the workbench.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub process: ProcessIdentity,
    /// The run it is for (the name a new run will have, or the run resumed).
    pub run: String,
    pub log: PathBuf,
    /// What was started, for messages (`run experiments/quickstart.yaml`).
    pub what: String,
}

/// Where the output of commands started from the workbench goes: `roll-logs/` beside the store.
pub fn log_dir(store: &Path) -> PathBuf {
    let parent = store.parent().filter(|p| !p.as_os_str().is_empty());
    parent.unwrap_or(Path::new(".")).join("roll-logs")
}

/// Start this executable with `args` (after `--store STORE`), detached: stdin closed, output to a
/// fresh log file, its own process group so the terminal's signals do not reach it. Returns the
/// child, which the caller must reap.
pub fn spawn_detached(
    store: &Path,
    args: &[String],
    run: &str,
    log_stem: &str,
) -> Result<(Started, tokio::process::Child), String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding roll-tui's executable: {e}"))?;
    let dir = log_dir(store);
    std::fs::create_dir_all(&dir)
        .map_err(|e| format!("creating the log directory '{}': {e}", dir.display()))?;
    let stamp = unix_ms();
    let log = dir.join(format!("{log_stem}-{stamp}.log"));
    let out = std::fs::File::create(&log)
        .map_err(|e| format!("creating the log '{}': {e}", log.display()))?;
    let err = out
        .try_clone()
        .map_err(|e| format!("opening the log '{}': {e}", log.display()))?;
    let child = tokio::process::Command::new(&exe)
        .arg("--store")
        .arg(store)
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("starting '{}': {e}", exe.display()))?;
    let pid = child
        .id()
        .ok_or_else(|| "the started process exited at once".to_string())?;
    // Read now, while the child cannot have been reaped: its start time pins the pid to it.
    let started = Started {
        process: ProcessIdentity::of(pid),
        run: run.to_string(),
        log,
        what: args.join(" "),
    };
    Ok((started, child))
}

/// The time in Unix ms: log names sort by start and do not collide for commands started by hand.
fn unix_ms() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    format!("{now}")
}

/// The last `lines` lines of a log, to say why a started command failed.
pub fn log_tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    all[all.len().saturating_sub(lines)..].join(" | ")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on failure
mod tests {
    use super::*;

    #[test]
    fn logs_go_beside_the_store() {
        assert_eq!(
            log_dir(Path::new("/data/roll.db")),
            Path::new("/data/roll-logs")
        );
        assert_eq!(log_dir(Path::new("roll.db")), Path::new("./roll-logs"));
    }

    #[test]
    fn signals_pause_and_continue_a_real_process_and_fail_on_a_gone_one() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        signal(pid, RunSignal::Pause).unwrap();
        // SIGSTOP is asynchronous: wait for the state to show.
        let stopped = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            crate::store::liveness::is_stopped(pid) == Some(true)
        });
        assert!(stopped, "the process never showed as stopped");
        signal(pid, RunSignal::Continue).unwrap();
        let running = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(5));
            crate::store::liveness::is_stopped(pid) == Some(false)
        });
        assert!(running, "the process never continued");
        // SIGINT is delivered; whether it ends `sleep` depends on the disposition this test was
        // started with (a background shell ignores SIGINT), so the stop itself is checked end to
        // end against `roll-tui run`, which installs its handler (tests/workbench_pty.rs).
        signal(pid, RunSignal::Stop).unwrap();
        let identity = ProcessIdentity::of(pid);
        signal_process(&identity, RunSignal::Continue).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(signal(pid, RunSignal::Stop).is_err(), "the pid is gone");
        if identity.token.is_some() {
            let err = signal_process(&identity, RunSignal::Stop).unwrap_err();
            assert!(
                err.contains("has ended") && err.contains("nothing was sent"),
                "{err}"
            );
        }
        // A pid that now belongs to another process (same pid, other start time) is refused.
        if let Some(token) = ProcessIdentity::current().token {
            let (ns, ticks) = token.rsplit_once('/').unwrap();
            let reused = ProcessIdentity {
                token: Some(format!("{ns}/{}", ticks.parse::<u64>().unwrap() + 1)),
                ..ProcessIdentity::current()
            };
            assert!(signal_process(&reused, RunSignal::Continue).is_err());
        }
    }

    #[test]
    fn the_tail_of_a_log_skips_blank_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("x.log");
        std::fs::write(&log, "a\n\nb\nc\n\n").unwrap();
        assert_eq!(log_tail(&log, 2), "b | c");
        assert_eq!(log_tail(&dir.path().join("missing.log"), 2), "");
    }
}
