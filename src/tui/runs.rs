//! The Runs view: every run in the store with its status, progress, age, key metrics and tags;
//! filtered with `/`, sorted with `s`, marked with Space for comparison, opened with Enter.

use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table, TableState};

use super::action::Action;
use super::theme::Theme;
use crate::config::Stage;
use crate::plot::select::is_domain_key;
use crate::store::liveness::ProcessIdentity;
use crate::store::series::SeriesInfo;
use crate::store::{RunId, RunInfo, RunStatus};

/// A run as the list shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    pub info: RunInfo,
    /// Running, and its process is alive.
    pub live: bool,
    /// Mean over domains of the last `reward/<domain>/mean`.
    pub reward: Option<f64>,
    /// Mean over domains of the last `score/<domain>/accuracy`.
    pub accuracy: Option<f64>,
    /// The last `sft/loss`.
    pub sft_loss: Option<f64>,
    /// The run's process, when it is live on this machine (it can be paused and stopped from here).
    pub process: Option<ProcessIdentity>,
    /// The run's process is stopped (paused from the workbench).
    pub paused: bool,
    /// Steps of the stage it is in, from its config.
    pub stage_steps: Option<u64>,
    /// The last `time/step` of that stage: seconds a step takes now.
    pub step_seconds: Option<f64>,
}

/// The mean of the last values of the rl series `<prefix>/<domain>/<suffix>`.
fn mean_last(series: &[SeriesInfo], prefix: &str, suffix: &str) -> Option<f64> {
    let values: Vec<f64> = series
        .iter()
        .filter(|s| s.stage == Stage::Rl.as_str() && is_domain_key(&s.key, prefix, suffix))
        .filter_map(|s| s.last_value)
        .filter(|v| v.is_finite())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

impl RunRow {
    pub fn new(info: RunInfo, live: bool, series: &[SeriesInfo]) -> RunRow {
        let stage = info.last_stage.clone();
        let stage_steps = info.stage_steps();
        let step_seconds = series
            .iter()
            .find(|s| s.key == "time/step" && Some(&s.stage) == stage.as_ref())
            .and_then(|s| s.last_value)
            .filter(|v| v.is_finite() && *v >= 0.0);
        RunRow {
            info,
            live,
            reward: mean_last(series, "reward", "mean"),
            accuracy: mean_last(series, "score", "accuracy"),
            sft_loss: series
                .iter()
                .find(|s| s.key == "sft/loss")
                .and_then(|s| s.last_value),
            process: None,
            paused: false,
            stage_steps,
            step_seconds,
        }
    }

    /// `rl 12/150`, and for a live run how long the stage has left at its current pace
    /// (`rl 12/150 ~4m`).
    pub fn progress(&self) -> String {
        let i = &self.info;
        let Some(stage) = &i.last_stage else {
            return "-".into();
        };
        let Some(total) = self.stage_steps else {
            return format!("{stage} {}", i.last_step);
        };
        let mut text = format!("{stage} {}/{total}", i.last_step);
        if self.live
            && let Some(per) = self.step_seconds
        {
            let left = total.saturating_sub(i.last_step) as f64 * per;
            text.push_str(&format!(" ~{}", short_duration(left)));
        }
        text
    }

    fn matches(&self, filter: &str) -> bool {
        let f = filter.to_lowercase();
        let i = &self.info;
        i.name.to_lowercase().contains(&f)
            || i.status.as_str().contains(&f)
            || i.tags.iter().any(|t| t.to_lowercase().contains(&f))
    }
}

/// `45s`, `4m`, `2h05m`.
fn short_duration(seconds: f64) -> String {
    let s = seconds.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SortKey {
    #[default]
    Newest,
    Name,
    Status,
    Steps,
}

impl SortKey {
    fn next(self) -> SortKey {
        match self {
            SortKey::Newest => SortKey::Name,
            SortKey::Name => SortKey::Status,
            SortKey::Status => SortKey::Steps,
            SortKey::Steps => SortKey::Newest,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SortKey::Newest => "newest",
            SortKey::Name => "name",
            SortKey::Status => "status",
            SortKey::Steps => "steps",
        }
    }
}

#[derive(Debug, Default)]
pub struct RunsView {
    pub rows: Vec<RunRow>,
    /// False until the first load answers: the view shows a spinner.
    pub loaded: bool,
    pub filter: String,
    pub sort: SortKey,
    /// The selected run, kept across reloads by id.
    pub selected: Option<RunId>,
    pub marked: Vec<RunId>,
}

/// Rows a page key moves.
const PAGE: usize = 10;

impl RunsView {
    pub fn set_rows(&mut self, rows: Vec<RunRow>) {
        self.rows = rows;
        self.loaded = true;
        self.marked
            .retain(|id| self.rows.iter().any(|r| r.info.id == *id));
        self.keep_selection();
    }

    pub fn set_filter(&mut self, filter: String) {
        self.filter = filter;
        self.keep_selection();
    }

    /// The rows shown: filtered, then sorted.
    pub fn visible(&self) -> Vec<&RunRow> {
        let mut rows: Vec<&RunRow> = self
            .rows
            .iter()
            .filter(|r| r.matches(&self.filter))
            .collect();
        match self.sort {
            SortKey::Newest => {
                rows.sort_by_key(|r| std::cmp::Reverse((r.info.created_at, r.info.id.0)))
            }
            SortKey::Name => rows.sort_by(|a, b| a.info.name.cmp(&b.info.name)),
            SortKey::Status => rows.sort_by_key(|r| (!r.live, r.info.status.as_str())),
            SortKey::Steps => rows.sort_by_key(|r| std::cmp::Reverse(r.info.last_step)),
        }
        rows
    }

    pub fn selected_index(&self) -> Option<usize> {
        let visible = self.visible();
        self.selected
            .and_then(|id| visible.iter().position(|r| r.info.id == id))
    }

    pub fn selected_row(&self) -> Option<&RunRow> {
        let id = self.selected?;
        self.rows.iter().find(|r| r.info.id == id)
    }

    /// A selection that is no longer visible moves to the first visible row.
    fn keep_selection(&mut self) {
        if self.selected_index().is_none() {
            self.selected = self.visible().first().map(|r| r.info.id);
        }
    }

    fn select_index(&mut self, index: usize) {
        let visible = self.visible();
        if let Some(r) = visible.get(index.min(visible.len().saturating_sub(1))) {
            self.selected = Some(r.info.id);
        }
    }

    pub fn act(&mut self, action: Action) {
        let at = self.selected_index().unwrap_or(0);
        let last = self.visible().len().saturating_sub(1);
        match action {
            Action::Up => self.select_index(at.saturating_sub(1)),
            Action::Down => self.select_index((at + 1).min(last)),
            Action::PageUp => self.select_index(at.saturating_sub(PAGE)),
            Action::PageDown => self.select_index((at + PAGE).min(last)),
            Action::Top => self.select_index(0),
            Action::Bottom => self.select_index(last),
            Action::Sort => {
                self.sort = self.sort.next();
                self.keep_selection();
            }
            Action::Mark => {
                if let Some(id) = self.selected {
                    if let Some(i) = self.marked.iter().position(|m| *m == id) {
                        self.marked.remove(i);
                    } else {
                        self.marked.push(id);
                    }
                }
            }
            _ => {}
        }
    }
}

/// `3s`, `5m`, `2h`, `4d` since `then_ms`.
pub fn age(now_ms: i64, then_ms: i64) -> String {
    let s = (now_ms - then_ms).max(0) / 1000;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

fn number(v: Option<f64>) -> String {
    match v {
        Some(v) if v.abs() >= 1000.0 || (v != 0.0 && v.abs() < 0.001) => format!("{v:.2e}"),
        Some(v) => format!("{v:.3}"),
        None => "-".into(),
    }
}

fn status_style(row: &RunRow, theme: &Theme) -> Style {
    match row.info.status {
        RunStatus::Running if row.live => theme.good,
        RunStatus::Finished => theme.text,
        RunStatus::Failed => theme.bad,
        _ => theme.muted,
    }
}

/// The status as shown: a running run whose process is gone reads `stale`.
fn status_text(row: &RunRow) -> &'static str {
    match row.info.status {
        RunStatus::Running if !row.live => "stale",
        RunStatus::Running if row.paused => "paused",
        s => s.as_str(),
    }
}

/// `error`: why the store could not be read, shown in place of the list it kept from being read.
pub fn render(
    frame: &mut Frame,
    area: Rect,
    view: &RunsView,
    error: Option<&str>,
    now_ms: i64,
    spinner: &str,
    theme: &Theme,
) {
    let title = format!(
        " Runs ({}) · sort: {}{} ",
        view.visible().len(),
        view.sort.as_str(),
        if view.filter.is_empty() {
            String::new()
        } else {
            format!(" · filter: {}", view.filter)
        }
    );
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(theme.border)
        .title(Span::styled(title, theme.title));
    if !view.loaded {
        let text = Paragraph::new(Line::from(format!("{spinner} reading the store…")))
            .style(theme.muted)
            .block(block);
        frame.render_widget(text, area);
        return;
    }
    let visible = view.visible();
    if let (Some(error), true) = (error, view.rows.is_empty()) {
        let text = Paragraph::new(format!("Cannot read the store: {error}"))
            .style(theme.bad)
            .wrap(ratatui::widgets::Wrap { trim: false })
            .block(block);
        frame.render_widget(text, area);
        return;
    }
    if visible.is_empty() {
        let text = if view.rows.is_empty() {
            "No runs in this store yet. Press n to start one from a config (or `roll-tui run CONFIG`)."
        } else {
            "No run matches the filter (Esc clears it)."
        };
        frame.render_widget(Paragraph::new(text).style(theme.muted).block(block), area);
        return;
    }
    let header = Row::new([
        "",
        "name",
        "status",
        "progress",
        "age",
        "reward",
        "acc",
        "sft loss",
        "tags · why failed",
    ])
    .style(theme.header);
    let rows: Vec<Row> = visible
        .iter()
        .map(|r| {
            let i = &r.info;
            let mark = if view.marked.contains(&i.id) {
                "●"
            } else {
                " "
            };
            let progress = r.progress();
            Row::new([
                Cell::from(mark),
                Cell::from(i.name.clone()),
                Cell::from(status_text(r)).style(status_style(r, theme)),
                Cell::from(progress),
                Cell::from(age(now_ms, i.created_at)),
                Cell::from(number(r.reward)),
                Cell::from(number(r.accuracy)),
                Cell::from(number(r.sft_loss)),
                // A failed run's reason, where it is seen first; its tags otherwise.
                match (&i.status, &i.error) {
                    (RunStatus::Failed, Some(why)) => {
                        Cell::from(why.lines().next().unwrap_or_default().to_string())
                            .style(theme.bad)
                    }
                    _ => Cell::from(i.tags.join(",")).style(theme.muted),
                },
            ])
        })
        .collect();
    // Names take what the longest needs; the rest goes to tags and failure reasons.
    let longest = visible
        .iter()
        .map(|r| r.info.name.chars().count())
        .max()
        .unwrap_or(0);
    let widths = [
        Constraint::Length(1),
        Constraint::Length(longest.clamp(12, 32) as u16),
        Constraint::Length(11),
        Constraint::Length(16),
        Constraint::Length(5),
        Constraint::Length(8),
        Constraint::Length(7),
        Constraint::Length(8),
        Constraint::Fill(1),
    ];
    let table = Table::new(rows, widths)
        .header(header)
        .block(block)
        .row_highlight_style(theme.selected.add_modifier(Modifier::BOLD))
        .highlight_symbol("▶ ");
    let mut state = TableState::default().with_selected(view.selected_index());
    frame.render_stateful_widget(table, area, &mut state);
}

/// Screen rows above the first run: the tabs, the table's border and its header.
const ROWS_ABOVE: u16 = 3;

/// The index (into [`RunsView::visible`]) of the run drawn on screen row `row`, for mouse clicks,
/// on a screen `height` rows tall. The table scrolls as ratatui scrolls a fresh [`TableState`]:
/// just far enough to show the selection.
pub fn row_at(view: &RunsView, height: u16, row: u16) -> Option<usize> {
    // The body is the screen less the tabs and status lines; the table less its borders and header.
    let shown = usize::from(height.saturating_sub(2).saturating_sub(3));
    let offset = match view.selected_index() {
        Some(s) if shown > 0 && s >= shown => s + 1 - shown,
        _ => 0,
    };
    let at = usize::from(row.checked_sub(ROWS_ABOVE)?);
    let index = offset + at;
    (at < shown && index < view.visible().len()).then_some(index)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub use crate::store::fixtures::info;

    pub fn row(id: i64, name: &str, status: RunStatus) -> RunRow {
        RunRow {
            info: info(id, name, status, id * 1000),
            live: status == RunStatus::Running,
            reward: Some(0.5),
            accuracy: None,
            sft_loss: Some(1.25),
            process: None,
            paused: false,
            stage_steps: None,
            step_seconds: None,
        }
    }

    #[test]
    fn progress_shows_the_stage_total_and_a_live_runs_time_left() {
        let series = |key: &str, stage: &str, v: f64| SeriesInfo {
            stage: stage.into(),
            key: key.into(),
            points: 3,
            last_step: Some(3),
            last_value: Some(v),
        };
        let mut i = info(1, "r", RunStatus::Running, 0);
        i.last_step = 12;
        i.config_json = r#"{"sft": {"steps": 400}, "rl": {"steps": 150}}"#.into();
        // 2 s a step now (the SFT stage's pace does not count), 138 steps to go: 276 s.
        let s = [
            series("time/step", "rl", 2.0),
            series("time/step", "sft", 0.1),
        ];
        assert_eq!(RunRow::new(i.clone(), true, &s).progress(), "rl 12/150 ~4m");
        assert_eq!(RunRow::new(i.clone(), false, &s).progress(), "rl 12/150");
        i.config_json = String::new();
        assert_eq!(RunRow::new(i, true, &s).progress(), "rl 12");
        assert_eq!(short_duration(59.4), "59s");
        assert_eq!(short_duration(7500.0), "2h05m");
    }

    #[test]
    fn key_metrics_average_the_domains_last_values() {
        let s = |stage: &str, key: &str, v: f64| SeriesInfo {
            stage: stage.into(),
            key: key.into(),
            points: 3,
            last_step: Some(3),
            last_value: Some(v),
        };
        let series = [
            s("rl", "reward/add/mean", 0.25),
            s("rl", "reward/rev/mean", 0.75),
            s("rl", "reward/add/std", 9.0),
            s("rl", "score/add/accuracy", 0.5),
            s("sft", "sft/loss", 2.0),
        ];
        let r = RunRow::new(info(1, "a", RunStatus::Finished, 0), false, &series);
        assert_eq!(
            (r.reward, r.accuracy, r.sft_loss),
            (Some(0.5), Some(0.5), Some(2.0))
        );
    }

    #[test]
    fn selection_follows_the_run_through_filter_sort_and_reload() {
        let mut v = RunsView::default();
        v.set_rows(vec![
            row(1, "alpha", RunStatus::Finished),
            row(2, "beta", RunStatus::Failed),
            row(3, "gamma", RunStatus::Running),
        ]);
        // Newest first: gamma, beta, alpha.
        assert_eq!(v.selected, Some(RunId(3)));
        v.act(Action::Down);
        assert_eq!(v.selected, Some(RunId(2)));
        v.act(Action::Sort); // by name: alpha, beta, gamma — still beta
        assert_eq!(v.selected_index(), Some(1));
        v.act(Action::Mark);
        v.set_filter("ALP".into()); // beta hidden: the selection moves to alpha
        assert_eq!(v.selected, Some(RunId(1)));
        assert_eq!(v.visible().len(), 1);
        v.set_filter(String::new());
        v.set_rows(vec![row(1, "alpha", RunStatus::Finished)]); // beta deleted: its mark goes
        assert!(v.marked.is_empty());
        assert_eq!(age(90_000, 0), "1m");
        assert_eq!(age(3 * 86_400_000, 0), "3d");
    }
}
