//! Hostile programs in the code sandbox: each is contained, the host is checked afterwards (no
//! process of the sandbox left, no file written outside it, no secret read, the host's listener
//! never reached, a sentinel process alive), and the honest solution still scores 1.
//!
//! Needs bubblewrap (`apt-get install bubblewrap`; `.ci/run` installs it): without it these tests
//! fail with the sandbox's own error, since code rewards never run unsandboxed.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::net::TcpListener;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use roll::reward::code_sandbox::{Params, Scoring, score};
use roll::sandbox::{Limits, Outcome, Run, Sandbox};

/// One hostile run at a time, so that "no sandbox process left" sees only its own.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn limits() -> Limits {
    Limits {
        wall: Duration::from_secs(3),
        cpu_seconds: 2,
        ..Limits::default()
    }
}

fn sandbox() -> &'static Sandbox {
    Sandbox::shared().unwrap_or_else(|e| panic!("{e}"))
}

/// Processes on the host running a sandboxed program.
fn sandboxed_processes() -> Vec<String> {
    let mut found = vec![];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains("/sandbox/main.py") {
                found.push(format!(
                    "{}: {cmdline}",
                    entry.file_name().to_string_lossy()
                ));
            }
        }
    }
    found
}

/// Runs `program` and checks that nothing of the sandbox is left on the host.
fn contained(program: &str) -> Run {
    contained_within(program, &limits())
}

/// [`contained`] under other limits.
fn contained_within(program: &str, limits: &Limits) -> Run {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let run = sandbox().run_python(program, b"", limits).unwrap();
    assert!(
        run.wall < Duration::from_secs(10),
        "the deadline bounds every run: {:?}",
        run.wall
    );
    let left = sandboxed_processes();
    assert!(left.is_empty(), "left on the host: {left:?}");
    run
}

fn stdout(run: &Run) -> String {
    String::from_utf8_lossy(&run.stdout).into_owned()
}

#[test]
fn the_honest_solution_scores_one_and_a_wrong_one_zero() {
    let truth =
        r#"{"tests": [{"stdin": "1 2\n", "stdout": "3\n"}, {"stdin": "40 2", "stdout": "42"}]}"#;
    let right = "```python\na, b = map(int, input().split())\nprint(a + b)\n```";
    let wrong = "```python\na, b = map(int, input().split())\nprint(a * b)\n```";
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let out = score(right, truth, &Params::default());
    assert_eq!((out.score, out.correct, out.error), (1.0, true, None));
    // 1·2 = 2 (not 3), 40·2 = 80 (not 42): both fail.
    assert_eq!(score(wrong, truth, &Params::default()).score, 0.0);
    let asserts = r#"{"asserts": ["assert f(1) == 2", "assert f(2) == 5", "assert f(0) == 0"]}"#;
    let double = "```python\ndef f(x):\n    return 2 * x\n```";
    // f(2) = 4 fails its assert: all-or-nothing gives 0, the fraction 2 of 3.
    assert_eq!(score(double, asserts, &Params::default()).score, 0.0);
    let fraction = Params {
        scoring: Scoring::Fraction,
        ..Params::default()
    };
    let out = score(double, asserts, &fraction);
    assert!((out.score - 2.0 / 3.0).abs() < 1e-6, "{}", out.score);
}

#[test]
fn a_fork_bomb_is_contained() {
    let run = contained(
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n",
    );
    assert_ne!(run.outcome, Outcome::Exited(0));
}

#[test]
fn a_thread_bomb_is_contained() {
    let run = contained(
        "import threading, time\nn = 0\ntry:\n    while True:\n        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n        n += 1\nexcept RuntimeError:\n    print('threads', n)\n",
    );
    let out = stdout(&run);
    let n: u64 = out
        .trim()
        .strip_prefix("threads ")
        .unwrap()
        .parse()
        .unwrap();
    assert!(n < limits().processes, "{n} threads started");
}

/// The hog touches every page it gets (a bytearray is zeroed), and first touches are slow on a
/// virtual machine whose host backs the pages then: 448 MiB took from 0.3 to 1.8 s of CPU time
/// on this project's machines. So it runs with the memory limit it tests lowered to 256 MiB and
/// a CPU limit that only a hog the memory limit failed to stop would reach.
#[test]
fn a_memory_hog_gets_a_memory_error() {
    let limits = Limits {
        wall: Duration::from_secs(8),
        cpu_seconds: 6,
        memory_bytes: 256 << 20,
        ..Limits::default()
    };
    let run = contained_within(
        "chunks = []\ntry:\n    while True:\n        chunks.append(bytearray(32 << 20))\nexcept MemoryError:\n    print('stopped at', len(chunks) * 32, 'MiB')\n",
        &limits,
    );
    let out = stdout(&run);
    let mib: u64 = out
        .split_whitespace()
        .nth(2)
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("no MemoryError: {run:?}"));
    assert!(mib < 256, "{out}");
}

#[test]
fn an_infinite_loop_and_a_sleep_are_stopped() {
    let spin = contained("while True:\n    pass\n");
    // The CPU limit (SIGXCPU) or the deadline, whichever comes first.
    assert!(
        matches!(
            spin.outcome,
            Outcome::Signaled(_) | Outcome::TimedOut | Outcome::Exited(_)
        ) && !spin.succeeded(),
        "{:?}",
        spin.outcome
    );
    let sleep = contained("import time\ntime.sleep(10**6)\n");
    assert_eq!(sleep.outcome, Outcome::TimedOut);
}

#[test]
fn an_output_flood_is_cut_at_the_cap() {
    let run = contained("while True:\n    print('x' * 1000)\n");
    assert_eq!(run.outcome, Outcome::OutputLimit);
    assert_eq!(run.stdout.len(), limits().output_bytes);
}

#[test]
fn a_disk_fill_stays_in_its_small_tmp() {
    let run = contained(
        "import os\nn = 0\ntry:\n    while True:\n        with open(f'/tmp/f{n}', 'wb') as f:\n            f.write(b'x' * (512 << 10))\n        n += 1\nexcept OSError as e:\n    print('files', n)\n",
    );
    let out = stdout(&run);
    let files: u64 = out.trim().strip_prefix("files ").unwrap().parse().unwrap();
    // 16 MiB of tmpfs holds at most 32 files of 512 KiB.
    assert!(files <= 32, "{out}");
    // The host's /tmp has none of them.
    assert!(!std::path::Path::new("/tmp/f0").exists() || files == 0);
}

#[test]
fn the_network_writes_outside_tmp_and_host_secrets_are_out_of_reach() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let secret_dir = tempfile::tempdir().unwrap();
    let secret = secret_dir.path().join("token");
    std::fs::write(&secret, "roll-secret-7f3a").unwrap();
    let program = format!(
        r#"import os, socket
for host in [("127.0.0.1", {port}), ("1.1.1.1", 80)]:
    try:
        socket.create_connection(host, timeout=1)
        print("connected", host)
    except OSError:
        print("no network", host)
for path in ["/usr/evil", "/sandbox/main.py", "/evil", "{host_file}"]:
    try:
        open(path, "w").write("x")
        print("wrote", path)
    except OSError:
        print("read-only", path)
for path in ["{secret}", "/etc/shadow", "/root/.bashrc", "/home"]:
    try:
        print("read", path, open(path).read())
    except OSError:
        print("unreadable", path)
print("env", sorted(os.environ))
"#,
        host_file = secret_dir.path().join("planted").display(),
        secret = secret.display(),
    );
    let run = contained(&program);
    let out = stdout(&run);
    assert!(
        run.succeeded(),
        "{out}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(!out.contains("connected"), "{out}");
    assert!(
        listener.accept().is_err(),
        "the host's listener was reached"
    );
    assert!(!out.contains("wrote"), "{out}");
    assert!(!secret_dir.path().join("planted").exists());
    assert!(
        !out.contains("roll-secret-7f3a") && !out.contains("read "),
        "{out}"
    );
    // A clean environment: none of the test process's variables (CARGO_*, PATH of the host, …).
    let env_line = out.lines().find(|l| l.starts_with("env")).unwrap();
    assert!(!env_line.contains("CARGO"), "{env_line}");
}

#[test]
fn killing_its_parent_and_outliving_the_run_fail() {
    let mut sentinel = Command::new("sleep").arg("30").spawn().unwrap();
    let run = contained(
        "import os, signal\nprint('parent', os.getppid(), flush=True)\nfor pid in [os.getppid(), 1, -1]:\n    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError as e:\n        print('kill', pid, 'refused')\n",
    );
    assert!(
        sentinel.try_wait().unwrap().is_none(),
        "a host process was killed"
    );
    sentinel.kill().unwrap();
    sentinel.wait().unwrap();
    // In its own PID namespace its parent is the namespace's init (pid 1), which it cannot kill;
    // and nothing of the host is visible to `kill(-1)`.
    assert!(stdout(&run).starts_with("parent 1\n"), "{}", stdout(&run));
    // A daemon forked into its own session: the run ends when the program does, and the daemon
    // dies with the sandbox (`contained` checks that no process is left).
    let daemon = contained(
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nelse:\n    print('parent done')\n",
    );
    assert!(daemon.wall < Duration::from_secs(3), "{:?}", daemon.wall);
    assert!(stdout(&daemon).contains("parent done"));
}

#[test]
fn a_reward_worker_survives_hostile_responses_in_a_batch() {
    // Scoring goes on after each hostile response, and the honest one after them scores 1.
    let truth = r#"{"tests": [{"stdin": "2 3\n", "stdout": "5\n"}]}"#;
    let fast = Params {
        timeout_s: 2.0,
        ..Params::default()
    };
    for program in [
        "import os\nwhile True:\n    os.fork()\n",
        "while True:\n    print('y' * 4096)\n",
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n",
        "a, b = map(int, input().split())\nprint(a + b)\n",
    ] {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        let out = score(&format!("```python\n{program}```"), truth, &fast);
        let honest = program.contains("a + b");
        assert_eq!(out.correct, honest, "{program}");
    }
}
