//! Drawing the whole screen from the [`App`] state: the view tabs, the current view, the status
//! line (the filter being typed, the last error, the keys that matter most), the help overlay, and
//! the message shown instead when the terminal is too small.

use ratatui::Frame;
use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Row, Table, Tabs};

use super::action::help_lines;
use super::app::{App, MIN_HEIGHT, MIN_WIDTH, View};
use super::theme::Theme;
use super::{dashboard, runs};

const SPINNER: &[&str] = &["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

/// Draw `app` on `frame`; `now_ms` is the clock for ages (fixed in tests).
pub fn render(frame: &mut Frame, app: &App, now_ms: i64) {
    let theme = Theme::default();
    let area = frame.area();
    if app.too_small() {
        let text = format!(
            "The terminal is {}×{}; roll-tui needs at least {MIN_WIDTH}×{MIN_HEIGHT}. Enlarge it, or press q to quit.",
            area.width, area.height
        );
        frame.render_widget(
            Paragraph::new(text).wrap(ratatui::widgets::Wrap { trim: true }),
            area,
        );
        return;
    }
    let [tabs, body, status] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    let titles: Vec<String> = [View::Runs, View::Dashboard]
        .iter()
        .enumerate()
        .map(|(i, v)| format!("{} {}", i + 1, v.title()))
        .collect();
    let selected = match app.view {
        View::Runs => 0,
        View::Dashboard => 1,
    };
    frame.render_widget(
        Tabs::new(titles)
            .select(selected)
            .style(theme.muted)
            .highlight_style(theme.title)
            .divider("│"),
        tabs,
    );
    let spinner = SPINNER[(app.ticks as usize) % SPINNER.len()];
    match (app.view, &app.dashboard) {
        (View::Dashboard, Some(d)) => dashboard::render(frame, body, d, spinner, &theme),
        _ => runs::render(frame, body, &app.runs, now_ms, spinner, &theme),
    }
    frame.render_widget(Paragraph::new(status_line(app, &theme)), status);
    if app.help {
        render_help(frame, body, app, &theme);
    }
}

fn status_line<'a>(app: &'a App, theme: &Theme) -> Line<'a> {
    if let Some(text) = &app.input {
        return Line::from(vec![
            Span::styled("/", theme.title),
            Span::raw(text.as_str()),
            Span::styled("▏", theme.muted),
            Span::styled("  Enter keeps it · Esc clears it", theme.muted),
        ]);
    }
    if let Some(status) = &app.status {
        return Line::from(Span::styled(status.as_str(), theme.bad));
    }
    let hint = match app.view {
        View::Runs => "Enter open · Space mark · s sort · / filter · ? help · q quit",
        View::Dashboard => {
            "Tab panel · e expand · + - = zoom · h l pan · [ ] smooth · w x-axis · f freeze · Esc back · ? help"
        }
    };
    Line::from(Span::styled(hint, theme.muted))
}

fn render_help(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let lines = help_lines(app.keys(), app.view.scope());
    let height = (lines.len() as u16 + 2).min(area.height);
    let [popup] = Layout::vertical([Constraint::Length(height)])
        .flex(Flex::Center)
        .areas(area);
    let [popup] = Layout::horizontal([Constraint::Length(76.min(area.width))])
        .flex(Flex::Center)
        .areas(popup);
    let rows: Vec<Row> = lines
        .into_iter()
        .map(|(keys, what)| Row::new([Span::styled(keys, theme.title), Span::raw(what)]))
        .collect();
    let table = Table::new(rows, [Constraint::Length(16), Constraint::Min(10)]).block(
        Block::default()
            .borders(Borders::ALL)
            .border_style(theme.focus_border)
            .title(format!(" keys: {} (Esc closes) ", app.view.title())),
    );
    frame.render_widget(Clear, popup);
    frame.render_widget(table, popup);
}
