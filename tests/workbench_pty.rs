//! The workbench end to end, in a pseudo-terminal: the real binary, driven by keys, its screen
//! read back through a terminal emulator (vt100). From the Runs view it starts the quickstart
//! config (shrunk by overrides typed into the form), sees the dashboard update, opens the samples,
//! stops the run, and quits; the run is then in the store, stopped by the user after a checkpoint.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::pty::{Winsize, openpty};

const ROWS: u16 = 40;
const COLS: u16 = 140;

/// A workbench in a pseudo-terminal.
struct Term {
    child: Child,
    input: std::fs::File,
    screen: Arc<Mutex<vt100::Parser>>,
}

impl Term {
    fn start(store: &Path, cwd: &Path) -> Term {
        let size = Winsize {
            ws_row: ROWS,
            ws_col: COLS,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = openpty(Some(&size), None).unwrap();
        let slave = |fd: &OwnedFd| Stdio::from(fd.try_clone().unwrap());
        let child = common::bin()
            .arg("--store")
            .arg(store)
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

    fn text(&self) -> String {
        self.screen.lock().unwrap().screen().contents()
    }

    fn keys(&mut self, keys: &str) {
        self.input.write_all(keys.as_bytes()).unwrap();
        self.input.flush().unwrap();
        // One key at a time reads like a person typing, and keeps the app's modes in step.
        std::thread::sleep(Duration::from_millis(150));
    }

    /// Wait until the screen shows `what`; panics with the screen after `secs`.
    fn wait_for(&mut self, what: &str, secs: u64) -> String {
        self.wait_until(what, secs, |s| s.contains(what))
    }

    fn wait_until(&mut self, what: &str, secs: u64, ok: impl Fn(&str) -> bool) -> String {
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

impl Drop for Term {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// With `ROLL_E2E_SCREENS=DIR`, keep the screens the test saw (for the README's tour).
fn dump(name: &str, screen: &str) {
    if let Some(dir) = std::env::var_os("ROLL_E2E_SCREENS") {
        let path = Path::new(&dir).join(format!("{name}.txt"));
        std::fs::write(path, screen).unwrap();
    }
}

/// Overrides that keep the quickstart's shape but make it run in seconds: a tiny model, few SFT
/// steps, and many small RL steps so the run is still going when the test stops it.
fn overrides(out: &Path) -> String {
    format!(
        "name=e2e output_dir={} model.init.hidden=32 model.init.layers=1 model.init.heads=2 \
         model.init.kv_heads=1 model.init.intermediate=64 sft.steps=10 sft.batch_size=8 \
         rl.steps=400 rl.prompts_per_step=4 rl.group_size=4 checkpoint.every=0",
        out.display()
    )
}

#[test]
fn start_the_quickstart_watch_it_open_samples_stop_it_and_quit() {
    let dir = tempfile::tempdir().unwrap();
    let experiments = dir.path().join("experiments");
    std::fs::create_dir(&experiments).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::copy(
        root.join("experiments/quickstart.yaml"),
        experiments.join("quickstart.yaml"),
    )
    .unwrap();
    // The fragments the quickstart includes (`../configs/…`).
    for fragment in ["models/tiny-qwen2.yaml", "data/add-and-reverse.yaml"] {
        let to = dir.path().join("configs").join(fragment);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(root.join("configs").join(fragment), to).unwrap();
    }
    let store = dir.path().join("roll.db");

    let mut t = Term::start(&store, dir.path());
    t.wait_for("1 Runs", 60);
    t.wait_for("no store at", 30);

    // The new-run form lists the config; the overrides are typed in.
    t.keys("n");
    t.wait_for("experiments/quickstart.yaml", 30);
    for c in overrides(&dir.path().join("out")).chars() {
        t.input.write_all(c.to_string().as_bytes()).unwrap();
    }
    t.keys("");
    t.wait_for("rl.steps=400", 10);
    t.keys("\r");

    // The run shows up and its dashboard opens by itself, live; it fills as the run goes.
    t.wait_for("● live", 120);
    t.wait_for("loss (sft)", 120);
    let first = t.wait_for("reward (rl)", 300);
    assert!(first.contains("e2e"), "{first}");
    let curves = |s: &str| s.lines().skip(2).collect::<Vec<_>>().join("\n");
    let later = t.wait_until("the curves to change", 120, |s| curves(s) != curves(&first));
    dump("dashboard", &later);

    // Enter drills down into the samples of the newest step.
    t.keys("\r");
    let screen = t.wait_until("the samples of a step", 60, |s| {
        s.lines()
            .any(|l| l.trim_start().starts_with("Samples · step "))
            && s.contains("reward")
    });
    dump("samples", &screen);

    // Back on the runs list the run is live; X asks, y stops it after its step.
    t.keys("1");
    t.wait_for("running", 30);
    t.keys("X");
    dump("stop", &t.wait_for("Stop 'e2e'", 10));
    t.keys("y");
    dump("stopped", &t.wait_for("interrupted", 120));

    // Nothing started here is running any more: q quits at once.
    t.keys("q");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = t.child.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "q did not quit:\n{}", t.text());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status}");

    // The run is in the store: stopped by the user, with its steps and samples recorded.
    let runs: serde_json::Value =
        serde_json::from_str(&common::ok(common::roll(&store, &["runs", "--json"]))).unwrap();
    let run = &runs.as_array().unwrap()[0];
    assert_eq!(run["name"], "e2e");
    assert_eq!(run["status"], "interrupted");
    assert_eq!(run["last_stage"], "rl");
    let last_step = run["last_step"].as_u64().unwrap();
    assert!((1..400).contains(&last_step), "{run}");
    let samples = common::ok(common::roll(&store, &["samples", "e2e", "--json"]));
    let samples: serde_json::Value = serde_json::from_str(&samples).unwrap();
    assert!(samples.as_array().unwrap().len() >= 16);
    // A stop by the user writes a checkpoint, so the run can be resumed.
    let shown = common::ok(common::roll(&store, &["runs", "show", "e2e", "--json"]));
    assert!(shown.contains("checkpoint"), "{shown}");
}
