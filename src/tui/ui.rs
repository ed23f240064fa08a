//! Drawing the whole screen from the [`App`] state: the view tabs, the current view, the status
//! line (the filter being typed, replay, the last error or notice, the keys that matter most), the
//! modal layers (help, palette, new-run form, confirmations), and the message shown instead when
//! the terminal is too small.

use ratatui::Frame;
use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Row, Table, Tabs, Wrap};

use super::action::help_lines;
use super::app::{App, MIN_HEIGHT, MIN_WIDTH, View};
use super::control::Confirm;
use super::replay::SPEEDS;
use super::theme::Theme;
use super::{dashboard, debugger, episodes, events, launch, palette, runs, samples, workers};

const SPINNER: &[&str] = &["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

/// The tab titles, in view order.
fn tab_titles() -> Vec<String> {
    View::ALL
        .iter()
        .enumerate()
        .map(|(i, v)| format!("{} {}", i + 1, v.title()))
        .collect()
}

/// The view number (1-based) of the tab drawn at `column` of the tab line.
pub fn tab_at(column: u16) -> Option<u8> {
    // Tabs draws " title " for each, separated by a one-column divider.
    let mut x = 0u16;
    for (i, t) in tab_titles().iter().enumerate() {
        let width = t.chars().count() as u16 + 2;
        if column < x + width {
            return u8::try_from(i + 1).ok();
        }
        x += width + 1;
    }
    None
}

/// Draw `app` on `frame`; `now_ms` is the clock for ages (fixed in tests).
pub fn render(frame: &mut Frame, app: &App, now_ms: i64) {
    let theme = &app.theme;
    let area = frame.area();
    // The frame's own size: a resize can reach the screen before the app hears of it.
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let text = format!(
            "The terminal is {}×{}; roll-tui needs at least {MIN_WIDTH}×{MIN_HEIGHT}. Enlarge it, or press q to quit.",
            area.width, area.height
        );
        frame.render_widget(Paragraph::new(text).wrap(Wrap { trim: true }), area);
        return;
    }
    let [tabs, body, status] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    let selected = View::ALL.iter().position(|v| *v == app.view).unwrap_or(0);
    frame.render_widget(
        Tabs::new(tab_titles())
            .select(selected)
            .style(theme.muted)
            .highlight_style(theme.title)
            .divider("│"),
        tabs,
    );
    let spinner = SPINNER[(app.ticks as usize) % SPINNER.len()];
    let cursor = app.cursor();
    let start_ms = app.open.as_ref().map_or(0, |o| o.start_ms);
    match app.view {
        View::Runs => runs::render(
            frame,
            body,
            &app.runs,
            app.load_error.as_deref(),
            now_ms,
            spinner,
            theme,
        ),
        View::Dashboard => match &app.dashboard {
            Some(d) => dashboard::render(frame, body, d, spinner, theme),
            None => no_run(frame, body, theme),
        },
        View::Samples => match &app.samples {
            Some(s) => samples::render(frame, body, s, spinner, theme),
            None => no_run(frame, body, theme),
        },
        View::Workers => match &app.workers {
            Some(w) => workers::render(frame, body, w, cursor, now_ms, spinner, theme),
            None => no_run(frame, body, theme),
        },
        View::Events => match &app.events {
            Some(e) => events::render(
                frame,
                body,
                e,
                cursor.map(|c| c.at_ms),
                start_ms,
                spinner,
                theme,
            ),
            None => no_run(frame, body, theme),
        },
        View::Episodes => match &app.episodes {
            Some(e) => episodes::render::render(frame, body, e, spinner, theme),
            None => no_run(frame, body, theme),
        },
        View::Debugger => match &app.debugger {
            Some(d) => debugger::render::render(frame, body, d, spinner, theme),
            None => no_run(frame, body, theme),
        },
    }
    frame.render_widget(Paragraph::new(status_line(app, theme)), status);
    if let Some(form) = &app.form {
        launch::render(frame, body, form, theme);
    }
    if let Some(p) = &app.palette {
        palette::render(frame, body, p, theme);
    }
    if let Some(c) = &app.confirm {
        render_confirm(frame, body, c, theme);
    }
    if app.help {
        render_help(frame, body, app, theme);
    }
}

fn no_run(frame: &mut Frame, area: Rect, theme: &Theme) {
    frame.render_widget(
        Paragraph::new("No run is open: choose one on the runs list (1) and press Enter.")
            .style(theme.muted),
        area,
    );
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
    let mut spans = vec![];
    if app.view != View::Runs
        && let (Some(r), Some(tick)) = (
            &app.replay,
            app.replay.as_ref().and_then(|r| r.tick(&app.timeline)),
        )
    {
        let state = if r.playing { "▶" } else { "❚❚" };
        spans.push(Span::styled(
            format!(
                " {state} replay {} step {} ({}/{}) · {} steps/s ",
                tick.stage,
                tick.step,
                r.index + 1,
                app.timeline.len(),
                SPEEDS[r.speed]
            ),
            theme.selected,
        ));
        spans.push(Span::raw(" "));
    }
    // The runs list's read error is about the runs, not the debugger, which needs no store; where
    // the runs list shows it in place of the runs, it is not said twice.
    let load_error = app.load_error.as_ref().filter(|_| {
        app.view != View::Debugger && !(app.view == View::Runs && app.runs.rows.is_empty())
    });
    if let Some(status) = app.status.as_ref().or(load_error) {
        spans.push(Span::styled(status.as_str(), theme.bad));
        return Line::from(spans);
    }
    if let Some(notice) = &app.notice {
        spans.push(Span::styled(notice.as_str(), theme.good));
        return Line::from(spans);
    }
    let hint = match app.view {
        View::Runs => {
            "Enter open · n new · X stop · p pause · r resume · c compare · 1-7 views · ? help · q quit"
        }
        View::Dashboard => {
            "Tab panel · e expand · +- zoom · [] smooth · s x hide series · r replay · ? help"
        }
        View::Samples => {
            "h l step · j k sample · Enter whole · f follow · / search · Tab domain · ? help"
        }
        View::Workers => "Tab workers/devices · j k select · r replay · Esc back · ? help",
        View::Events => {
            "Tab kind · / filter · j k scroll · G newest · r replay · Esc back · ? help"
        }
        View::Episodes => {
            "h l step · j k select · Tab episodes/turns · v training/eval · D debug · ? help"
        }
        View::Debugger => "? every key · : palette · Esc back",
    };
    spans.push(Span::styled(hint, theme.muted));
    Line::from(spans)
}

/// A modal box of `width` × `height` (clipped to `area`), centred across and placed by `flex`
/// down, drawn over what is beneath with a focused border and `title`; the area inside it.
pub fn modal(
    frame: &mut Frame,
    area: Rect,
    (width, height): (u16, u16),
    flex: Flex,
    title: String,
    theme: &Theme,
) -> Rect {
    let [popup] = Layout::vertical([Constraint::Length(height.min(area.height))])
        .flex(flex)
        .areas(area);
    let [popup] = Layout::horizontal([Constraint::Length(width.min(area.width))])
        .flex(Flex::Center)
        .areas(popup);
    frame.render_widget(Clear, popup);
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(theme.focus_border)
        .title(title);
    let inner = block.inner(popup);
    frame.render_widget(block, popup);
    inner
}

fn render_confirm(frame: &mut Frame, area: Rect, confirm: &Confirm, theme: &Theme) {
    let (title, lines): (&str, Vec<Line>) = match confirm {
        Confirm::Quit { runs } => {
            let mut lines = vec![Line::from(format!(
                "{} started here {} still running:",
                runs.len(),
                if runs.len() == 1 { "is" } else { "are" }
            ))];
            for r in runs {
                lines.push(Line::from(Span::styled(
                    format!("  roll-tui {} (pid {})", r.what, r.process.pid),
                    theme.muted,
                )));
            }
            lines.push(Line::from(""));
            lines.push(Line::from(vec![
                Span::styled("c", theme.title),
                Span::raw(" quit, the runs continue headless (logs in roll-logs/)"),
            ]));
            lines.push(Line::from(vec![
                Span::styled("s", theme.title),
                Span::raw(" stop them after their step (they checkpoint) and quit"),
            ]));
            lines.push(Line::from(vec![
                Span::styled("Esc", theme.title),
                Span::raw(" stay"),
            ]));
            (" quit? ", lines)
        }
        Confirm::Delete { name, .. } => (
            " delete? ",
            vec![
                Line::from(format!(
                    "Delete run '{name}' and everything recorded for it in the store?"
                )),
                Line::from("Its output directory and checkpoints stay on disk."),
                Line::from(""),
                Line::from(vec![
                    Span::styled("y", theme.title),
                    Span::raw(" delete · "),
                    Span::styled("any other key", theme.title),
                    Span::raw(" keep it"),
                ]),
            ],
        ),
        Confirm::Resume { name, step } => (
            " resume? ",
            vec![
                Line::from(format!(
                    "Resume '{name}' ({step}) from its last checkpoint? Training starts again in a"
                )),
                Line::from("new process; X stops it."),
                Line::from(""),
                Line::from(vec![
                    Span::styled("y", theme.title),
                    Span::raw(" resume · "),
                    Span::styled("any other key", theme.title),
                    Span::raw(" leave it"),
                ]),
            ],
        ),
        Confirm::Stop { name, process } => (
            " stop? ",
            vec![
                Line::from(format!(
                    "Stop '{name}' (pid {})? It finishes its step and writes a checkpoint;",
                    process.pid
                )),
                Line::from("`r` on the runs list resumes it later."),
                Line::from(""),
                Line::from(vec![
                    Span::styled("y", theme.title),
                    Span::raw(" stop · "),
                    Span::styled("any other key", theme.title),
                    Span::raw(" keep it running"),
                ]),
            ],
        ),
    };
    // As tall as the lines once wrapped (a long run name wraps its line), so none is cut off.
    let (width, inner_width) = (76u16, 74usize);
    let rows: usize = lines
        .iter()
        .map(|l| l.width().div_ceil(inner_width).max(1))
        .sum();
    let size = (width, rows as u16 + 2);
    let inner = modal(frame, area, size, Flex::Center, title.to_string(), theme);
    frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: false }), inner);
}

fn render_help(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let lines = help_lines(app.keys(), app.view.scope());
    // Two columns when one does not fit the height.
    let rows_fit = area.height.saturating_sub(2) as usize;
    let columns = if lines.len() > rows_fit { 2 } else { 1 };
    let per_column = lines.len().div_ceil(columns);
    let width = if columns == 2 { area.width } else { 76 };
    let title = format!(" keys: {} (Esc closes) ", app.view.title());
    let size = (width, per_column as u16 + 2);
    let inner = modal(frame, area, size, Flex::Center, title, theme);
    let areas =
        Layout::horizontal(vec![Constraint::Ratio(1, columns as u32); columns]).split(inner);
    for (chunk, column) in lines.chunks(per_column.max(1)).zip(areas.iter()) {
        let rows: Vec<Row> = chunk
            .iter()
            .map(|(keys, what)| {
                Row::new([Span::styled(keys.clone(), theme.title), Span::raw(*what)])
            })
            .collect();
        let key_width = if columns == 2 { 13 } else { 16 };
        frame.render_widget(
            Table::new(rows, [Constraint::Length(key_width), Constraint::Min(10)]),
            *column,
        );
    }
}
