//! Drawing the Workers view: the alarms box, the workers table and the devices pane.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, TableState, Wrap};

use super::devices::{self, DeviceLedger, DevicesPane, ledgers};
use super::rows::{WorkerRow, run_line, worker_rows};
use super::{Alarm, AlarmKind, Focus, WorkersView, alarms};
use crate::store::{RunInfo, RunStatus};
use crate::tui::events::{clean, rel_time, warn_style};
use crate::tui::replay::Cursor;
use crate::tui::runs::age;
use crate::tui::theme::Theme;

fn block<'a>(title: String, focused: bool, theme: &Theme) -> Block<'a> {
    theme.panel(title, focused)
}

fn alarm_style(kind: AlarmKind, theme: &Theme) -> Style {
    match kind {
        AlarmKind::Stalled | AlarmKind::WorkerFailed => theme.bad,
        _ => warn_style(),
    }
}

/// The whole view: alarms, then the workers table, then the devices pane.
pub fn render(
    frame: &mut Frame,
    area: Rect,
    view: &WorkersView,
    until: Option<Cursor>,
    now_ms: i64,
    spinner: &str,
    theme: &Theme,
) {
    let (true, Some(info)) = (view.loaded, view.info.as_ref()) else {
        let text = Paragraph::new(format!("{spinner} reading the run's workers and events…"))
            .style(theme.muted)
            .block(block(" Workers ".into(), false, theme));
        frame.render_widget(text, area);
        return;
    };
    let until_ms = until.map(|c| c.at_ms);
    let found = alarms(info, &view.events, &view.series, until, now_ms);
    let rows = worker_rows(&view.events, until_ms);
    let ledgers = ledgers(&view.events, info.created_at, until_ms);

    let max_alarms = match area.height {
        0..30 => 4,
        30..40 => 5,
        _ => 8,
    };
    let alarm_lines = found.len().clamp(1, max_alarms) as u16;
    let rest = area.height.saturating_sub(alarm_lines + 2);
    let devices_min = if ledgers.is_empty() {
        4
    } else {
        ledgers.len() as u16 + 5
    };
    let workers_h =
        (rows.len().max(1) as u16 + 4).min(rest.saturating_sub(devices_min).max(rest.min(5)));
    let [alarm_area, table_area, devices_area] = Layout::vertical([
        Constraint::Length(alarm_lines + 2),
        Constraint::Length(workers_h),
        Constraint::Min(0),
    ])
    .areas(area);
    render_alarms(frame, alarm_area, &found, max_alarms, until, info, theme);
    render_table(
        frame, table_area, view, &rows, info, until_ms, now_ms, theme,
    );
    render_devices(
        frame,
        devices_area,
        view,
        &ledgers,
        info,
        until_ms,
        now_ms,
        theme,
    );
}

/// The alarms box: at most `max_alarms` lines, the last saying how many more there are.
fn render_alarms(
    frame: &mut Frame,
    alarm_area: Rect,
    found: &[Alarm],
    max_alarms: usize,
    until: Option<Cursor>,
    info: &RunInfo,
    theme: &Theme,
) {
    let mut title = format!(" Alarms ({})", found.len());
    if let Some(c) = until {
        title.push_str(&format!(
            " · as of step {} ({})",
            c.step,
            rel_time(c.at_ms - info.created_at)
        ));
    }
    title.push(' ');
    let mut lines: Vec<Line> = found
        .iter()
        .take(if found.len() > max_alarms {
            max_alarms - 1
        } else {
            max_alarms
        })
        .map(|a| {
            let since = a
                .since
                .as_ref()
                .map(|s| format!(" · since {s}"))
                .unwrap_or_default();
            Line::from(vec![
                Span::styled(
                    format!("▲ {}", a.kind.as_str()),
                    alarm_style(a.kind, theme).add_modifier(Modifier::BOLD),
                ),
                Span::styled(format!(" · {}{since}", a.place), alarm_style(a.kind, theme)),
                Span::styled(format!(": {}", a.detail), theme.text),
            ])
        })
        .collect();
    if found.len() > max_alarms {
        lines.push(Line::from(Span::styled(
            format!("… and {} more", found.len() - (max_alarms - 1)),
            theme.muted,
        )));
    }
    if found.is_empty() {
        lines.push(Line::from(Span::styled("no alarms", theme.good)));
    }
    frame.render_widget(
        Paragraph::new(lines).block(block(title, false, theme)),
        alarm_area,
    );
}

/// The run's row, then one row per worker, with the selection.
#[allow(clippy::too_many_arguments)]
fn render_table(
    frame: &mut Frame,
    table_area: Rect,
    view: &WorkersView,
    rows: &[WorkerRow],
    info: &RunInfo,
    until_ms: Option<i64>,
    now_ms: i64,
    theme: &Theme,
) {
    let clock = until_ms.unwrap_or(now_ms);
    let run = run_line(info, &view.events, until_ms, now_ms, theme);
    let beat = |ms: Option<i64>| ms.map(|t| age(clock, t)).unwrap_or_else(|| "-".into());
    let name_w = rows
        .iter()
        .map(|w| w.name.chars().count())
        .chain([info.name.chars().count(), 4])
        .max()
        .unwrap_or(4)
        .min(24) as u16;
    // On a cluster: each worker's node and its link (the heartbeat's round trip, what its mirror
    // moved), the rows grouped by node.
    let nodes = rows.iter().any(|w| w.node.is_some());
    let link = |w: &WorkerRow| {
        let last = |what: &str| {
            let key = format!("workers/{}/{what}", w.name);
            let s = view.series.iter().find(|s| s.key == key)?;
            let at = s
                .wall_time
                .iter()
                .rposition(|&t| until_ms.is_none_or(|u| info.created_at + (t * 1e3) as i64 <= u))?;
            Some(s.values[at])
        };
        let mut parts = vec![];
        if let Some(ms) = last("rtt_ms") {
            parts.push(format!("{ms:.1} ms"));
        }
        if let Some(mb) = last("mirror_mb") {
            parts.push(format!("{mb:.1} MB"));
        }
        if parts.is_empty() {
            "-".to_string()
        } else {
            parts.join(" · ")
        }
    };
    let extra = |cells: [Cell<'static>; 6], node: Cell<'static>, link: Cell<'static>| {
        let mut cells = cells.to_vec();
        if nodes {
            cells.insert(1, node);
            cells.insert(2, link);
        }
        Row::new(cells)
    };
    let mut table_rows = vec![extra(
        [
            Cell::from(clean(&info.name, 40, false)).style(theme.title),
            Cell::from(
                info.pid
                    .map(|p| p.to_string())
                    .unwrap_or_else(|| "-".into()),
            ),
            Cell::from(run.status).style(run.style),
            Cell::from(beat(run.last_ms)),
            Cell::from(run.resumes.to_string()),
            Cell::from(clean(run.last.trim_end(), 300, false)).style(theme.muted),
        ],
        Cell::from("head").style(theme.muted),
        Cell::from(""),
    )];
    for w in rows {
        table_rows.push(extra(
            [
                Cell::from(clean(&w.name, 40, false)),
                Cell::from(w.pid.map(|p| p.to_string()).unwrap_or_else(|| "-".into())),
                Cell::from(w.state.as_str()).style(w.state.style(theme)),
                Cell::from(beat(w.last_ms)),
                Cell::from(w.restarts.to_string()).style(if w.restarts > 0 {
                    warn_style()
                } else {
                    theme.text
                }),
                Cell::from(clean(w.last.trim_end(), 300, false)).style(theme.muted),
            ],
            Cell::from(clean(w.node.as_deref().unwrap_or("head"), 40, false)),
            Cell::from(link(w)).style(theme.muted),
        ));
    }
    let selected = std::iter::once(None)
        .chain(rows.iter().map(|w| Some(w.name.clone())))
        .position(|k| k == view.selected)
        .unwrap_or(0);
    let mut header = vec![
        "name",
        "pid",
        "state",
        "heartbeat",
        "restarts",
        "last event",
    ];
    let mut widths = vec![
        Constraint::Length(name_w),
        Constraint::Length(7),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(8),
        Constraint::Min(8),
    ];
    if nodes {
        let node_w = rows
            .iter()
            .filter_map(|w| w.node.as_deref())
            .map(|n| n.chars().count())
            .chain([4])
            .max()
            .unwrap_or(4)
            .min(24) as u16;
        header.splice(1..1, ["node", "link"]);
        widths.splice(1..1, [Constraint::Length(node_w), Constraint::Length(17)]);
    }
    let header = Row::new(header).style(theme.header);
    let node_count = rows
        .iter()
        .map(|w| w.node.as_deref())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let focused = view.focus == Focus::Workers;
    let table = Table::new(table_rows, widths)
        .header(header)
        .block(block(
            if nodes {
                format!(" Workers ({}) on {node_count} nodes ", rows.len())
            } else {
                format!(" Workers ({}) ", rows.len())
            },
            focused,
            theme,
        ))
        .row_highlight_style(if focused {
            theme.selected
        } else {
            Style::default()
        })
        .highlight_symbol("▶ ");
    let mut state = TableState::default().with_selected(Some(selected));
    frame.render_stateful_widget(table, table_area, &mut state);
    if rows.is_empty() && table_area.height >= 5 {
        let line = Rect {
            y: table_area.y + 3,
            height: 1,
            ..table_area.inner(ratatui::layout::Margin::new(1, 0))
        };
        let text = "No worker events recorded: every role runs in-process, or none started yet.";
        frame.render_widget(
            Paragraph::new(text)
                .style(theme.muted)
                .wrap(Wrap { trim: true }),
            line,
        );
    }
}

/// The devices pane over the time the run (or the replay) covers.
#[allow(clippy::too_many_arguments)]
fn render_devices(
    frame: &mut Frame,
    devices_area: Rect,
    view: &WorkersView,
    ledgers: &[DeviceLedger],
    info: &RunInfo,
    until_ms: Option<i64>,
    now_ms: i64,
    theme: &Theme,
) {
    let to_ms = match until_ms {
        Some(u) => u,
        None if info.status == RunStatus::Running => now_ms,
        None => view
            .events
            .iter()
            .map(|e| e.at)
            .max()
            .unwrap_or(info.updated_at)
            .max(info.updated_at),
    };
    let from_ms = view
        .events
        .first()
        .map_or(info.created_at, |e| e.at.min(info.created_at));
    let selected_device = view
        .device
        .as_ref()
        .and_then(|d| ledgers.iter().position(|l| l.device == *d))
        .unwrap_or(0);
    let pane = DevicesPane {
        ledgers,
        selected: selected_device,
        focused: view.focus == Focus::Devices,
        from_ms,
        to_ms,
        start_ms: info.created_at,
    };
    devices::render(frame, devices_area, &pane, theme);
}
