//! The new-run form: pick a run config from `configs/` or `experiments/` (fragments, which have no
//! `name:`, are not offered), edit `key=value` overrides,
//! start it. The config is loaded and validated with the overrides before anything starts, so a
//! typo is an error in the form, not a failed process; a name already in the store gets a free
//! `name=` override proposed, since `run` refuses to replace a run without `--overwrite`.

use std::path::{Path, PathBuf};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Frame;
use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{List, ListItem, ListState, Paragraph, Wrap};

use super::theme::Theme;
use crate::config::RunConfig;

/// The folders the form offers configs from, relative to the working directory.
pub const CONFIG_DIRS: [&str; 2] = ["configs", "experiments"];

/// Every `*.yaml`/`*.yml` directly in `dirs`, sorted; missing folders are skipped.
pub fn find_configs(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut found = vec![];
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut here: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            // Fragments (model shapes, placements, …) are included by run configs, not run.
            .filter(|p| crate::config::is_runnable(p))
            .collect();
        here.sort();
        found.extend(here);
    }
    found
}

/// What a key did to the form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormOutcome {
    Stay,
    Cancel,
    /// Start `roll-tui run CONFIG OVERRIDES…`; the run will be called `name`.
    Launch {
        config: PathBuf,
        overrides: Vec<String>,
        name: String,
    },
}

#[derive(Debug)]
pub struct LaunchForm {
    pub configs: Vec<PathBuf>,
    pub selected: usize,
    pub overrides: String,
    /// Why the form cannot start the selected config as it stands.
    pub error: Option<String>,
    /// Run names already in the store.
    taken: Vec<String>,
    /// The overrides were proposed by the form (and follow the selection) until the user types.
    proposed: bool,
    /// What the selected config does: its opening comment and its stages, model and data.
    pub summary: Vec<String>,
}

impl LaunchForm {
    pub fn new(configs: Vec<PathBuf>, taken: Vec<String>) -> LaunchForm {
        let mut form = LaunchForm {
            configs,
            selected: 0,
            overrides: String::new(),
            error: None,
            taken,
            proposed: true,
            summary: vec![],
        };
        form.propose();
        form
    }

    pub fn selected_config(&self) -> Option<&Path> {
        self.configs.get(self.selected).map(PathBuf::as_path)
    }

    fn overrides_list(&self) -> Vec<String> {
        self.overrides
            .split_whitespace()
            .map(str::to_string)
            .collect()
    }

    /// Propose a free `name=` when the selected config's own name is taken.
    fn propose(&mut self) {
        self.error = None;
        self.summary = self.selected_config().map(describe).unwrap_or_default();
        let Some(path) = self.selected_config() else {
            self.error = Some(format!(
                "no configs found in {} (in the working directory)",
                CONFIG_DIRS.join("/ or ")
            ));
            return;
        };
        if !self.proposed {
            self.check();
            return;
        }
        match RunConfig::load(path, &[]) {
            Ok(cfg) => {
                self.overrides = if self.taken.contains(&cfg.name) {
                    format!("name={}", self.free_name(&cfg.name))
                } else {
                    String::new()
                };
            }
            Err(e) => self.error = Some(e.to_string()),
        }
    }

    fn free_name(&self, base: &str) -> String {
        (2..)
            .map(|n| format!("{base}-{n}"))
            .find(|n| !self.taken.contains(n))
            .unwrap_or_else(|| base.to_string())
    }

    /// Load the selected config with the overrides: its run name, or why it cannot start.
    fn check(&mut self) -> Option<String> {
        self.error = None;
        let path = self.selected_config()?.to_path_buf();
        match RunConfig::load(&path, &self.overrides_list()) {
            Ok(cfg) if self.taken.contains(&cfg.name) => {
                self.error = Some(format!(
                    "a run named '{}' is already in the store: add name=… to start a new one",
                    cfg.name
                ));
                None
            }
            Ok(cfg) => Some(cfg.name),
            Err(e) => {
                self.error = Some(e.to_string());
                None
            }
        }
    }

    pub fn key(&mut self, key: KeyEvent) -> FormOutcome {
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        match key.code {
            KeyCode::Esc => return FormOutcome::Cancel,
            KeyCode::Char('c') if ctrl => return FormOutcome::Cancel,
            KeyCode::Up | KeyCode::Down if !self.configs.is_empty() => {
                let n = self.configs.len();
                self.selected = match key.code {
                    KeyCode::Up => (self.selected + n - 1) % n,
                    _ => (self.selected + 1) % n,
                };
                self.propose();
            }
            KeyCode::Enter => {
                if let (Some(name), Some(config)) =
                    (self.check(), self.selected_config().map(Path::to_path_buf))
                {
                    return FormOutcome::Launch {
                        config,
                        overrides: self.overrides_list(),
                        name,
                    };
                }
            }
            KeyCode::Backspace => {
                self.overrides.pop();
                self.proposed = false;
                self.error = None;
            }
            KeyCode::Char('u') if ctrl => {
                self.overrides.clear();
                self.proposed = false;
                self.error = None;
            }
            KeyCode::Char(c) if !ctrl => {
                self.overrides.push(c);
                self.proposed = false;
                self.error = None;
            }
            _ => {}
        }
        FormOutcome::Stay
    }
}

/// What the config at `path` does, for the form: the first line of its opening comment, then
/// its stages with their steps, its model and its domains (nothing more when it does not load:
/// the form says why).
pub fn describe(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut lines: Vec<String> = text
        .lines()
        .map_while(|l| l.strip_prefix('#'))
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
        .into_iter()
        .collect();
    if let Ok(cfg) = RunConfig::load(path, &[]) {
        let stages: Vec<String> = cfg
            .stages()
            .iter()
            .map(|s| format!("{} {}", s.stage(), cfg.steps_of(s.stage())))
            .collect();
        let model = match (&cfg.model.path, &cfg.model.init) {
            (Some(dir), _) => format!("'{}'", dir.display()),
            (None, Some(i)) => format!(
                "random {} ({} layer{}, hidden {})",
                i.arch.model_type(),
                i.layers,
                crate::text::plural_s(i.layers),
                i.hidden
            ),
            (None, None) => "no model".into(),
        };
        let domains: Vec<&str> = cfg.data.domains.iter().map(|d| d.name.as_str()).collect();
        let agentic = cfg.rl.as_ref().and_then(|rl| rl.env.as_ref());
        let data = match agentic {
            Some(env) => format!("env {}", env.name),
            None => format!("data {}", domains.join(", ")),
        };
        lines.push(format!("{} steps · {model} · {data}", stages.join(" → ")));
    }
    lines
}

pub fn render(frame: &mut Frame, area: Rect, form: &LaunchForm, theme: &Theme) {
    let size = (76, (form.configs.len() as u16 + 16).max(18));
    let inner = super::ui::modal(frame, area, size, Flex::Center, " new run ".into(), theme);
    let [list_area, summary, label, input, error, hint] = Layout::vertical([
        Constraint::Min(1),
        Constraint::Length(4),
        Constraint::Length(1),
        Constraint::Length(3),
        Constraint::Length(3),
        Constraint::Length(1),
    ])
    .areas(inner);
    let items: Vec<ListItem> = form
        .configs
        .iter()
        .map(|p| ListItem::new(p.display().to_string()))
        .collect();
    let mut state = ListState::default().with_selected(Some(form.selected));
    frame.render_stateful_widget(
        List::new(items)
            .highlight_style(theme.selected)
            .highlight_symbol("▶ "),
        list_area,
        &mut state,
    );
    // The config's own words muted, what it runs plain.
    let summary_lines: Vec<Line> = form
        .summary
        .iter()
        .enumerate()
        .map(|(n, l)| match n + 1 < form.summary.len() {
            true => Line::styled(l.as_str(), theme.muted),
            false => Line::raw(l.as_str()),
        })
        .collect();
    frame.render_widget(
        Paragraph::new(summary_lines).wrap(Wrap { trim: true }),
        summary,
    );
    frame.render_widget(
        Paragraph::new(Span::styled(
            "overrides (key.sub=value, space-separated):",
            theme.muted,
        )),
        label,
    );
    // The end of the text, where typing happens, stays in view: long overrides scroll.
    let room = (usize::from(input.width) * usize::from(input.height)).saturating_sub(1);
    let chars: Vec<char> = form.overrides.chars().collect();
    let shown: String = chars[chars.len().saturating_sub(room)..].iter().collect();
    frame.render_widget(
        Paragraph::new(Line::from(vec![
            Span::raw(shown),
            Span::styled("▏", theme.muted),
        ]))
        .wrap(Wrap { trim: false }),
        input,
    );
    if let Some(e) = &form.error {
        frame.render_widget(
            Paragraph::new(Span::styled(e.as_str(), theme.bad)).wrap(Wrap { trim: true }),
            error,
        );
    }
    frame.render_widget(
        Paragraph::new(Span::styled(
            "↑↓ config · type overrides · Ctrl-u clear · Enter start · Esc cancel",
            theme.muted,
        )),
        hint,
    );
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // tests may panic on failure
mod tests {
    use super::*;

    const CONFIG: &str = r#"
name: tiny
seed: 1
model:
  init: { arch: qwen2, hidden: 32, layers: 1, heads: 2, kv_heads: 1, intermediate: 64, chars: "0123456789+=" }
data:
  domains:
    - { name: add, synthetic: { task: addition, count: 40, digits: 1 }, reward: math_rule }
sft: { steps: 2, batch_size: 4, optimizer: { lr: 0.01 } }
"#;

    fn press(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn dir_with_configs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let exp = dir.path().join("experiments");
        std::fs::create_dir(&exp).unwrap();
        std::fs::write(exp.join("b.yaml"), CONFIG).unwrap();
        std::fs::write(
            exp.join("a.yml"),
            CONFIG.replace("name: tiny", "name: other"),
        )
        .unwrap();
        std::fs::write(exp.join("notes.txt"), "not a config").unwrap();
        // A fragment to include (no `name:`) is not offered.
        let configs = dir.path().join("configs");
        std::fs::create_dir(&configs).unwrap();
        std::fs::write(
            configs.join("shape.yaml"),
            "model:\n  init: { arch: qwen2 }\n",
        )
        .unwrap();
        dir
    }

    #[test]
    fn the_form_says_what_the_selected_config_does() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tiny.yaml");
        let text = format!("#\n# Tiny: adds digits.\n# More words.\n{CONFIG}");
        std::fs::write(&path, text).unwrap();
        assert_eq!(
            describe(&path),
            [
                "Tiny: adds digits.",
                "sft 2 steps · random qwen2 (1 layer, hidden 32) · data add"
            ]
        );
        let form = LaunchForm::new(vec![path.clone()], vec![]);
        assert_eq!(form.summary.len(), 2);
        // A broken config says only its comment; the form's error says why it cannot start.
        std::fs::write(&path, "# Broken.\nname: x\nsft: 3\n").unwrap();
        assert_eq!(describe(&path), ["Broken."]);
    }

    #[test]
    fn configs_are_found_sorted_and_missing_folders_skipped() {
        let dir = dir_with_configs();
        let found = find_configs(&[dir.path().join("configs"), dir.path().join("experiments")]);
        let names: Vec<_> = found
            .iter()
            .map(|p| p.file_name().unwrap().to_str().unwrap())
            .collect();
        assert_eq!(names, ["a.yml", "b.yaml"]);
    }

    #[test]
    fn a_taken_name_gets_a_free_one_proposed_and_typing_edits_the_overrides() {
        let dir = dir_with_configs();
        let configs = find_configs(&[dir.path().join("experiments")]);
        let taken = vec!["tiny".to_string(), "tiny-2".to_string()];
        let mut form = LaunchForm::new(configs, taken);
        assert_eq!(form.overrides, "", "'other' is free");
        form.key(press(KeyCode::Down));
        assert_eq!(form.overrides, "name=tiny-3");
        for c in " seed=9".chars() {
            form.key(press(KeyCode::Char(c)));
        }
        match form.key(press(KeyCode::Enter)) {
            FormOutcome::Launch {
                overrides, name, ..
            } => {
                assert_eq!(overrides, ["name=tiny-3", "seed=9"]);
                assert_eq!(name, "tiny-3");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_overrides_and_taken_names_are_errors_in_the_form() {
        let dir = dir_with_configs();
        let configs = find_configs(&[dir.path().join("experiments")]);
        let mut form = LaunchForm::new(configs, vec!["other".into()]);
        form.key(KeyEvent::new(KeyCode::Char('u'), KeyModifiers::CONTROL));
        assert_eq!(form.key(press(KeyCode::Enter)), FormOutcome::Stay);
        assert!(form.error.as_deref().unwrap().contains("'other'"));
        for c in "name=x sft.stepz=3".chars() {
            form.key(press(KeyCode::Char(c)));
        }
        assert_eq!(form.key(press(KeyCode::Enter)), FormOutcome::Stay);
        assert!(
            form.error.as_deref().unwrap().contains("stepz"),
            "{:?}",
            form.error
        );
        assert_eq!(form.key(press(KeyCode::Esc)), FormOutcome::Cancel);
    }

    #[test]
    fn no_configs_is_said_and_enter_does_nothing() {
        let mut form = LaunchForm::new(vec![], vec![]);
        assert!(form.error.as_deref().unwrap().contains("no configs"));
        assert_eq!(form.key(press(KeyCode::Enter)), FormOutcome::Stay);
        assert_eq!(form.key(press(KeyCode::Down)), FormOutcome::Stay);
    }
}
