//! One sandboxed run: the command line, the deadline, and the capped output.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use wait_timeout::ChildExt;

use super::{Limits, Sandbox, SandboxError};

/// The uid programs run as when roll-tui runs as root (`nobody`).
const NOBODY: u32 = 65534;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The program exited with this status (a Python exception exits 1).
    Exited(i32),
    /// Killed by this signal (the CPU limit sends SIGXCPU, 24).
    Signaled(i32),
    /// Still running at the wall-clock deadline, and killed.
    TimedOut,
    /// Wrote more than [`Limits::output_bytes`] to stdout or stderr, and killed.
    OutputLimit,
}

/// What a run produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    pub outcome: Outcome,
    /// At most [`Limits::output_bytes`].
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub wall: Duration,
}

impl Run {
    /// Exited with status 0.
    pub fn succeeded(&self) -> bool {
        self.outcome == Outcome::Exited(0)
    }
}

impl Sandbox {
    /// Runs `program` (Python source) with `stdin`, sandboxed and limited.
    pub fn run_python(
        &self,
        program: &str,
        stdin: &[u8],
        limits: &Limits,
    ) -> Result<Run, SandboxError> {
        let spawn_err = |what: &str, e: std::io::Error| SandboxError::Spawn(format!("{what}: {e}"));
        // The program reaches the sandbox as a read-only file readable by its user.
        let dir = tempfile::Builder::new()
            .prefix("roll-sandbox-")
            .tempdir()
            .map_err(|e| spawn_err("a directory for the program", e))?;
        let file = dir.path().join("main.py");
        std::fs::write(&file, program).map_err(|e| spawn_err("writing the program", e))?;
        for (path, mode) in [(dir.path(), 0o755), (file.as_path(), 0o644)] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .map_err(|e| spawn_err("making the program readable", e))?;
        }
        let mut cmd = self.command(&file, limits);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let start = Instant::now();
        let mut child = cmd.spawn().map_err(|e| spawn_err("bwrap", e))?;
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        let overflow = Arc::new(AtomicBool::new(false));
        let capped = |pipe: Option<Box<dyn Read + Send>>| {
            let overflow = Arc::clone(&overflow);
            let cap = limits.output_bytes;
            std::thread::spawn(move || read_capped(pipe, cap, &overflow, pid))
        };
        let stdout = capped(
            child
                .stdout
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        let stderr = capped(
            child
                .stderr
                .take()
                .map(|p| Box::new(p) as Box<dyn Read + Send>),
        );
        if let Some(mut pipe) = child.stdin.take() {
            let input = stdin.to_vec();
            // A program that never reads its input must not block us: write from a thread, and a
            // closed pipe (the program exited or was killed) is not an error.
            std::thread::spawn(move || {
                let _ = pipe.write_all(&input);
            });
        }
        let status = child
            .wait_timeout(limits.wall)
            .map_err(|e| spawn_err("waiting for the sandbox", e))?;
        let timed_out = status.is_none();
        let status = match status {
            Some(s) => s,
            None => {
                kill(pid);
                child
                    .wait()
                    .map_err(|e| spawn_err("reaping the sandbox", e))?
            }
        };
        let wall = start.elapsed();
        let join = |h: std::thread::JoinHandle<Vec<u8>>| h.join().unwrap_or_default();
        let (stdout, stderr) = (join(stdout), join(stderr));
        let outcome = if overflow.load(Ordering::SeqCst) {
            Outcome::OutputLimit
        } else if timed_out {
            Outcome::TimedOut
        } else if let Some(code) = status.code() {
            Outcome::Exited(code)
        } else {
            Outcome::Signaled(status.signal().unwrap_or(0))
        };
        Ok(Run {
            outcome,
            stdout,
            stderr,
            wall,
        })
    }

    /// `[setpriv …] prlimit … -- bwrap … python3 -I /sandbox/main.py`.
    pub(super) fn command(&self, program: &std::path::Path, limits: &Limits) -> Command {
        let uid = if self.drop_root {
            NOBODY
        } else {
            nix::unistd::getuid().as_raw()
        };
        // The process limit counts every process and thread of the user, so it is set above what
        // the user already runs.
        let processes = user_tasks(uid) + limits.processes;
        let mut argv: Vec<String> = vec![];
        if self.drop_root {
            argv.extend(
                [
                    "setpriv",
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    "--",
                ]
                .map(String::from),
            );
        }
        argv.extend([
            "prlimit".into(),
            format!("--cpu={}", limits.cpu_seconds),
            format!("--as={}", limits.memory_bytes),
            format!("--nproc={processes}"),
            format!("--fsize={}", limits.file_bytes),
            format!("--nofile={}", limits.open_files),
            "--core=0".into(),
            "--".into(),
            self.bwrap.display().to_string(),
        ]);
        #[rustfmt::skip]
        let sandbox = [
            "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--new-session", "--clearenv",
            "--setenv", "PATH", "/usr/bin",
            "--setenv", "HOME", "/tmp",
            "--setenv", "LANG", "C.UTF-8",
            "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
            "--hostname", "sandbox",
            "--ro-bind", "/usr", "/usr",
            "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64",
            "--symlink", "usr/bin", "/bin",
            "--proc", "/proc",
            "--dev", "/dev",
        ];
        argv.extend(sandbox.map(String::from));
        argv.extend([
            "--size".into(),
            limits.tmp_bytes.to_string(),
            "--tmpfs".into(),
            "/tmp".into(),
            "--ro-bind".into(),
            program.display().to_string(),
            "/sandbox/main.py".into(),
            // The sandbox's root is a tmpfs of its own: read-only, so that only the size-limited
            // `/tmp` can be written.
            "--remount-ro".into(),
            "/".into(),
            "--chdir".into(),
            "/tmp".into(),
            self.python.display().to_string(),
            "-I".into(),
            "/sandbox/main.py".into(),
        ]);
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env_clear()
            .env("PATH", "/usr/bin:/bin");
        cmd
    }
}

/// Reads `pipe` to its end keeping at most `cap` bytes; past the cap, flags `overflow` and kills
/// the sandbox (a flood would otherwise run until the deadline).
fn read_capped(
    pipe: Option<Box<dyn Read + Send>>,
    cap: usize,
    overflow: &AtomicBool,
    pid: nix::unistd::Pid,
) -> Vec<u8> {
    let mut kept = Vec::new();
    let Some(mut pipe) = pipe else {
        return kept;
    };
    let mut buf = [0u8; 8192];
    loop {
        match pipe.read(&mut buf) {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                if n > room {
                    overflow.store(true, Ordering::SeqCst);
                    kill(pid);
                    return kept;
                }
            }
        }
    }
}

/// SIGKILL to bwrap; its sandbox (a PID namespace whose init dies with bwrap) goes with it.
fn kill(pid: nix::unistd::Pid) {
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
}

/// Processes and threads of `uid` now (what RLIMIT_NPROC counts), from `/proc`.
pub(super) fn user_tasks(uid: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut tasks = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        };
        if field("Uid:") == Some(u64::from(uid)) {
            tasks += field("Threads:").unwrap_or(1);
        }
    }
    tasks
}
