//! Colours of the workbench. Only the terminal's own foreground and the eight basic ANSI colours
//! are used, never a fixed background: the terminal's palette maps them to shades that read on its
//! own background, dark or light.

use ratatui::style::{Color, Modifier, Style};

#[derive(Debug, Clone)]
pub struct Theme {
    pub text: Style,
    pub muted: Style,
    pub border: Style,
    pub focus_border: Style,
    pub title: Style,
    pub header: Style,
    pub selected: Style,
    pub good: Style,
    pub bad: Style,
    /// Line colours, in the order series are drawn.
    pub series: Vec<Color>,
}

const SERIES: &[Color] = &[
    Color::Blue,
    Color::Magenta,
    Color::Cyan,
    Color::Green,
    Color::Red,
    Color::Yellow,
];

impl Default for Theme {
    fn default() -> Self {
        Theme {
            text: Style::default(),
            muted: Style::default().add_modifier(Modifier::DIM),
            border: Style::default().add_modifier(Modifier::DIM),
            focus_border: Style::default().fg(Color::Cyan),
            title: Style::default().add_modifier(Modifier::BOLD),
            header: Style::default().add_modifier(Modifier::BOLD | Modifier::UNDERLINED),
            selected: Style::default().add_modifier(Modifier::REVERSED),
            good: Style::default().fg(Color::Green),
            bad: Style::default().fg(Color::Red),
            series: SERIES.to_vec(),
        }
    }
}

impl Theme {
    /// A bordered panel titled `title`, its border coloured when it has the focus.
    pub fn panel<'a>(&self, title: String, focused: bool) -> ratatui::widgets::Block<'a> {
        ratatui::widgets::Block::default()
            .borders(ratatui::widgets::Borders::ALL)
            .border_style(if focused {
                self.focus_border
            } else {
                self.border
            })
            .title(ratatui::text::Span::styled(title, self.title))
    }

    pub fn series_color(&self, i: usize) -> Color {
        self.series[i % self.series.len()]
    }
}
