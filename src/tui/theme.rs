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

#[cfg(test)]
mod tests {
    use super::*;

    /// The hue of an RGB colour, in degrees.
    fn hue((r, g, b): (u8, u8, u8)) -> f64 {
        let [r, g, b] = [r, g, b].map(|c| f64::from(c) / 255.0);
        let (max, min) = (r.max(g).max(b), r.min(g).min(b));
        let d = max - min;
        let h = if max == r {
            ((g - b) / d).rem_euclid(6.0)
        } else if max == g {
            (b - r) / d + 2.0
        } else {
            (r - g) / d + 4.0
        };
        h * 60.0
    }

    #[test]
    fn exported_plots_colour_series_as_the_screen_does() {
        // The terminal's named colours' hues; an exported line may be darker, not another hue.
        let named = |c: Color| match c {
            Color::Red => 0.0,
            Color::Yellow => 60.0,
            Color::Green => 120.0,
            Color::Cyan => 180.0,
            Color::Blue => 240.0,
            Color::Magenta => 300.0,
            other => panic!("{other:?} has no hue here"),
        };
        let theme = Theme::default();
        for i in 0..theme.series.len() {
            let want: f64 = named(theme.series_color(i));
            let got = hue(crate::plot::curve_rgb(i));
            let off = (got - want).abs().min(360.0 - (got - want).abs());
            assert!(
                off <= 40.0,
                "series {i}: {:?} vs hue {got:.0}",
                theme.series_color(i)
            );
        }
    }
}
