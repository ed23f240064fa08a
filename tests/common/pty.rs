//! A `roll-tui` in a pseudo-terminal: the real binary, driven by keys, its screen read back
//! through a terminal emulator (vt100).

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::pty::{Winsize, openpty};

pub const ROWS: u16 = 40;
pub const COLS: u16 = 140;

/// A workbench in a pseudo-terminal.
pub struct Term {
    pub child: Child,
    pub input: std::fs::File,
    screen: Arc<Mutex<vt100::Parser>>,
}

impl Term {
    /// `roll-tui --store STORE ARGS…` in `cwd` (no `ARGS`: the workbench).
    pub fn start(store: &Path, cwd: &Path, args: &[&str]) -> Term {
        let size = Winsize {
            ws_row: ROWS,
            ws_col: COLS,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = openpty(Some(&size), None).unwrap();
        let slave = |fd: &OwnedFd| Stdio::from(fd.try_clone().unwrap());
        let child = super::bin()
            .arg("--store")
            .arg(store)
            .args(args)
            .current_dir(cwd)
            // No user config: the default keys.
            .env("XDG_CONFIG_HOME", cwd)
            .env_remove("ROLL_TUI_CONFIG")
            .env("TERM", "xterm-256color")
            .stdin(slave(&pty.slave))
            .stdout(slave(&pty.slave))
            .stderr(slave(&pty.slave))
            .spawn()
            .unwrap();
        drop(pty.slave);
        let master = std::fs::File::from(pty.master);
        let input = master.try_clone().unwrap();
        let screen = Arc::new(Mutex::new(vt100::Parser::new(
            std::num::NonZeroU16::new(ROWS).unwrap(),
            std::num::NonZeroU16::new(COLS).unwrap(),
            0,
        )));
        let sink = screen.clone();
        std::thread::spawn(move || {
            let mut master = master;
            let mut buf = [0u8; 8192];
            // Ends with an error (EIO) once the workbench has exited.
            while let Ok(n) = master.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().process(&buf[..n]);
            }
        });
        Term {
            child,
            input,
            screen,
        }
    }

    pub fn text(&self) -> String {
        self.screen.lock().unwrap().screen().contents()
    }

    pub fn keys(&mut self, keys: &str) {
        self.input.write_all(keys.as_bytes()).unwrap();
        self.input.flush().unwrap();
        // One key at a time reads like a person typing, and keeps the app's modes in step.
        std::thread::sleep(Duration::from_millis(150));
    }

    /// Wait until the screen shows `what`; panics with the screen after `secs`.
    pub fn wait_for(&mut self, what: &str, secs: u64) -> String {
        self.wait_until(what, secs, |s| s.contains(what))
    }

    pub fn wait_until(&mut self, what: &str, secs: u64, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let text = self.text();
            if ok(&text) {
                return text;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the workbench exited ({status}) waiting for {what}; screen:\n{text}");
            }
            if Instant::now() > deadline {
                panic!("no {what} after {secs} s; screen:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Term {
    /// Wait for the program to exit; panics with the screen after `secs`.
    pub fn wait_exit(&mut self, secs: u64) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "no exit after {secs} s:\n{}",
                self.text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Term {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// With `ROLL_E2E_SCREENS=DIR`, keep the screens the test saw (for docs/workbench.md's screens).
pub fn dump(name: &str, screen: &str) {
    if let Some(dir) = std::env::var_os("ROLL_E2E_SCREENS") {
        let path = Path::new(&dir).join(format!("{name}.txt"));
        std::fs::write(path, screen).unwrap();
    }
}
