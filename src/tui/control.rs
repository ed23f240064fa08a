//! Steering runs from the workbench: the new-run form, stop and delete (with a confirmation), pause and
//! continue, resume from the last checkpoint, comparing marked runs, exports, and quitting while
//! runs started here are still going (they continue headless or stop: the user chooses).

use std::path::PathBuf;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::app::{App, Effect, OpenRun, View};
use super::commands::{RunSignal, Started};
use super::launch::{FormOutcome, LaunchForm};
use crate::store::liveness::ProcessIdentity;
use crate::store::{RunId, RunStatus};

/// A question the workbench waits on before it acts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirm {
    /// Quit while runs started here are live: keep them going headless, or stop them.
    Quit { runs: Vec<Started> },
    /// Stop a live run (it checkpoints after its step).
    Stop {
        process: ProcessIdentity,
        name: String,
    },
    /// Delete a run that is not running: its records in the store (never its files).
    Delete { run: RunId, name: String },
    /// Resume a stopped or failed run from its last checkpoint (a new process starts training).
    Resume { name: String, step: String },
}

/// Where exports go, relative to the working directory.
pub const EXPORT_DIR: &str = "exports";

/// A file-name-safe form of `text`.
fn slug(text: &str) -> String {
    // A run's name stays as it is where a file name allows (`agentic_frozenlake`, `QS-2`), so
    // `ls exports/NAME` finds it.
    let s: String = text
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c == '_' {
                c
            } else {
                '-'
            }
        })
        .collect();
    s.split('-')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

impl App {
    pub(super) fn ask_quit(&mut self) -> Vec<Effect> {
        if self.launching > 0 {
            // Its process is not known yet: ask once it is (a moment), so it is not left unasked.
            self.quit_when_started = true;
            self.notice = Some("a run is starting: quitting once it has started…".into());
            return vec![];
        }
        if self.started.is_empty() {
            return self.leave();
        }
        self.confirm = Some(Confirm::Quit {
            runs: self.started.clone(),
        });
        vec![]
    }

    /// Quit: runs paused from here are let go first, so none is left stopped for good.
    fn leave(&mut self) -> Vec<Effect> {
        self.quit = true;
        std::mem::take(&mut self.paused_here)
            .into_iter()
            .map(|process| Effect::Signal {
                process,
                signal: RunSignal::Continue,
            })
            .collect()
    }

    pub(super) fn confirm_key(&mut self, key: KeyEvent) -> Vec<Effect> {
        let Some(confirm) = self.confirm.take() else {
            return vec![];
        };
        let ctrl_c =
            key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
        match (confirm, key.code) {
            (Confirm::Quit { .. }, KeyCode::Char('c' | 'k')) if !ctrl_c => self.leave(),
            (Confirm::Quit { .. }, KeyCode::Char('s')) => {
                // The runs started here as they are now (one may have ended while asking), less
                // those already stopping: a second SIGINT would skip their checkpoint.
                let stops: Vec<Effect> = self
                    .started
                    .iter()
                    .filter(|s| !self.stopping.contains(&s.process.pid))
                    .map(|s| Effect::Signal {
                        process: s.process.clone(),
                        signal: RunSignal::Stop,
                    })
                    .collect();
                let mut effects = self.leave();
                effects.extend(stops);
                effects
            }
            (Confirm::Resume { name, .. }, KeyCode::Char('y')) => {
                self.notice = Some(format!("resuming '{name}' from its last checkpoint…"));
                self.launching += 1;
                self.pending_open.push(name.clone());
                vec![Effect::Resume { run: name }]
            }
            (Confirm::Delete { run, name }, KeyCode::Char('y')) => {
                self.notice = Some(format!("deleting '{name}'…"));
                vec![Effect::DeleteRun { run, name }]
            }
            (Confirm::Stop { process, name }, KeyCode::Char('y')) => {
                self.stopping.push(process.pid);
                self.notice = Some(format!(
                    "stopping '{name}' after its step (it writes a checkpoint)"
                ));
                vec![Effect::Signal {
                    process,
                    signal: RunSignal::Stop,
                }]
            }
            // Anything else (Esc, n, Ctrl-C) answers no.
            _ => vec![],
        }
    }

    pub(super) fn configs_found(&mut self, configs: Vec<PathBuf>) {
        // Names in the store, and those of runs started from here that it does not list yet.
        let listed = self.runs.rows.iter().map(|r| r.info.name.clone());
        let taken = listed.chain(self.pending_open.iter().cloned()).collect();
        self.form = Some(LaunchForm::new(configs, taken));
    }

    pub(super) fn form_key(&mut self, key: KeyEvent) -> Vec<Effect> {
        let Some(form) = self.form.as_mut() else {
            return vec![];
        };
        match form.key(key) {
            FormOutcome::Stay => vec![],
            FormOutcome::Cancel => {
                self.form = None;
                vec![]
            }
            FormOutcome::Launch {
                config,
                overrides,
                name,
            } => {
                self.form = None;
                self.view = View::Runs;
                self.notice = Some(format!("starting '{name}'…"));
                self.launching += 1;
                self.pending_open.push(name.clone());
                vec![Effect::Launch {
                    config,
                    overrides,
                    name,
                }]
            }
        }
    }

    pub(super) fn started(&mut self, run: &str, started: Result<Started, String>) -> Vec<Effect> {
        self.launching = self.launching.saturating_sub(1);
        match started {
            Ok(s) => {
                self.notice = Some(format!(
                    "started `roll-tui {}` (pid {}, log {})",
                    s.what,
                    s.process.pid,
                    s.log.display()
                ));
                self.started.push(s);
            }
            Err(e) => {
                self.pending_open.retain(|n| n != run);
                self.status = Some(e);
            }
        }
        if self.quit_when_started && self.launching == 0 {
            self.quit_when_started = false;
            return self.ask_quit();
        }
        vec![]
    }

    pub(super) fn exited(&mut self, pid: u32, code: Option<i32>, tail: String) -> Vec<Effect> {
        let Some(at) = self.started.iter().position(|s| s.process.pid == pid) else {
            return vec![];
        };
        let s = self.started.remove(at);
        self.stopping.retain(|p| *p != pid);
        self.paused_here.retain(|p| p.pid != pid);
        // Its run is not on its way any more (it may have been too short to be seen live).
        self.pending_open.retain(|n| *n != s.run);
        match code {
            Some(0) => self.notice = Some(format!("`roll-tui {}` finished", s.what)),
            Some(crate::launch::EXIT_INTERRUPTED) => {
                self.notice = Some(format!("`roll-tui {}` stopped", s.what))
            }
            other => {
                let how = other.map_or("was killed".to_string(), |c| format!("exited with {c}"));
                self.status = Some(format!(
                    "`roll-tui {}` {how}: {tail} (log: {})",
                    s.what,
                    s.log.display()
                ));
            }
        }
        vec![Effect::LoadRuns]
    }

    /// Open the run started from here as soon as the store lists it.
    pub(super) fn open_pending(&mut self) -> Vec<Effect> {
        let mut effects = vec![];
        // A drawn run ended (stop polling it, read it once more to the end) or was resumed
        // (follow it again).
        if let Some(d) = self.dashboard.as_mut() {
            for part in d.parts.clone() {
                let Some(row) = self.runs.rows.iter().find(|r| r.info.id == part.run) else {
                    // Deleted (`roll-tui runs rm`): nothing more will come.
                    d.set_live(part.run, false);
                    continue;
                };
                if row.live != part.live {
                    d.set_live(part.run, row.live);
                    effects.push(Effect::LoadSeries {
                        run: part.run,
                        since: part.mark,
                    });
                }
            }
        }
        if let Some((id, was_live)) = self.open.as_ref().map(|o| (o.id, o.live)) {
            let live = self
                .runs
                .rows
                .iter()
                .find(|r| r.info.id == id)
                .is_some_and(|r| r.live);
            if was_live && !live && self.workers.is_some() {
                // Its last events (how it ended) for the workers and events views.
                effects.push(self.load_events(id));
            }
            if let Some(open) = self.open.as_mut() {
                open.live = live;
            }
        }
        let pending = &self.pending_open;
        let Some(row) = self
            .runs
            .rows
            .iter()
            .find(|r| r.live && pending.contains(&r.info.name))
        else {
            return effects;
        };
        self.pending_open.retain(|n| *n != row.info.name);
        self.runs.selected = Some(row.info.id);
        let open = OpenRun {
            id: row.info.id,
            name: row.info.name.clone(),
            live: true,
            start_ms: row.info.created_at,
        };
        effects.extend(self.open_run(open, vec![]));
        effects
    }

    /// The selected run's process, if it is live and on this machine; else says why not.
    fn selected_process(&mut self, verb: &str) -> Option<(ProcessIdentity, String, bool)> {
        let row = self.runs.selected_row()?;
        let name = row.info.name.clone();
        match (row.live, &row.process) {
            (true, Some(process)) => Some((process.clone(), name, row.paused)),
            (true, None) => {
                self.status = Some(format!(
                    "cannot {verb} '{name}': its process is not on this machine"
                ));
                None
            }
            (false, _) => {
                self.status = Some(format!("cannot {verb} '{name}': it is not running"));
                None
            }
        }
    }

    /// `D` on the runs list: a run that is not running may be deleted, after a confirmation.
    pub(super) fn ask_delete(&mut self) {
        let Some(row) = self.runs.selected_row() else {
            return;
        };
        let name = row.info.name.clone();
        if row.live {
            self.status = Some(format!(
                "cannot delete '{name}': it is running (X stops it)"
            ));
            return;
        }
        self.confirm = Some(Confirm::Delete {
            run: row.info.id,
            name,
        });
    }

    pub(super) fn ask_stop(&mut self) {
        if let Some((process, name, _)) = self.selected_process("stop") {
            if self.stopping.contains(&process.pid) {
                self.notice = Some(format!(
                    "'{name}' is already stopping: it ends after its step, with a checkpoint"
                ));
            } else {
                self.confirm = Some(Confirm::Stop { process, name });
            }
        }
    }

    pub(super) fn pause(&mut self) -> Vec<Effect> {
        let Some((process, name, paused)) = self.selected_process("pause") else {
            return vec![];
        };
        let (signal, what) = if paused {
            self.paused_here.retain(|p| *p != process);
            (RunSignal::Continue, "continuing")
        } else {
            self.paused_here.push(process.clone());
            (RunSignal::Pause, "pausing")
        };
        // Shown at once: a second p before the next read must not pause twice.
        if let Some(row) = self
            .runs
            .rows
            .iter_mut()
            .find(|r| r.process.as_ref() == Some(&process))
        {
            row.paused = !paused;
        }
        self.notice = Some(format!("{what} '{name}'"));
        vec![Effect::Signal { process, signal }, Effect::LoadRuns]
    }

    pub(super) fn resume(&mut self) -> Vec<Effect> {
        let Some(row) = self.runs.selected_row() else {
            return vec![];
        };
        let name = row.info.name.clone();
        if row.live {
            self.status = Some(format!("'{name}' is running; there is nothing to resume"));
            return vec![];
        }
        if self.pending_open.contains(&name) {
            self.notice = Some(format!("'{name}' is already starting"));
            return vec![];
        }
        match row.info.status {
            RunStatus::Finished => {
                self.status = Some(format!("'{name}' finished; there is nothing to resume"));
                vec![]
            }
            // Resuming starts a training process: asked first, as stopping one is.
            _ => {
                let step = row.progress();
                self.confirm = Some(Confirm::Resume { name, step });
                vec![]
            }
        }
    }

    /// Open the dashboard of the selected run (or the first marked one) with the other marked
    /// runs overlaid.
    pub(super) fn compare(&mut self) -> Vec<Effect> {
        let marked: Vec<_> = self
            .runs
            .rows
            .iter()
            .filter(|r| self.runs.marked.contains(&r.info.id))
            .collect();
        if marked.len() < 2 {
            self.status = Some("mark two or more runs with Space to compare them".into());
            return vec![];
        }
        let selected = self.runs.selected;
        let first = marked
            .iter()
            .find(|r| Some(r.info.id) == selected)
            .unwrap_or(&marked[0]);
        let open = OpenRun {
            id: first.info.id,
            name: first.info.name.clone(),
            live: first.live,
            start_ms: first.info.created_at,
        };
        let overlay = marked
            .iter()
            .filter(|r| r.info.id != open.id)
            .map(|r| (r.info.id, r.info.name.clone(), r.live))
            .collect();
        self.open_run(open, overlay)
    }

    /// `E`: on the dashboard the focused panel, elsewhere the whole run.
    pub(super) fn export(&mut self) -> Vec<Effect> {
        let (run, name) = match (self.view, &self.open) {
            (View::Runs, _) | (_, None) => match self.runs.selected_row() {
                Some(r) => (r.info.id, r.info.name.clone()),
                None => return vec![],
            },
            (_, Some(o)) => (o.id, o.name.clone()),
        };
        let out = PathBuf::from(EXPORT_DIR).join(slug(&name));
        if self.view == View::Dashboard
            && let Some(d) = &self.dashboard
            && let Some(panel) = d.panels().get(d.focus)
        {
            let keys = panel
                .lines
                .iter()
                .filter_map(|&i| d.series.get(i))
                .map(|s| (s.stage.clone(), s.key.clone()))
                .collect();
            let out = out.join(slug(&panel.title));
            self.notice = Some(format!("exporting the '{}' panel…", panel.title));
            return vec![Effect::Export {
                run,
                name,
                keys: Some(keys),
                out,
            }];
        }
        self.notice = Some(format!("exporting '{name}'…"));
        vec![Effect::Export {
            run,
            name,
            keys: None,
            out,
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_safe_file_names() {
        assert_eq!(slug("reward / mean (add)"), "reward-mean-add");
        assert_eq!(slug("quickstart-2"), "quickstart-2");
        assert_eq!(slug("../x"), "x");
        assert_eq!(slug("agentic_frozenlake"), "agentic_frozenlake");
        assert_eq!(slug("QS 2"), "QS-2");
    }
}
