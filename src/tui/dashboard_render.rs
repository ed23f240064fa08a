//! Drawing the dashboard: a grid of charts (or one expanded), each series decimated to the
//! panel's pixel columns with min/max, the EMA in colour over the raw series faded behind it; in
//! replay, only what was recorded until the cursor, a marker at the cursor and a readout of the
//! focused panel's values there.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Block, Borders, Chart, Dataset, GraphType, Paragraph};

use super::dashboard::{Dashboard, Panel, XAxis};
use super::decimate::{min_max_with, value_range};
use super::theme::Theme;

/// A number for an axis label or legend, short.
pub fn short(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(0.01..10_000.0).contains(&a) {
        format!("{v:.1e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

pub fn render(frame: &mut Frame, area: Rect, d: &Dashboard, spinner: &str, theme: &Theme) {
    let [head, body] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    let state = match (d.live, d.frozen) {
        (true, false) => Span::styled("● live", theme.good),
        (true, true) => Span::styled("❚❚ frozen", theme.muted),
        (false, _) => Span::styled("stored", theme.muted),
    };
    let x = match d.x_axis {
        XAxis::Step => "step",
        XAxis::WallTime => "wall time (s)",
    };
    let names: Vec<&str> = d.parts.iter().map(|p| p.name.as_str()).collect();
    let mut spans = vec![
        Span::styled(format!(" {} ", names.join(" vs ")), theme.title),
        state,
    ];
    // Why the run failed comes before the view's settings, which matter less.
    if let Some(why) = &d.failure {
        let first = why.lines().next().unwrap_or_default();
        spans.push(Span::styled(format!(" · failed: {first}"), theme.bad));
    }
    spans.extend([Span::styled(
        format!(
            " · x: {x} · smoothing {:.2} · zoom {}",
            d.smoothing,
            if d.zoom >= 1.0 {
                "all".to_string()
            } else {
                format!("1/{:.0}", 1.0 / d.zoom)
            }
        ),
        theme.muted,
    )]);
    if !d.filter.is_empty() {
        spans.push(Span::styled(
            format!(" · filter: {}", d.filter),
            theme.muted,
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), head);
    let body = match &d.as_of {
        Some(_) if d.loaded => {
            let [body, readout] =
                Layout::vertical([Constraint::Min(0), Constraint::Length(1)]).areas(body);
            render_readout(frame, readout, d, theme);
            body
        }
        _ => body,
    };
    if !d.loaded {
        let text = format!("{spinner} loading {}'s series…", d.name);
        frame.render_widget(Paragraph::new(text).style(theme.muted), body);
        return;
    }
    let panels = d.panels();
    if panels.is_empty() {
        let text = if d.series.is_empty() {
            "No metrics recorded yet."
        } else {
            "No panel matches the filter (Esc clears it)."
        };
        frame.render_widget(Paragraph::new(text).style(theme.muted), body);
        return;
    }
    if d.expanded {
        let focus = d.focus.min(panels.len() - 1);
        render_panel(frame, body, d, &panels[focus], true, theme);
        return;
    }
    let cols: usize = if body.width >= 150 { 3 } else { 2 };
    let rows = panels.len().div_ceil(cols);
    let row_areas = Layout::vertical(vec![Constraint::Ratio(1, rows as u32); rows]).split(body);
    for (r, row_area) in row_areas.iter().enumerate() {
        let cells =
            Layout::horizontal(vec![Constraint::Ratio(1, cols as u32); cols]).split(*row_area);
        for (c, cell) in cells.iter().enumerate() {
            let i = r * cols + c;
            if let Some(p) = panels.get(i) {
                render_panel(frame, *cell, d, p, i == d.focus, theme);
            }
        }
    }
}

/// In replay: the focused panel's values at the cursor, at full precision (as `roll-tui metrics`
/// prints them), each with the step it was recorded at.
fn render_readout(frame: &mut Frame, area: Rect, d: &Dashboard, theme: &Theme) {
    let Some(t) = &d.as_of else {
        return;
    };
    let mut spans = vec![Span::styled(
        format!(" {} step {} ", t.stage, t.step),
        theme.selected,
    )];
    if let Some(panel) = d.panels().get(d.focus) {
        for &i in &panel.lines {
            let s = &d.series[i];
            let value = match d.value_now(i) {
                Some((step, v)) if step == t.step && *s.stage == *t.stage => format!("{v:.6}"),
                Some((step, v)) => format!("{v:.6} (step {step})"),
                None => "—".into(),
            };
            spans.push(Span::styled(
                format!(" {} ", legend_name(d, i)),
                theme.muted,
            ));
            spans.push(Span::raw(value));
        }
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// A series' name in a legend: its key, with its run's name when runs are compared.
fn legend_name(d: &Dashboard, i: usize) -> String {
    let key = &d.series[i].key;
    if d.parts.len() > 1 {
        format!("{}: {key}", d.part_of(i).name)
    } else {
        key.clone()
    }
}

fn render_panel(
    frame: &mut Frame,
    area: Rect,
    d: &Dashboard,
    panel: &Panel,
    focused: bool,
    theme: &Theme,
) {
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(if focused {
            theme.focus_border
        } else {
            theme.border
        })
        .title(Span::styled(format!(" {} ", panel.title), theme.title));
    let Some(window) = d.panel_window(&panel.lines) else {
        frame.render_widget(block, area);
        return;
    };
    // Braille cells are two dots wide; the y labels take about 8 columns.
    let columns = (area.width.saturating_sub(10) as usize * 2).max(1);
    let mut raw: Vec<Vec<(f64, f64)>> = vec![];
    let mut smooth: Vec<Vec<(f64, f64)>> = vec![];
    for &i in &panel.lines {
        // In replay, only the points recorded until the cursor.
        let n = d.visible_len(i);
        let xs = &d.xs(i)[..n];
        let (values, pyramid) = (&d.series[i].values[..n], &d.raw_pyramids[i]);
        raw.push(min_max_with(xs, values, pyramid, window, columns));
        if d.smoothing > 0.0 {
            let (values, pyramid) = (&d.smoothed[i][..n], &d.smooth_pyramids[i]);
            smooth.push(min_max_with(xs, values, pyramid, window, columns));
        }
    }
    let (lo, hi) = raw
        .iter()
        .chain(&smooth)
        .filter_map(|p| value_range(p))
        .reduce(|(a, b), (c, e)| (a.min(c), b.max(e)))
        .unwrap_or((0.0, 1.0));
    // A flat series gets a visible band around its value, not a range of rounding noise.
    let pad = if hi - lo > 1e-12 * hi.abs().max(1.0) {
        (hi - lo) * 0.05
    } else {
        (hi.abs() * 0.1).max(1.0)
    };
    let (lo, hi) = (lo - pad, hi + pad);
    let mut datasets = vec![];
    for (n, &i) in panel.lines.iter().enumerate() {
        let color = theme.series_color(n);
        let last = d.value_now(i).map(|(_, v)| v);
        let name = format!(
            "{} {}",
            legend_name(d, i),
            last.map(short).unwrap_or_else(|| "-".into())
        );
        let faded = d.smoothing > 0.0;
        let raw_style = if faded {
            Style::default().fg(color).add_modifier(Modifier::DIM)
        } else {
            Style::default().fg(color)
        };
        let mut raw_set = Dataset::default()
            .marker(Marker::Braille)
            .graph_type(GraphType::Line)
            .style(raw_style)
            .data(&raw[n]);
        if !faded {
            raw_set = raw_set.name(name.clone());
        }
        datasets.push(raw_set);
        if faded {
            datasets.push(
                Dataset::default()
                    .name(name)
                    .marker(Marker::Braille)
                    .graph_type(GraphType::Line)
                    .style(Style::default().fg(color))
                    .data(&smooth[n]),
            );
        }
    }
    // The replay cursor: a vertical line where its step (or time) is, on panels of its stage.
    let cursor_x = d.as_of.as_ref().and_then(|t| {
        let of_stage = panel.lines.iter().any(|&i| *d.series[i].stage == *t.stage);
        match d.x_axis {
            XAxis::Step if of_stage => Some(t.step as f64),
            XAxis::WallTime => Some(t.wall),
            XAxis::Step => None,
        }
    });
    let marker = cursor_x.map(|x| [(x, lo), (x, hi)]);
    if let Some(m) = &marker {
        datasets.push(
            Dataset::default()
                .marker(Marker::Braille)
                .graph_type(GraphType::Line)
                .style(theme.muted)
                .data(m),
        );
    }
    let (x0, x1) = window;
    let x_label = |x: f64| match d.x_axis {
        XAxis::Step => format!("{x:.0}"),
        XAxis::WallTime => short(x),
    };
    let x_labels = [x_label(x0), x_label((x0 + x1) / 2.0), x_label(x1)];
    // A middle label that is zero up to rounding reads 0, not 7.5e-34.
    let mid = (lo + hi) / 2.0;
    let mid = if mid.abs() < (hi - lo) * 1e-9 {
        0.0
    } else {
        mid
    };
    let y_labels = [short(lo), short(mid), short(hi)];
    let chart = Chart::new(datasets)
        .block(block)
        .x_axis(
            Axis::default()
                .bounds([x0, x1])
                .labels(x_labels)
                .style(theme.muted),
        )
        .y_axis(
            Axis::default()
                .bounds([lo, hi])
                .labels(y_labels)
                .style(theme.muted),
        )
        .hidden_legend_constraints((Constraint::Percentage(60), Constraint::Percentage(60)));
    frame.render_widget(chart, area);
}
