//! The run dashboard: a grid of panels (per-domain reward and accuracy, losses, KL, entropy,
//! response length, grad norm, staleness, throughput, timings — `plot::select` decides which series
//! go where), live while the run writes. Series are kept whole; each frame draws them decimated to
//! the panel's pixel columns with min/max, the EMA in colour over the raw series faded behind it.

mod hidden;
mod live;
pub mod render;

use super::action::Action;
use super::decimate::{Ema, Pyramid};
use super::replay::Tick;
use crate::metrics::Series;
use crate::plot::select::plan_charts;
use crate::store::RunId;
use crate::store::series_since::SeriesMark;
pub use hidden::SeriesName;
pub use render::{render, short};

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

/// A run whose series the dashboard draws: the open run first, then the ones overlaid on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub run: RunId,
    pub name: String,
    /// How many of the dashboard's series are this run's (they follow the earlier runs').
    pub len: usize,
    pub loaded: bool,
    /// The run is writing: its series are polled for new points.
    pub live: bool,
    /// How far its series have been read from the store (a live poll asks for what follows).
    pub mark: Option<SeriesMark>,
}

pub struct Dashboard {
    pub run: RunId,
    pub name: String,
    pub parts: Vec<Part>,
    /// The replay cursor: only points recorded until then are drawn.
    pub as_of: Option<Tick>,
    /// The run was live when opened: its series are polled.
    pub live: bool,
    pub series: Vec<Series>,
    /// The series' steps as f64 (x values on the step axis).
    pub(super) steps: Vec<Vec<f64>>,
    /// EMA of each series at the current smoothing, and its running state.
    pub(super) smoothed: Vec<Vec<f64>>,
    emas: Vec<Ema>,
    /// Block extremes of each series and of its EMA, for fast decimation.
    pub(super) raw_pyramids: Vec<Pyramid>,
    pub(super) smooth_pyramids: Vec<Pyramid>,
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
    /// Why the open run failed, when it did.
    pub failure: Option<String>,
    /// With runs compared: their config keys that differ (`seed 1 vs 2`).
    pub config_diff: Vec<String>,
    /// Series the user hid (`x`), drawn in their panel's title only.
    pub hidden: Vec<SeriesName>,
    /// The picked series of the focused panel, a position in its lines (`s` moves it).
    pub pick: usize,
}

impl Dashboard {
    pub fn new(run: RunId, name: String, live: bool) -> Dashboard {
        Dashboard {
            run,
            parts: vec![Part {
                run,
                name: name.clone(),
                len: 0,
                loaded: false,
                live,
                mark: None,
            }],
            as_of: None,
            name,
            live,
            series: vec![],
            steps: vec![],
            smoothed: vec![],
            emas: vec![],
            raw_pyramids: vec![],
            smooth_pyramids: vec![],
            loaded: false,
            filter: String::new(),
            focus: 0,
            expanded: false,
            frozen: false,
            x_axis: XAxis::Step,
            smoothing: crate::smoothing::DEFAULT_WEIGHT,
            zoom: 1.0,
            right: None,
            failure: None,
            config_diff: vec![],
            hidden: vec![],
            pick: 0,
        }
    }

    /// Draw `run`'s series over the open run's; `live` while it is writing.
    pub fn overlay(&mut self, run: RunId, name: String, live: bool) {
        if !self.runs().contains(&run) {
            self.parts.push(Part {
                run,
                name,
                len: 0,
                loaded: false,
                live,
                mark: None,
            });
        }
    }

    /// The runs drawn: the open one first.
    pub fn runs(&self) -> Vec<RunId> {
        self.parts.iter().map(|p| p.run).collect()
    }

    /// The open run's series (without the overlaid runs').
    pub fn primary_series(&self) -> &[Series] {
        &self.series[..self.parts[0].len.min(self.series.len())]
    }

    /// The run a series belongs to.
    pub fn part_of(&self, series: usize) -> &Part {
        let mut end = 0;
        for p in &self.parts {
            end += p.len;
            if series < end {
                return p;
            }
        }
        &self.parts[0]
    }

    /// The open run's series (when the dashboard overlays nothing).
    pub fn set_series(&mut self, series: Vec<Series>) {
        self.set_run_series(self.run, series);
    }

    /// New series of one of the drawn runs; the others' are kept.
    pub fn set_run_series(&mut self, run: RunId, series: Vec<Series>) {
        let mut old = std::mem::take(&mut self.series).into_iter();
        let mut new = Some(series);
        let mut all = vec![];
        for part in &mut self.parts {
            let kept: Vec<Series> = old.by_ref().take(part.len).collect();
            if part.run == run
                && let Some(series) = new.take()
            {
                part.len = series.len();
                part.loaded = true;
                all.extend(series);
            } else {
                all.extend(kept);
            }
        }
        self.rebuild(all);
    }

    fn rebuild(&mut self, series: Vec<Series>) {
        self.steps = series
            .iter()
            .map(|s| s.steps.iter().map(|&x| x as f64).collect())
            .collect();
        self.raw_pyramids = series.iter().map(|s| Pyramid::new(&s.values)).collect();
        self.series = series;
        self.smooth();
        self.loaded = self.parts.iter().all(|p| p.loaded);
        self.focus = self.focus.min(self.panels().len().saturating_sub(1));
    }

    fn smooth(&mut self) {
        self.emas = vec![Ema::new(self.smoothing); self.series.len()];
        self.smoothed = self
            .series
            .iter()
            .zip(&mut self.emas)
            .map(|(s, e)| {
                let mut out = Vec::with_capacity(s.values.len());
                e.extend(&s.values, &mut out);
                out
            })
            .collect();
        self.smooth_pyramids = self.smoothed.iter().map(|s| Pyramid::new(s)).collect();
    }

    pub fn set_filter(&mut self, filter: String) {
        self.filter = filter;
        self.focus = 0;
    }

    /// The panels to draw, filtered by title or series key.
    /// The standard panels the filter matches (by title or key), then, per stage, a panel of the
    /// series no standard panel draws whose key the filter matches: a glob (`actor/clip_frac_*`,
    /// `adv/*`) or a part of the key (`frac_zero`). So `/` puts any metric on the dashboard.
    pub fn panels(&self) -> Vec<Panel> {
        let f = self.filter.to_lowercase();
        let plans = plan_charts(&self.series);
        let index_of = |l: &Series| self.series.iter().position(|s| std::ptr::eq(s, l));
        let drawn: Vec<usize> = plans
            .iter()
            .flat_map(|p| p.lines.iter().filter_map(|l| index_of(l)))
            .collect();
        let glob = globset::Glob::new(&f).ok().map(|g| g.compile_matcher());
        let matches = |key: &str| {
            let key = key.to_lowercase();
            key.contains(&f) || glob.as_ref().is_some_and(|g| g.is_match(&key))
        };
        let mut panels: Vec<Panel> = plans
            .into_iter()
            .filter(|p| {
                f.is_empty()
                    || p.title.to_lowercase().contains(&f)
                    || p.lines.iter().any(|s| matches(&s.key))
            })
            .map(|p| Panel {
                title: p.title,
                lines: p.lines.iter().filter_map(|l| index_of(l)).collect(),
            })
            .collect();
        if f.is_empty() {
            return panels;
        }
        let mut stages: Vec<&str> = vec![];
        for s in &self.series {
            if !stages.contains(&s.stage.as_str()) {
                stages.push(&s.stage);
            }
        }
        for stage in stages {
            let lines: Vec<usize> = (0..self.series.len())
                .filter(|i| !drawn.contains(i))
                .filter(|&i| *self.series[i].stage == *stage && matches(&self.series[i].key))
                .filter(|&i| self.series[i].values.iter().any(|v| v.is_finite()))
                .collect();
            if !lines.is_empty() {
                panels.push(Panel {
                    title: format!("{} ({stage})", self.filter),
                    lines,
                });
            }
        }
        panels
    }

    pub(super) fn xs(&self, i: usize) -> &[f64] {
        match self.x_axis {
            XAxis::Step => &self.steps[i],
            XAxis::WallTime => &self.series[i].wall_time,
        }
    }

    /// The x range of every series, `None` without points.
    fn full_range(&self) -> Option<(f64, f64)> {
        self.range_of(0..self.series.len())
    }

    /// The x range the series `lines` span (all their points, whatever the replay cursor).
    fn range_of(&self, lines: impl Iterator<Item = usize>) -> Option<(f64, f64)> {
        lines
            .filter_map(|i| Some((*self.xs(i).first()?, *self.xs(i).last()?)))
            .reduce(|(a, b), (c, d)| (a.min(c), b.max(d)))
    }

    /// How many of series `i`'s points are drawn: those recorded until the replay cursor.
    pub fn visible_len(&self, i: usize) -> usize {
        let s = &self.series[i];
        match &self.as_of {
            None => s.len(),
            Some(t) => s.wall_time.partition_point(|&w| w <= t.wall + 1e-9),
        }
    }

    /// Series `i`'s value at the replay cursor (or its newest), with its step.
    pub fn value_now(&self, i: usize) -> Option<(u64, f64)> {
        let n = self.visible_len(i);
        let s = &self.series[i];
        (0..n)
            .rev()
            .find(|&j| s.values[j].is_finite())
            .map(|j| (s.steps[j], s.values[j]))
    }

    /// The visible x window.
    pub fn window(&self) -> Option<(f64, f64)> {
        self.window_in(self.full_range()?)
    }

    /// The visible x window of a panel drawing the series `lines`: its own shown series' range
    /// (so RL panels span the RL steps, not the SFT stage's; with every series hidden, all of
    /// theirs), zoomed and panned like every panel.
    pub fn panel_window(&self, lines: &[usize]) -> Option<(f64, f64)> {
        let shown = self.shown(lines);
        let lines = if shown.is_empty() { lines } else { &shown };
        self.window_in(self.range_of(lines.iter().copied())?)
    }

    fn window_in(&self, (x0, x1): (f64, f64)) -> Option<(f64, f64)> {
        // One point is no range to draw over: its axis would read `1 1 1`.
        // Two units around it (never below 0, where steps and run times start) give it one.
        let (x0, x1) = if x1 <= x0 {
            let left = (x0 - 1.0).max(0.0_f64.min(x0));
            (left, left + 2.0)
        } else {
            (x0, x1)
        };
        let span = x1 - x0;
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
        let focus = self.focus;
        match action {
            Action::PickSeries => self.pick_next(),
            Action::HideSeries => self.toggle_picked(),
            Action::ShowAllSeries => self.show_all(),
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
        // Another panel: its first series is picked.
        if self.focus != focus {
            self.pick = 0;
        }
    }
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
    fn one_point_is_drawn_over_two_steps_around_it() {
        // A live run's first RL step: one point at step 1, which alone spans nothing (its axis
        // read `1 1 1`); it is drawn over steps 0 to 2. Two points keep their own range.
        let mut d = Dashboard::new(RunId(1), "r".into(), true);
        d.set_series(vec![series("rl", "reward/add/mean", &[0.5])]);
        let lines = d.panels()[0].lines.clone();
        assert_eq!(d.panel_window(&lines), Some((0.0, 2.0)));
        d.set_series(vec![series("rl", "reward/add/mean", &[0.5, 0.6])]);
        assert_eq!(d.panel_window(&lines), Some((1.0, 2.0)));
    }

    #[test]
    fn the_filter_puts_any_metric_on_the_dashboard() {
        let mut d = Dashboard::new(RunId(1), "r".into(), true);
        let v: Vec<f64> = (0..10).map(f64::from).collect();
        d.set_series(vec![
            series("rl", "reward/add/mean", &v),
            series("rl", "group/frac_zero_std", &v),
            series("rl", "actor/clip_frac_low", &v),
            series("rl", "actor/clip_frac_high", &v),
            series("rl", "actor/pg_loss", &v),
        ]);
        let shown = |d: &Dashboard| {
            d.panels()
                .into_iter()
                .map(|p| {
                    let keys: Vec<&str> =
                        p.lines.iter().map(|&i| d.series[i].key.as_str()).collect();
                    format!("{}: {}", p.title, keys.join(" "))
                })
                .collect::<Vec<_>>()
        };
        // No standard panel draws group/frac_zero_std; a part of its key gives it one.
        d.set_filter("frac_zero".into());
        assert_eq!(shown(&d), ["frac_zero (rl): group/frac_zero_std"]);
        // A glob: both clip fractions together.
        d.set_filter("actor/clip_frac_*".into());
        assert_eq!(
            shown(&d),
            ["actor/clip_frac_* (rl): actor/clip_frac_low actor/clip_frac_high"]
        );
        // A standard panel's series are not drawn twice; a glob finds them there too.
        d.set_filter("pg_loss".into());
        assert_eq!(shown(&d), ["loss (rl): actor/pg_loss"]);
        d.set_filter("actor/*".into());
        assert_eq!(
            shown(&d),
            [
                "loss (rl): actor/pg_loss",
                "actor/* (rl): actor/clip_frac_low actor/clip_frac_high"
            ]
        );
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
    fn each_panel_spans_its_own_series_steps() {
        // 400 SFT steps and 150 RL steps: the RL panels span 1..150, not the SFT stage's 1..400,
        // and zooming in keeps each panel on its own points.
        let mut d = dashboard();
        let sft: Vec<f64> = (0..400).map(f64::from).collect();
        let rl: Vec<f64> = (0..150).map(f64::from).collect();
        d.set_series(vec![
            series("sft", "sft/loss", &sft),
            series("rl", "reward/add/mean", &rl),
        ]);
        let panels = d.panels();
        let window_of = |d: &Dashboard, title: &str| {
            let p = panels.iter().find(|p| p.title == title).unwrap();
            d.panel_window(&p.lines)
        };
        assert_eq!(window_of(&d, "loss (sft)"), Some((1.0, 400.0)));
        assert_eq!(window_of(&d, "reward (rl)"), Some((1.0, 150.0)));
        d.act(Action::ZoomIn);
        assert_eq!(window_of(&d, "reward (rl)"), Some((75.5, 150.0)));
        assert_eq!(window_of(&d, "loss (sft)"), Some((200.5, 400.0)));
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
