//! One external environment program: started with its stdin and stdout piped, asked one JSON line
//! at a time, and answered within a deadline. Everything that can go wrong with another program —
//! it cannot start, exits, stops answering, or answers something that is not one JSON object — is
//! an [`EnvFailure`] that names the program and ends with the tail of what it wrote to stderr.
//! Nothing here blocks past the deadline: stdout and stderr are read by threads of their own.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::env::EnvFailure;

/// How much of the program's stderr a failure quotes.
const STDERR_TAIL_BYTES: usize = 2000;

/// How long a program may take to exit after its stdin closes before it is killed.
const EXIT_GRACE: Duration = Duration::from_millis(500);

/// The longest reply line quoted in an error.
const QUOTE_CHARS: usize = 200;

pub(super) struct Program {
    /// How the program is named in errors (its command line).
    label: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<std::io::Result<String>>,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    stderr_reader: Option<JoinHandle<()>>,
}

impl Program {
    /// Start `command` (program and arguments).
    pub fn spawn(command: &[String]) -> Result<Program, EnvFailure> {
        let label = shlex::try_join(command.iter().map(String::as_str))
            .unwrap_or_else(|_| command.join(" "));
        let (program, args) = command
            .split_first()
            .ok_or_else(|| EnvFailure("external env: the command is empty".into()))?;
        let mut child = Command::new(program)
            .args(args)
            // A group of its own, so a stop reaches what it started too (`sh -c`, `uv run`).
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| EnvFailure(format!("external env '{label}' could not start: {e}")))?;
        let (stdout, stderr_pipe) = match (child.stdout.take(), child.stderr.take()) {
            (Some(o), Some(e)) => (o, e),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(EnvFailure(format!(
                    "external env '{label}': its stdout or stderr could not be piped"
                )));
            }
        };
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let end = line.is_err();
                if tx.send(line).is_err() || end {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let tail = Arc::clone(&stderr);
        let stderr_reader = std::thread::spawn(move || {
            let mut pipe = stderr_pipe;
            let mut buf = [0u8; 1024];
            while let Ok(n) = pipe.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let Ok(mut tail) = tail.lock() else { break };
                tail.extend(&buf[..n]);
                let excess = tail.len().saturating_sub(STDERR_TAIL_BYTES);
                tail.drain(..excess);
            }
        });
        Ok(Program {
            label,
            stdin: child.stdin.take(),
            child,
            lines,
            stderr,
            stderr_reader: Some(stderr_reader),
        })
    }

    /// Send `request` and wait at most `timeout` for its one-line reply, a JSON object. A reply
    /// with an `error` field is the program saying it failed.
    pub fn call(
        &mut self,
        request: &Value,
        timeout: Duration,
    ) -> Result<Map<String, Value>, EnvFailure> {
        let cmd = request["cmd"].as_str().unwrap_or("?").to_string();
        // A line nobody asked for would answer this request in place of its own reply.
        if let Ok(extra) = self.lines.try_recv() {
            let extra = extra.unwrap_or_default();
            return Err(self.fail(&format!(
                "wrote a line nobody asked for before '{cmd}': '{}' (stdout carries only replies; \
                 write anything else to stderr)",
                quote(&extra)
            )));
        }
        let mut line = request.to_string();
        line.push('\n');
        let sent = match self.stdin.as_mut() {
            Some(stdin) => stdin
                .write_all(line.as_bytes())
                .and_then(|()| stdin.flush()),
            None => Err(std::io::ErrorKind::BrokenPipe.into()),
        };
        if sent.is_err() {
            return Err(self.exited(&format!("exited before it was sent '{cmd}'")));
        }
        let reply = match self.lines.recv_timeout(timeout) {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => {
                return Err(self.exited(&format!("broke its stdout while answering '{cmd}': {e}")));
            }
            Err(RecvTimeoutError::Timeout) => {
                return Err(self.fail(&format!(
                    "did not answer '{cmd}' within {} s (step_timeout)",
                    timeout.as_secs_f64()
                )));
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(self.exited(&format!("exited while answering '{cmd}'")));
            }
        };
        let parsed: Result<Value, _> = serde_json::from_str(&reply);
        let object = match parsed {
            Ok(Value::Object(o)) => o,
            Ok(_) | Err(_) => {
                return Err(self.fail(&format!(
                    "answered '{cmd}' with a line that is not a JSON object: '{}'",
                    quote(&reply)
                )));
            }
        };
        if let Some(error) = object.get("error") {
            let error = error
                .as_str()
                .map_or_else(|| error.to_string(), str::to_string);
            return Err(self.fail(&format!("reported an error for '{cmd}': {error}")));
        }
        Ok(object)
    }

    /// A failure of this program while it was running: it is stopped (a program that misbehaved
    /// once is not asked again), and the message gets its stderr tail.
    pub fn fail(&mut self, what: &str) -> EnvFailure {
        self.failure(what, false)
    }

    /// The program ended by itself: the message also says how.
    fn exited(&mut self, what: &str) -> EnvFailure {
        self.failure(what, true)
    }

    fn failure(&mut self, what: &str, exited: bool) -> EnvFailure {
        let status = self.stop();
        let stderr = self.stderr_tail();
        let mut message = format!("external env '{}' {what}", self.label);
        // The status of a program stopped here says nothing about it.
        if let Some(status) = status.filter(|_| exited) {
            message.push_str(&format!(" ({status})"));
        }
        match stderr.trim() {
            "" => message.push_str("; it wrote nothing to stderr"),
            tail => message.push_str(&format!("; stderr tail:\n{tail}")),
        }
        EnvFailure(message)
    }

    /// Close stdin (the protocol's signal to exit), give the program [`EXIT_GRACE`] to do so,
    /// then kill it. Returns how it ended, when known.
    fn stop(&mut self) -> Option<std::process::ExitStatus> {
        drop(self.stdin.take());
        let deadline = Instant::now() + EXIT_GRACE;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(None) | Err(_) => {
                    // The whole group: whatever the program started goes with it.
                    if let Ok(pid) = i32::try_from(self.child.id()) {
                        let group = nix::unistd::Pid::from_raw(pid);
                        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
                    }
                    let _ = self.child.kill();
                    return self.child.wait().ok();
                }
            }
        }
    }

    /// The last [`STDERR_TAIL_BYTES`] the program wrote to stderr. Once it has exited, its stderr
    /// is read to the end first (unless a child of it still holds the pipe open).
    fn stderr_tail(&mut self) -> String {
        if let Some(reader) = self.stderr_reader.take() {
            let deadline = Instant::now() + EXIT_GRACE;
            while !reader.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        let tail = match self.stderr.lock() {
            Ok(t) => t.iter().copied().collect::<Vec<u8>>(),
            Err(_) => vec![],
        };
        String::from_utf8_lossy(&tail).into_owned()
    }

    /// Send `request` expecting no reply (closing one instance of a shared worker); best effort.
    pub fn send(&mut self, request: &Value) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = writeln!(stdin, "{request}").and_then(|()| stdin.flush());
        }
    }

    /// Ask the program to close and make sure it is gone.
    pub fn close(mut self) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = stdin.write_all(b"{\"cmd\":\"close\"}\n");
            let _ = stdin.flush();
        }
        self.stop();
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // `close` already waited; this catches a program dropped without it (a panic, a failure).
        if self.stdin.is_some() {
            self.stop();
        }
    }
}

fn quote(line: &str) -> String {
    let mut q: String = line.chars().take(QUOTE_CHARS).collect();
    if line.chars().count() > QUOTE_CHARS {
        q.push('…');
    }
    q
}
