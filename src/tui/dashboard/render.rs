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

use crate::tui::dashboard::{Dashboard, Panel, XAxis};
use crate::tui::decimate::{min_max_with, value_range};
use crate::tui::theme::Theme;

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
    // Compared runs: what differs in their configs, on a line of its own.
    let head_rows = if d.config_diff.is_empty() { 1 } else { 2 };
    let [head, body] =
        Layout::vertical([Constraint::Length(head_rows), Constraint::Min(0)]).areas(area);
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
    let mut lines = vec![Line::from(spans)];
    if !d.config_diff.is_empty() {
        lines.push(Line::from(vec![
            Span::styled(" config differs: ", theme.muted),
            Span::raw(d.config_diff.join(" · ")),
        ]));
    }
    frame.render_widget(Paragraph::new(lines), head);
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
    let grid = Grid::new(body, panels.len(), d.focus);
    let body = match grid.paged() {
        false => body,
        true => {
            let [body, note] =
                Layout::vertical([Constraint::Min(0), Constraint::Length(1)]).areas(body);
            let (first, last) = grid.shown();
            let text = format!(
                " panels {}–{last} of {} · j/k move between them · e expands one",
                first + 1,
                panels.len()
            );
            frame.render_widget(Paragraph::new(text).style(theme.muted), note);
            body
        }
    };
    let rows = grid.rows_shown;
    let row_areas = Layout::vertical(vec![Constraint::Ratio(1, rows as u32); rows]).split(body);
    for (r, row_area) in row_areas.iter().enumerate() {
        let cells = Layout::horizontal(vec![Constraint::Ratio(1, grid.cols as u32); grid.cols])
            .split(*row_area);
        for (c, cell) in cells.iter().enumerate() {
            let i = (grid.first_row + r) * grid.cols + c;
            if let Some(p) = panels.get(i) {
                render_panel(frame, *cell, d, p, i == d.focus, theme);
            }
        }
    }
}

/// Rows a panel needs to be read: its borders, three rows of curve and the x labels.
const MIN_PANEL_ROWS: u16 = 6;

/// How the panels are laid out: `cols` wide, and when they would be too short to read all at
/// once, a page of `rows_shown` rows holding the focused panel (j/k move it, and the page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Grid {
    cols: usize,
    rows: usize,
    rows_shown: usize,
    first_row: usize,
    panels: usize,
}

impl Grid {
    fn new(body: Rect, panels: usize, focus: usize) -> Grid {
        let cols: usize = if body.width >= 150 { 3 } else { 2 };
        let rows = panels.div_ceil(cols).max(1);
        if body.height / MIN_PANEL_ROWS >= rows as u16 {
            return Grid {
                cols,
                rows,
                rows_shown: rows,
                first_row: 0,
                panels,
            };
        }
        // One line goes to saying which panels are shown.
        let fit = usize::from((body.height.saturating_sub(1) / MIN_PANEL_ROWS).max(1));
        let focus_row = focus.min(panels.saturating_sub(1)) / cols;
        Grid {
            cols,
            rows,
            rows_shown: fit,
            first_row: focus_row / fit * fit,
            panels,
        }
    }

    fn paged(&self) -> bool {
        self.rows_shown < self.rows
    }

    /// The first panel shown and one past the last.
    fn shown(&self) -> (usize, usize) {
        let first = self.first_row * self.cols;
        (
            first,
            (first + self.rows_shown * self.cols).min(self.panels),
        )
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
        for i in d.shown(&panel.lines) {
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

/// The y range a panel draws for values from `lo` to `hi`: widened to round numbers, multiples
/// of a step of 1, 2, 2.5 or 5 × 10^k with at most four steps between them, so that its three
/// labels read as a person would write them (rewards from 0.08 to 1.0 are drawn from 0 to 1, a
/// throughput of 45,300 to 49,800 from 44,000 to 50,000). It never crosses zero unless the values
/// do. Flat values get a band of 10% around them, and zero up to rounding noise ±1.
pub fn y_bounds(lo: f64, hi: f64) -> (f64, f64) {
    let magnitude = lo.abs().max(hi.abs());
    if hi - lo <= 1e-12 * magnitude.max(1.0) {
        let pad = if magnitude > 1e-9 {
            magnitude * 0.1
        } else {
            // Zero up to rounding noise (a loss of all-flat groups): ±1, so the noise draws flat.
            1.0
        };
        let low = if lo >= 0.0 {
            (lo - pad).max(0.0)
        } else {
            lo - pad
        };
        let high = if hi <= 0.0 {
            (hi + pad).min(0.0)
        } else {
            hi + pad
        };
        // A series that is all zeros still needs a range.
        return if high > low {
            (low, high)
        } else {
            (low, low + 1.0)
        };
    }
    // Spans too wide for round numbers (near f64::MAX) are drawn as they are.
    crate::plot::axis::round_bounds(lo, hi).unwrap_or((lo, hi))
}

/// An axis label as the exported plots write it (`0.5`, `-0.005`, `44000`, `1.0e-4`).
fn tick(v: f64) -> String {
    crate::plot::axis::label(v)
}

/// The three y labels, right-aligned to one width: the axis is drawn where the widest ends, so
/// a longer middle label cannot run into the curves (`0.021-3` on a narrow panel).
fn y_labels(lo: f64, mid: f64, hi: f64) -> [String; 3] {
    let labels = [tick(lo), tick(mid), tick(hi)];
    let width = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    labels.map(|l| format!("{l:>width$}"))
}

/// `names` less the `/`-separated parts they all begin or end with (`reward/add/mean`,
/// `reward/rev/mean` → `add`, `rev`); unchanged when that would leave a name empty.
pub fn distinct_parts(names: &[String]) -> Vec<String> {
    let split: Vec<Vec<&str>> = names.iter().map(|n| n.split('/').collect()).collect();
    let shortest = split.iter().map(Vec::len).min().unwrap_or(0);
    let same = |pick: &dyn Fn(&Vec<&str>, usize) -> String, k: usize| {
        split.iter().all(|p| pick(p, k) == pick(&split[0], k))
    };
    let head = (0..shortest)
        .take_while(|&k| same(&|p, k| p[k].to_string(), k))
        .count();
    let tail = (0..shortest - head)
        .take_while(|&k| same(&|p, k| p[p.len() - 1 - k].to_string(), k))
        .count();
    if split.iter().any(|p| p.len() <= head + tail) {
        return names.to_vec();
    }
    split
        .iter()
        .map(|p| p[head..p.len() - tail].join("/"))
        .collect()
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

/// Which of a panel's legend entries its title shows, in what order: all in the panel's order
/// when they fit in `width`; otherwise the picked one, then the largest latest values first
/// (a timings panel names the phases that take the time, not the ones that take none), as many
/// as fit beside a `+N` count of the rest.
fn legend_order(
    d: &Dashboard,
    panel: &Panel,
    entries: &[String],
    picked: Option<usize>,
    width: u16,
) -> Vec<usize> {
    let cost = |n: usize| entries[n].chars().count() + 3;
    let room = usize::from(width).saturating_sub(panel.title.chars().count() + 4);
    if (0..entries.len()).map(cost).sum::<usize>() <= room {
        return (0..entries.len()).collect();
    }
    let size = |n: usize| match d.is_hidden(panel.lines[n]) {
        true => -1.0,
        false => d.value_now(panel.lines[n]).map_or(0.0, |(_, v)| v.abs()),
    };
    let mut ranked: Vec<usize> = (0..entries.len()).collect();
    ranked.sort_by(|&a, &b| {
        (Some(b) == picked)
            .cmp(&(Some(a) == picked))
            .then(size(b).total_cmp(&size(a)))
    });
    let room = room.saturating_sub(" +99 (e expands) ".len());
    let mut used = 0;
    let first = ranked[0];
    let shown: Vec<usize> = ranked
        .into_iter()
        .take_while(|&n| {
            used += cost(n);
            used <= room
        })
        .collect();
    // One entry at least, cut by the border if it must be, rather than only a count.
    match shown.is_empty() {
        true => vec![first],
        false => shown,
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
    // Each series with its latest value, in the panel's title in its colour (several by the parts
    // of their names that differ): a legend box would not fit a grid panel at 80x24, and would
    // cover the curves.
    let names: Vec<String> = panel.lines.iter().map(|&i| legend_name(d, i)).collect();
    let several = names.len() > 1;
    let names = if several {
        distinct_parts(&names)
    } else {
        names
    };
    let entries: Vec<String> = panel
        .lines
        .iter()
        .zip(&names)
        .map(|(&i, name)| {
            let last = d.value_now(i).map(|(_, v)| short(v));
            format!("{name} {}", last.unwrap_or_else(|| "-".into()))
        })
        .collect();
    let mut title = vec![Span::styled(format!(" {} ", panel.title), theme.title)];
    let picked = if focused { d.picked() } else { None };
    let order = legend_order(d, panel, &entries, picked, area.width);
    let left_out = entries.len() - order.len();
    for n in order {
        let (entry, i) = (&entries[n], panel.lines[n]);
        // A hidden series stays in the title, crossed out, so `x` can bring it back.
        let (mark, mut style) = if d.is_hidden(i) {
            ("○", theme.muted.add_modifier(Modifier::CROSSED_OUT))
        } else {
            ("●", Style::default().fg(theme.series_color(n)))
        };
        if picked == Some(n) && several {
            style = style.add_modifier(Modifier::UNDERLINED);
        }
        title.push(Span::styled(format!("{mark} {entry}"), style));
        title.push(Span::raw(" "));
    }
    if left_out > 0 {
        title.push(Span::styled(
            format!("+{left_out} (e expands) "),
            theme.muted,
        ));
    }
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(if focused {
            theme.focus_border
        } else {
            theme.border
        })
        .title(Line::from(title));
    let Some(window) = d.panel_window(&panel.lines) else {
        frame.render_widget(block, area);
        return;
    };
    // Braille cells are two dots wide; the y labels take about 8 columns.
    let columns = (area.width.saturating_sub(10) as usize * 2).max(1);
    let mut raw: Vec<Vec<(f64, f64)>> = vec![];
    let mut smooth: Vec<Vec<(f64, f64)>> = vec![];
    for &i in &panel.lines {
        // Hidden: nothing drawn, and no say in the y range.
        if d.is_hidden(i) {
            raw.push(vec![]);
            smooth.push(vec![]);
            continue;
        }
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
    let (lo, hi) = y_bounds(lo, hi);
    // Values a billionth of the range apart are drawn alike: rounding noise (an EMA of a constant)
    // must not flip a dot row where a value sits on a row boundary.
    let step = (hi - lo) * 1e-9;
    for p in raw.iter_mut().chain(smooth.iter_mut()).flatten() {
        p.1 = lo + ((p.1 - lo) / step).round() * step;
    }
    let mut datasets = vec![];
    for (n, &i) in panel.lines.iter().enumerate() {
        if d.is_hidden(i) {
            continue;
        }
        let color = theme.series_color(n);
        let faded = d.smoothing > 0.0;
        let raw_style = if faded {
            Style::default().fg(color).add_modifier(Modifier::DIM)
        } else {
            Style::default().fg(color)
        };
        let raw_set = Dataset::default()
            .marker(Marker::Braille)
            .graph_type(GraphType::Line)
            .style(raw_style)
            .data(&raw[n]);
        datasets.push(raw_set);
        if faded {
            datasets.push(
                Dataset::default()
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
    let y_labels = y_labels(lo, mid, hi);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn y_ranges_are_round_and_do_not_cross_zero_unless_the_values_do() {
        let close = |(a, b): (f64, f64), (c, d): (f64, f64)| {
            assert!(
                (a - c).abs() < 1e-9 && (b - d).abs() < 1e-9,
                "{a} {b} vs {c} {d}"
            );
        };
        // Rewards from 0.081 to 1.0: steps of 0.25 (0.2 would need 5), from 0 to 1; it was
        // drawn from 0.035 to 1.046 and labelled so.
        close(y_bounds(0.081, 1.0), (0.0, 1.0));
        close(y_bounds(0.0, 1.0), (0.0, 1.0));
        close(y_bounds(-1.0, 1.0), (-1.0, 1.0));
        close(y_bounds(-2.0, -1.0), (-2.0, -1.0));
        // The rounding itself: `plot::axis`'s tests.
        // A flat time series: a band of 10% around it, not ±1 (which went to -0.94).
        let (lo, hi) = y_bounds(0.06, 0.06);
        assert!(
            (lo - 0.054).abs() < 1e-12 && (hi - 0.066).abs() < 1e-12,
            "{lo} {hi}"
        );
        assert_eq!(y_bounds(0.0, 0.0), (0.0, 1.0));
        // Rounding noise around zero is not blown up to fill the panel.
        assert_eq!(y_bounds(-3e-17, 2e-17), (-1.0 - 3e-17, 1.0 + 2e-17));
        assert_eq!(y_bounds(0.0, 1e-13), (0.0, 1.0 + 1e-13));
        // Labels of round numbers without their trailing zeros.
        assert_eq!(
            [
                tick(0.0),
                tick(0.5),
                tick(1.0),
                tick(-0.005),
                tick(44_000.0)
            ],
            ["0", "0.5", "1", "-0.005", "44000"]
        );
        assert_eq!(
            y_labels(-0.03, -0.005, 0.02),
            [" -0.03", "-0.005", "  0.02"]
        );
    }

    #[test]
    fn a_legend_too_long_for_its_title_names_the_largest_values_first() {
        use crate::store::RunId;
        let mut d = Dashboard::new(RunId(1), "r".into(), false);
        let phases = [
            ("adv", 7e-5),
            ("offload", 7e-3),
            ("ref", 2e-7),
            ("reload", 8e-3),
            ("rollout", 1.5),
            ("step", 2.1),
            ("train", 0.4),
            ("weight_sync", 0.02),
        ];
        d.set_series(
            phases
                .iter()
                .map(|(k, v)| super::super::tests::series("rl", &format!("time/{k}"), &[*v]))
                .collect(),
        );
        let panel = d
            .panels()
            .into_iter()
            .find(|p| p.title.starts_with("timings"))
            .unwrap();
        let entries: Vec<String> = phases.iter().map(|(k, _)| format!("{k} 0.000")).collect();
        // Wide enough: every entry, in the panel's order.
        assert_eq!(
            legend_order(&d, &panel, &entries, None, 200),
            (0..8).collect::<Vec<_>>()
        );
        // At 80 columns: step, rollout and train (the time is theirs), not adv and ref.
        let names =
            |order: Vec<usize>| -> Vec<&str> { order.into_iter().map(|n| phases[n].0).collect() };
        assert_eq!(
            names(legend_order(&d, &panel, &entries, None, 80)),
            ["step", "rollout", "train"]
        );
        // The picked series comes first, however small.
        assert_eq!(
            names(legend_order(&d, &panel, &entries, Some(2), 80))[0],
            "ref"
        );
    }

    #[test]
    fn panels_too_short_to_read_are_paged_around_the_focus() {
        let area = |h| Rect::new(0, 0, 100, h);
        // 12 panels in 2 columns are 6 rows: 36 lines show them all at 6 rows each.
        let all = Grid::new(area(36), 12, 0);
        assert!(!all.paged());
        assert_eq!((all.rows_shown, all.shown()), (6, (0, 12)));
        // 27 lines (a 100x30 terminal's dashboard): 4 rows of 6, the note line below them.
        let page = Grid::new(area(27), 12, 0);
        assert!(page.paged());
        assert_eq!(page.shown(), (0, 8));
        // Focus on the 9th panel (row 4): the next page, which holds the last four.
        assert_eq!(Grid::new(area(27), 12, 8).shown(), (8, 12));
        // Even a tiny body shows one row.
        assert_eq!(Grid::new(area(4), 12, 11).shown(), (10, 12));
    }

    #[test]
    fn legends_keep_the_parts_of_names_that_differ() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            distinct_parts(&names(&["reward/add/mean", "reward/rev/mean"])),
            ["add", "rev"]
        );
        assert_eq!(
            distinct_parts(&names(&["actor/clip_frac_low", "actor/clip_frac_high"])),
            ["clip_frac_low", "clip_frac_high"]
        );
        // Nothing would be left of one of them: unchanged.
        assert_eq!(
            distinct_parts(&names(&["loss", "loss/ema"])),
            ["loss", "loss/ema"]
        );
        assert_eq!(distinct_parts(&names(&["a/x", "b/y"])), ["a/x", "b/y"]);
    }
}
