//! The command palette (`:`): every action of the current view by name, narrowed as one types
//! (each typed word must appear in the action's description or its keys), run with Enter. It lists
//! the same actions and keys as the help screen, so nothing can be done here that a key cannot.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Frame;
use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Row, Table, TableState};

use super::action::{Action, Binding, Entry, Scope, entries};
use super::theme::Theme;

#[derive(Debug, Clone, PartialEq)]
pub enum PaletteOutcome {
    Stay,
    Close,
    Run(Action),
}

#[derive(Debug)]
pub struct Palette {
    pub text: String,
    pub selected: usize,
    all: Vec<Entry>,
}

impl Palette {
    pub fn new(keys: &[Binding], scope: Scope) -> Palette {
        Palette {
            text: String::new(),
            selected: 0,
            all: entries(keys, scope),
        }
    }

    /// The entries every typed word matches.
    pub fn matches(&self) -> Vec<&Entry> {
        let words: Vec<String> = self
            .text
            .split_whitespace()
            .map(str::to_lowercase)
            .collect();
        self.all
            .iter()
            .filter(|e| {
                let hay = format!("{} {}", e.what, e.keys).to_lowercase();
                words.iter().all(|w| hay.contains(w.as_str()))
            })
            .collect()
    }

    pub fn key(&mut self, key: KeyEvent) -> PaletteOutcome {
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        let n = self.matches().len();
        match key.code {
            KeyCode::Esc => return PaletteOutcome::Close,
            KeyCode::Char('c') if ctrl => return PaletteOutcome::Close,
            KeyCode::Enter => {
                return match self.matches().get(self.selected) {
                    Some(e) => PaletteOutcome::Run(e.action),
                    None => PaletteOutcome::Stay,
                };
            }
            KeyCode::Up => self.selected = self.selected.saturating_sub(1),
            KeyCode::Down | KeyCode::Tab => {
                self.selected = (self.selected + 1).min(n.saturating_sub(1))
            }
            KeyCode::Backspace => {
                self.text.pop();
                self.selected = 0;
            }
            KeyCode::Char(c) if !ctrl => {
                self.text.push(c);
                self.selected = 0;
            }
            _ => {}
        }
        PaletteOutcome::Stay
    }
}

pub fn render(frame: &mut Frame, area: Rect, palette: &Palette, theme: &Theme) {
    let matches = palette.matches();
    let size = (64, (matches.len() as u16 + 4).max(5));
    let title = " command (Enter runs · Esc closes) ".to_string();
    let inner = super::ui::modal(frame, area, size, Flex::Start, title, theme);
    let [input, list] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(inner);
    frame.render_widget(
        Paragraph::new(Line::from(vec![
            Span::styled(":", theme.title),
            Span::raw(palette.text.as_str()),
            Span::styled("▏", theme.muted),
        ])),
        input,
    );
    if matches.is_empty() {
        frame.render_widget(
            Paragraph::new(Span::styled("no action matches", theme.muted)),
            list,
        );
        return;
    }
    let rows: Vec<Row> = matches
        .iter()
        .map(|e| Row::new([Span::raw(e.what), Span::styled(e.keys.clone(), theme.muted)]))
        .collect();
    let mut state = TableState::default().with_selected(Some(palette.selected));
    frame.render_stateful_widget(
        Table::new(rows, [Constraint::Min(30), Constraint::Length(14)])
            .row_highlight_style(theme.selected),
        list,
        &mut state,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tui::action::DEFAULT_KEYS;

    fn press(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    #[test]
    fn typing_narrows_to_matching_actions_and_enter_runs_the_selected_one() {
        let mut p = Palette::new(DEFAULT_KEYS, Scope::Dashboard);
        for c in "zoom".chars() {
            p.key(press(KeyCode::Char(c)));
        }
        let whats: Vec<&str> = p.matches().iter().map(|e| e.what).collect();
        assert_eq!(whats, ["zoom in", "zoom out"]);
        p.key(press(KeyCode::Down));
        assert_eq!(
            p.key(press(KeyCode::Enter)),
            PaletteOutcome::Run(Action::ZoomOut)
        );
        // Words match in any order, keys included.
        p.text = "view sampl".into();
        assert_eq!(p.matches().len(), 1);
        p.text = "nothing like this".into();
        p.selected = 0;
        assert_eq!(p.key(press(KeyCode::Enter)), PaletteOutcome::Stay);
        assert_eq!(p.key(press(KeyCode::Esc)), PaletteOutcome::Close);
    }

    #[test]
    fn a_view_binding_shadows_the_global_one_on_the_same_key() {
        let runs = entries(DEFAULT_KEYS, Scope::Runs);
        // Space marks on the runs list; play is not reachable by Space there.
        let mark = runs.iter().find(|e| e.action == Action::Mark).unwrap();
        assert_eq!(mark.keys, "Space");
        assert!(!runs.iter().any(|e| e.action == Action::Play));
        let resume = runs.iter().find(|e| e.action == Action::ResumeRun).unwrap();
        assert_eq!(resume.keys, "r");
        assert!(!runs.iter().any(|e| e.action == Action::Replay));
        let dash = entries(DEFAULT_KEYS, Scope::Dashboard);
        assert!(dash.iter().any(|e| e.action == Action::Replay));
        assert!(
            dash.iter()
                .any(|e| e.action == Action::Quit && e.keys == "q Ctrl-c")
        );
    }
}
