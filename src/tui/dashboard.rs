//! The run dashboard: a grid of panels (per-domain reward and accuracy, losses, KL, entropy,
//! response length, grad norm, staleness, throughput, timings — `plot::select` decides which series
//! go where), live while the run writes. Series are kept whole; each frame draws them decimated to
//! the panel's pixel columns with min/max, the EMA in colour over the raw series faded behind it.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Block, Borders, Chart, Dataset, GraphType, Paragraph};

use super::action::Action;
use super::decimate::{Pyramid, ema, min_max_with, value_range};
use super::theme::Theme;
use crate::metrics::Series;
use crate::plot::select::plan_charts;
use crate::store::RunId;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XAxis {
    Step,
    WallTime,
}

/// EMA weights `]` and `[` step through; 0 draws the raw series only.
const SMOOTHING: &[f64] = &[0.0, 0.6, 0.8, 0.9, 0.95, 0.99];
/// The narrowest window, as a fraction of the whole x range.
const MIN_ZOOM: f64 = 1.0 / 1024.0;

/// One panel of the grid: a title and the series it draws (indices into the dashboard's).
#[derive(Debug, Clone, PartialEq)]
pub struct Panel {
    pub title: String,
    pub lines: Vec<usize>,
}

pub struct Dashboard {
    pub run: RunId,
    pub name: String,
    /// The run was live when opened: its series are polled.
    pub live: bool,
    pub series: Vec<Series>,
    /// The series' steps as f64 (x values on the step axis).
    steps: Vec<Vec<f64>>,
    /// EMA of each series at the current smoothing.
    smoothed: Vec<Vec<f64>>,
    /// Block extremes of each series and of its EMA, for fast decimation.
    raw_pyramids: Vec<Pyramid>,
    smooth_pyramids: Vec<Pyramid>,
    pub loaded: bool,
    pub filter: String,
    pub focus: usize,
    pub expanded: bool,
    pub frozen: bool,
    pub x_axis: XAxis,
    pub smoothing: f64,
    /// Visible width as a fraction of the whole x range (1: everything).
    pub zoom: f64,
    /// The window's right edge as a fraction of the x range; `None` follows the newest point.
    pub right: Option<f64>,
}

impl Dashboard {
    pub fn new(run: RunId, name: String, live: bool) -> Dashboard {
        Dashboard {
            run,
            name,
            live,
            series: vec![],
            steps: vec![],
            smoothed: vec![],
            raw_pyramids: vec![],
            smooth_pyramids: vec![],
            loaded: false,
            filter: String::new(),
            focus: 0,
            expanded: false,
            frozen: false,
            x_axis: XAxis::Step,
            smoothing: SMOOTHING[1],
            zoom: 1.0,
            right: None,
        }
    }

    pub fn set_series(&mut self, series: Vec<Series>) {
        self.steps = series
            .iter()
            .map(|s| s.steps.iter().map(|&x| x as f64).collect())
            .collect();
        self.raw_pyramids = series.iter().map(|s| Pyramid::new(&s.values)).collect();
        self.series = series;
        self.smooth();
        self.loaded = true;
        self.focus = self.focus.min(self.panels().len().saturating_sub(1));
    }

    fn smooth(&mut self) {
        self.smoothed = self
            .series
            .iter()
            .map(|s| ema(&s.values, self.smoothing))
            .collect();
        self.smooth_pyramids = self.smoothed.iter().map(|s| Pyramid::new(s)).collect();
    }

    pub fn set_filter(&mut self, filter: String) {
        self.filter = filter;
        self.focus = 0;
    }

    /// The panels to draw, filtered by title or series key.
    pub fn panels(&self) -> Vec<Panel> {
        let f = self.filter.to_lowercase();
        plan_charts(&self.series)
            .into_iter()
            .filter(|p| {
                f.is_empty()
                    || p.title.to_lowercase().contains(&f)
                    || p.lines.iter().any(|s| s.key.to_lowercase().contains(&f))
            })
            .map(|p| Panel {
                title: p.title,
                lines: p
                    .lines
                    .iter()
                    .filter_map(|l| self.series.iter().position(|s| std::ptr::eq(s, *l)))
                    .collect(),
            })
            .collect()
    }

    fn xs(&self, i: usize) -> &[f64] {
        match self.x_axis {
            XAxis::Step => &self.steps[i],
            XAxis::WallTime => &self.series[i].wall_time,
        }
    }

    /// The x range of every series, `None` without points.
    fn full_range(&self) -> Option<(f64, f64)> {
        (0..self.series.len())
            .filter_map(|i| Some((*self.xs(i).first()?, *self.xs(i).last()?)))
            .reduce(|(a, b), (c, d)| (a.min(c), b.max(d)))
    }

    /// The visible x window.
    pub fn window(&self) -> Option<(f64, f64)> {
        let (x0, x1) = self.full_range()?;
        let span = (x1 - x0).max(1e-9);
        let right = x0 + span * self.right.unwrap_or(1.0);
        let width = span * self.zoom;
        let left = (right - width).max(x0);
        Some((left, (left + width).max(left + 1e-9)))
    }

    fn pan(&mut self, by: f64) {
        let right = (self.right.unwrap_or(1.0) + by * self.zoom).clamp(self.zoom, 1.0);
        self.right = (right < 1.0).then_some(right);
    }

    pub fn act(&mut self, action: Action) {
        let last = self.panels().len().saturating_sub(1);
        match action {
            Action::Up | Action::PrevPane => self.focus = self.focus.saturating_sub(1),
            Action::Down | Action::NextPane => self.focus = (self.focus + 1).min(last),
            Action::Top => self.focus = 0,
            Action::Bottom => self.focus = last,
            Action::Expand => self.expanded = !self.expanded,
            Action::Freeze => self.frozen = !self.frozen,
            Action::ToggleXAxis => {
                self.x_axis = match self.x_axis {
                    XAxis::Step => XAxis::WallTime,
                    XAxis::WallTime => XAxis::Step,
                };
                self.right = None;
            }
            Action::SmoothMore | Action::SmoothLess => {
                let at = SMOOTHING
                    .iter()
                    .position(|&s| s >= self.smoothing)
                    .unwrap_or(0);
                let to = if action == Action::SmoothMore {
                    (at + 1).min(SMOOTHING.len() - 1)
                } else {
                    at.saturating_sub(1)
                };
                self.smoothing = SMOOTHING[to];
                self.smooth();
            }
            Action::ZoomIn => {
                // Keep the right edge where it is: zooming on a live run keeps following it.
                self.zoom = (self.zoom / 2.0).max(MIN_ZOOM);
                if let Some(r) = self.right {
                    self.right = Some(r.max(self.zoom));
                }
            }
            Action::ZoomOut => {
                self.zoom = (self.zoom * 2.0).min(1.0);
                self.pan(0.0);
            }
            Action::ZoomReset => {
                self.zoom = 1.0;
                self.right = None;
            }
            Action::Left => self.pan(-0.25),
            Action::Right => self.pan(0.25),
            _ => {}
        }
    }
}

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
    let mut spans = vec![
        Span::styled(format!(" {} ", d.name), theme.title),
        state,
        Span::styled(
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
        ),
    ];
    if !d.filter.is_empty() {
        spans.push(Span::styled(
            format!(" · filter: {}", d.filter),
            theme.muted,
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), head);
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
    let Some(window) = d.window() else {
        frame.render_widget(block, area);
        return;
    };
    // Braille cells are two dots wide; the y labels take about 8 columns.
    let columns = (area.width.saturating_sub(10) as usize * 2).max(1);
    let mut raw: Vec<Vec<(f64, f64)>> = vec![];
    let mut smooth: Vec<Vec<(f64, f64)>> = vec![];
    for &i in &panel.lines {
        let xs = d.xs(i);
        let (values, pyramid) = (&d.series[i].values, &d.raw_pyramids[i]);
        raw.push(min_max_with(xs, values, pyramid, window, columns));
        if d.smoothing > 0.0 {
            let (values, pyramid) = (&d.smoothed[i], &d.smooth_pyramids[i]);
            smooth.push(min_max_with(xs, values, pyramid, window, columns));
        }
    }
    let (lo, hi) = raw
        .iter()
        .chain(&smooth)
        .filter_map(|p| value_range(p))
        .reduce(|(a, b), (c, e)| (a.min(c), b.max(e)))
        .unwrap_or((0.0, 1.0));
    let pad = ((hi - lo) * 0.05).max(1e-9);
    let (lo, hi) = (lo - pad, hi + pad);
    let mut datasets = vec![];
    for (n, &i) in panel.lines.iter().enumerate() {
        let color = theme.series_color(n);
        let s = &d.series[i];
        let last = s.values.iter().rev().find(|v| v.is_finite()).copied();
        let name = format!(
            "{} {}",
            s.key,
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
    let (x0, x1) = window;
    let x_labels = [short(x0), short((x0 + x1) / 2.0), short(x1)];
    let y_labels = [short(lo), short((lo + hi) / 2.0), short(hi)];
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

    pub fn series(stage: &str, key: &str, values: &[f64]) -> Series {
        Series {
            stage: stage.into(),
            key: key.into(),
            steps: (1..=values.len() as u64).collect(),
            wall_time: (0..values.len()).map(|i| i as f64 * 2.0).collect(),
            values: values.to_vec(),
        }
    }

    fn dashboard() -> Dashboard {
        let mut d = Dashboard::new(RunId(1), "r".into(), true);
        let v: Vec<f64> = (0..100).map(f64::from).collect();
        d.set_series(vec![
            series("rl", "reward/add/mean", &v),
            series("rl", "reward/rev/mean", &v),
            series("rl", "actor/pg_loss", &v),
            series("rl", "actor/kl", &v),
        ]);
        d
    }

    #[test]
    fn panels_group_series_and_the_filter_narrows_them() {
        let mut d = dashboard();
        let titles: Vec<String> = d.panels().into_iter().map(|p| p.title).collect();
        assert_eq!(titles, ["reward (rl)", "loss (rl)", "kl (rl)"]);
        assert_eq!(d.panels()[0].lines, [0, 1]);
        d.set_filter("KL".into());
        assert_eq!(d.panels().len(), 1);
        d.set_filter("pg_loss".into());
        assert_eq!(d.panels()[0].title, "loss (rl)");
    }

    #[test]
    fn zoom_keeps_the_right_edge_and_panning_stays_inside() {
        let mut d = dashboard();
        assert_eq!(d.window(), Some((1.0, 100.0)));
        d.act(Action::ZoomIn);
        assert_eq!(d.window(), Some((50.5, 100.0)));
        d.act(Action::Left); // a quarter of the window: 99 · 0.5 · 0.25
        let (l, r) = d.window().unwrap();
        assert!(
            (r - (100.0 - 12.375)).abs() < 1e-9 && (r - l - 49.5).abs() < 1e-9,
            "{l} {r}"
        );
        for _ in 0..10 {
            d.act(Action::Left);
        }
        assert_eq!(d.window(), Some((1.0, 50.5)));
        for _ in 0..10 {
            d.act(Action::Right);
        }
        assert_eq!(d.right, None, "back at the newest point: following again");
        d.act(Action::ZoomReset);
        d.act(Action::ToggleXAxis);
        assert_eq!(d.window(), Some((0.0, 198.0)));
    }

    #[test]
    fn smoothing_and_focus_stay_in_their_ranges() {
        let mut d = dashboard();
        for _ in 0..10 {
            d.act(Action::SmoothMore);
        }
        assert_eq!(d.smoothing, 0.99);
        for _ in 0..10 {
            d.act(Action::SmoothLess);
        }
        assert_eq!(d.smoothing, 0.0);
        assert_eq!(d.smoothed[0], d.series[0].values);
        for _ in 0..10 {
            d.act(Action::Down);
        }
        assert_eq!(d.focus, 2);
        assert_eq!(short(0.5), "0.500");
        assert_eq!(short(12345.0), "1.2e4");
    }
}
