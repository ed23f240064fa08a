//! Running untrusted programs (model-written code) in a bubblewrap sandbox.
//!
//! A program runs as `/usr/bin/python3 -I` inside `bwrap` with: no network (a new, empty network
//! namespace), its own PID, IPC, UTS and cgroup namespaces (it cannot see or signal anything
//! outside), a read-only `/usr` and nothing else of the host (no `/home`, `/root`, `/etc`, no
//! host `/tmp`), a private `/tmp` tmpfs of [`Limits::tmp_bytes`], a clean environment, a new
//! session (no terminal), and death with its parent. Around bwrap, rlimits bound CPU time,
//! address space, processes and threads, file size and open files; a wall-clock deadline kills
//! the whole sandbox (bwrap's PID namespace dies with it, background processes included); stdout
//! and stderr are capped and a program that floods them is killed.
//!
//! As root, the sandbox first drops to the `nobody` user (`setpriv`): the kernel does not enforce
//! the process limit on root, so a fork bomb would otherwise be bounded only by the deadline.
//! Where bubblewrap is missing or cannot create namespaces, [`Sandbox::detect`] says so and nothing
//! runs: programs never run unsandboxed.

mod run;

use std::path::PathBuf;
use std::time::Duration;

pub use run::{Outcome, Run};

/// The resource limits of one run.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Wall-clock time before the sandbox is killed.
    pub wall: Duration,
    /// CPU seconds (RLIMIT_CPU).
    pub cpu_seconds: u64,
    /// Address space in bytes (RLIMIT_AS).
    pub memory_bytes: u64,
    /// Processes and threads of the sandbox's user (RLIMIT_NPROC).
    pub processes: u64,
    /// Largest file it may write (RLIMIT_FSIZE).
    pub file_bytes: u64,
    /// Open files (RLIMIT_NOFILE).
    pub open_files: u64,
    /// Size of its private `/tmp`.
    pub tmp_bytes: u64,
    /// Bytes of stdout (and, separately, stderr) kept; more kills the program.
    pub output_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            wall: Duration::from_secs(5),
            cpu_seconds: 3,
            memory_bytes: 512 << 20,
            processes: 32,
            file_bytes: 1 << 20,
            open_files: 64,
            tmp_bytes: 16 << 20,
            output_bytes: 64 << 10,
        }
    }
}

/// Why programs cannot run here.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SandboxError {
    #[error(
        "code rewards need bubblewrap ('bwrap' on PATH) to run programs sandboxed, and it was not \
         found; install it (Debian/Ubuntu: apt-get install bubblewrap). Programs never run unsandboxed."
    )]
    NoBubblewrap,
    #[error("'{0}' was not found; code rewards run programs with it inside the sandbox")]
    NoPython(PathBuf),
    #[error(
        "bubblewrap cannot create its namespaces here ({0}); code rewards need unprivileged user \
         namespaces (sysctl kernel.unprivileged_userns_clone=1) or a container that allows them. \
         Programs never run unsandboxed."
    )]
    NoNamespaces(String),
    #[error("starting the sandbox failed: {0}")]
    Spawn(String),
}

/// A checked sandbox: bubblewrap found and able to run a program.
#[derive(Debug, Clone)]
pub struct Sandbox {
    bwrap: PathBuf,
    python: PathBuf,
    /// Running as root: drop to `nobody` first (see the module docs).
    drop_root: bool,
}

/// The interpreter programs run with (the system's, inside the sandbox's read-only `/usr`).
pub const PYTHON: &str = "/usr/bin/python3";

impl Sandbox {
    /// Finds bubblewrap and checks that it can start a sandboxed Python.
    pub fn detect() -> Result<Sandbox, SandboxError> {
        let bwrap = find_on_path("bwrap").ok_or(SandboxError::NoBubblewrap)?;
        let python = PathBuf::from(PYTHON);
        if !python.exists() {
            return Err(SandboxError::NoPython(python));
        }
        let sandbox = Sandbox {
            bwrap,
            python,
            drop_root: nix::unistd::geteuid().is_root(),
        };
        let probe = sandbox.run_python("print(6 * 7)", b"", &Limits::default())?;
        match probe.outcome {
            Outcome::Exited(0) if probe.stdout == b"42\n" => Ok(sandbox),
            _ => Err(SandboxError::NoNamespaces(
                String::from_utf8_lossy(&probe.stderr).trim().to_string(),
            )),
        }
    }

    /// The sandbox of this process, detected once.
    pub fn shared() -> Result<&'static Sandbox, SandboxError> {
        static SHARED: std::sync::OnceLock<Result<Sandbox, SandboxError>> =
            std::sync::OnceLock::new();
        SHARED
            .get_or_init(Sandbox::detect)
            .as_ref()
            .map_err(Clone::clone)
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests;
