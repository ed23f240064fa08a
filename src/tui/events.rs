//! The Events view: a run's run, worker and scheduler events (worker logs, failures, offload/reload
//! transfers) as a list that follows new events like `tail -f`, narrowed by kind (Tab) and by text
//! (`/`), and cut at the replay cursor. Messages are data from worker processes: they are shown
//! with control characters and escape sequences replaced, never interpreted.

use std::sync::Arc;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table, TableState, Wrap};

use super::action::Action;
use super::theme::Theme;
use crate::store::RunId;
use crate::store::reads::StoredEvent;
use crate::store::records::EventKind;

pub use crate::text::{clean, human_bytes, rel_time};

/// Which kinds of events the list shows; Tab and Shift-Tab cycle through them in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KindFilter {
    /// Everything but offloads and reloads, which time-sharing writes around every phase (hundreds
    /// of them in a run): the default, so the rest can be read.
    #[default]
    AllButTransfers,
    All,
    /// Warnings, errors and worker failures.
    Problems,
    /// Worker processes starting, exiting and failing.
    Workers,
    /// Offloads and reloads.
    Transfers,
    /// Worker output lines.
    Logs,
    /// The run starting, resuming and ending.
    Run,
}

impl KindFilter {
    const CYCLE: [KindFilter; 7] = [
        KindFilter::AllButTransfers,
        KindFilter::All,
        KindFilter::Problems,
        KindFilter::Workers,
        KindFilter::Transfers,
        KindFilter::Logs,
        KindFilter::Run,
    ];

    fn shift(self, by: usize) -> KindFilter {
        let at = Self::CYCLE.iter().position(|k| *k == self).unwrap_or(0);
        Self::CYCLE[(at + by) % Self::CYCLE.len()]
    }

    pub fn next(self) -> KindFilter {
        self.shift(1)
    }

    pub fn prev(self) -> KindFilter {
        self.shift(Self::CYCLE.len() - 1)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            KindFilter::AllButTransfers => "all but transfers",
            KindFilter::All => "all",
            KindFilter::Problems => "problems",
            KindFilter::Workers => "workers",
            KindFilter::Transfers => "transfers",
            KindFilter::Logs => "logs",
            KindFilter::Run => "run",
        }
    }

    pub fn matches(self, kind: EventKind) -> bool {
        use EventKind as K;
        match self {
            KindFilter::AllButTransfers => !matches!(kind, K::Offload | K::Reload),
            KindFilter::All => true,
            KindFilter::Problems => matches!(
                kind,
                K::Warning | K::Error | K::WorkerFailed | K::RunMarkedInterrupted
            ),
            KindFilter::Workers => {
                matches!(kind, K::WorkerStarted | K::WorkerExited | K::WorkerFailed)
            }
            KindFilter::Transfers => matches!(kind, K::Offload | K::Reload),
            KindFilter::Logs => kind == K::Info,
            KindFilter::Run => matches!(
                kind,
                K::RunStarted | K::RunResumed | K::RunEnded | K::RunMarkedInterrupted
            ),
        }
    }
}

/// Rows a page key moves.
const PAGE: usize = 10;
/// Characters of a message a list row keeps (the cell cuts the rest anyway).
const ROW_CHARS: usize = 400;
/// Characters of the selected message the detail pane shows.
const DETAIL_CHARS: usize = 4000;

#[derive(Debug, Clone)]
pub struct EventsView {
    pub run: RunId,
    /// False until the first load answers: the view shows a spinner.
    pub loaded: bool,
    pub kind: KindFilter,
    /// The selection is on the newest shown event and stays there as events arrive.
    pub follow: bool,
    events: Arc<Vec<StoredEvent>>,
    /// Lower-cased `kind worker message` of each event, for the text filter.
    haystack: Vec<String>,
    filter: String,
    filter_lower: String,
    /// The selected event (an index into `events`) while not following.
    selected: Option<usize>,
    /// The replay cursor the keys move within (see [`EventsView::set_until`]).
    until_ms: Option<i64>,
    /// The selected event while the list is given back (see [`EventsView::release`]).
    released: Option<StoredEvent>,
}

impl EventsView {
    pub fn new(run: RunId) -> EventsView {
        EventsView {
            run,
            loaded: false,
            kind: KindFilter::default(),
            follow: true,
            events: Arc::default(),
            haystack: vec![],
            filter: String::new(),
            filter_lower: String::new(),
            selected: None,
            until_ms: None,
            released: None,
        }
    }

    /// Replace the list (the whole of it, oldest first), of which the first `kept` events are
    /// those of the last list (only the rest is indexed again). A selection off the tail stays on
    /// its event.
    pub fn set_events(&mut self, events: Arc<Vec<StoredEvent>>, kept: usize) {
        let old = self
            .released
            .take()
            .or_else(|| self.selected.and_then(|i| self.events.get(i).cloned()));
        let kept = kept.min(self.haystack.len()).min(events.len());
        self.haystack.truncate(kept);
        self.haystack.extend(events[kept..].iter().map(haystack));
        self.events = events;
        self.loaded = true;
        if let (false, Some(old), Some(i)) = (self.follow, old, self.selected) {
            let same = |e: &StoredEvent| *e == old;
            self.selected = Some(if self.events.get(i).is_some_and(same) {
                i
            } else {
                self.events.iter().position(same).unwrap_or_else(|| {
                    // Gone (a store rewritten under us): the first event at or after its time.
                    self.events
                        .iter()
                        .position(|e| e.at >= old.at)
                        .unwrap_or(self.events.len().saturating_sub(1))
                })
            });
        }
        self.settle();
    }

    /// Give the shared list back until the next [`EventsView::set_events`] (so its owner can
    /// grow it without a copy), keeping the selection and the filter's index.
    pub fn release(&mut self) {
        self.released = self.selected.and_then(|i| self.events.get(i).cloned());
        self.events = Arc::default();
    }

    pub fn events(&self) -> &[StoredEvent] {
        &self.events
    }

    /// Case-insensitive text that the kind, worker or message of a shown event contains.
    pub fn set_filter(&mut self, text: String) {
        self.filter_lower = text.to_lowercase();
        self.filter = text;
        self.settle();
    }

    pub fn filter(&self) -> &str {
        &self.filter
    }

    /// The replay cursor time (Unix ms), so that keys move among the events `render` shows with the
    /// same `until_ms`. Optional: `render` keeps the selection within what it shows anyway.
    pub fn set_until(&mut self, until_ms: Option<i64>) {
        self.until_ms = until_ms;
        self.settle();
    }

    /// Indices (into [`EventsView::events`]) of the events shown, oldest first.
    pub fn visible(&self, until_ms: Option<i64>) -> Vec<usize> {
        (0..self.events.len())
            .filter(|&i| {
                let e = &self.events[i];
                until_ms.is_none_or(|u| e.at <= u)
                    && self.kind.matches(e.event.kind)
                    && self.haystack[i].contains(&self.filter_lower)
            })
            .collect()
    }

    /// The row of `visible` that is selected: the last when following; otherwise the selected
    /// event, or the nearest shown event before it.
    fn position(&self, visible: &[usize]) -> Option<usize> {
        let last = visible.len().checked_sub(1)?;
        match self.selected {
            Some(sel) if !self.follow => Some(
                visible
                    .iter()
                    .rposition(|&i| i <= sel)
                    .unwrap_or(0)
                    .min(last),
            ),
            _ => Some(last),
        }
    }

    /// The selected event as `render` with `until_ms` shows it.
    pub fn selected_event(&self, until_ms: Option<i64>) -> Option<&StoredEvent> {
        let visible = self.visible(until_ms);
        let at = self.position(&visible)?;
        self.events.get(visible[at])
    }

    /// Put the selection on a shown event; at the bottom it follows the tail.
    fn settle(&mut self) {
        let visible = self.visible(self.until_ms);
        if let Some(at) = self.position(&visible) {
            self.select(&visible, at);
        }
    }

    fn select(&mut self, visible: &[usize], at: usize) {
        let at = at.min(visible.len().saturating_sub(1));
        self.follow = at + 1 >= visible.len();
        self.selected = visible.get(at).copied();
    }

    pub fn act(&mut self, action: Action) {
        let visible = self.visible(self.until_ms);
        let Some(at) = self.position(&visible) else {
            // Nothing shown: only the kind filter can change.
            match action {
                Action::NextPane => self.kind = self.kind.next(),
                Action::PrevPane => self.kind = self.kind.prev(),
                _ => return,
            }
            return self.settle();
        };
        let last = visible.len() - 1;
        match action {
            Action::Up => self.select(&visible, at.saturating_sub(1)),
            Action::Down => self.select(&visible, (at + 1).min(last)),
            Action::PageUp => self.select(&visible, at.saturating_sub(PAGE)),
            Action::PageDown => self.select(&visible, (at + PAGE).min(last)),
            Action::Top => self.select(&visible, 0),
            Action::Bottom => self.select(&visible, last),
            Action::NextPane => {
                self.kind = self.kind.next();
                self.settle();
            }
            Action::PrevPane => {
                self.kind = self.kind.prev();
                self.settle();
            }
            _ => {}
        }
    }
}

fn haystack(e: &StoredEvent) -> String {
    let r = &e.event;
    format!(
        "{} {} {} {}",
        r.kind.as_str(),
        kind_label(r.kind),
        r.worker.as_deref().unwrap_or(""),
        r.message
    )
    .to_lowercase()
}

/// Warnings read in yellow (the theme has no warning colour of its own).
pub(crate) fn warn_style() -> Style {
    Style::default().fg(Color::Yellow)
}

/// The colour of an event by its severity.
pub(crate) fn severity_style(kind: EventKind, theme: &Theme) -> Style {
    use EventKind as K;
    match kind {
        K::Error | K::WorkerFailed => theme.bad,
        K::Warning | K::RunMarkedInterrupted => warn_style(),
        K::RunStarted | K::RunResumed | K::WorkerStarted => theme.good,
        K::Offload | K::Reload => Style::default().fg(Color::Cyan),
        K::RunEnded | K::WorkerExited | K::Info => theme.text,
    }
}

/// The short name of a kind in the list.
fn kind_label(kind: EventKind) -> &'static str {
    use EventKind as K;
    match kind {
        K::RunStarted => "run",
        K::RunResumed => "resumed",
        K::RunEnded => "ended",
        K::RunMarkedInterrupted => "gone",
        K::WorkerStarted => "started",
        K::WorkerExited => "exited",
        K::WorkerFailed => "failed",
        K::Offload => "offload",
        K::Reload => "reload",
        K::Info => "log",
        K::Warning => "warning",
        K::Error => "error",
    }
}

/// Who an event is about: a worker or role (with its devices), or the run.
fn source(e: &StoredEvent) -> String {
    let r = &e.event;
    let who = clean(r.worker.as_deref().unwrap_or("run"), 40, false);
    match r.device.as_deref() {
        Some(d) if !d.is_empty() => format!("{who}@{}", clean(d, 20, false)),
        _ => who,
    }
}

/// The list's text of an event: a transfer as its size, time and phase (the kind and source
/// columns say the rest; the detail pane has the whole message).
pub(crate) fn row_text(e: &StoredEvent) -> String {
    let r = &e.event;
    match (r.kind, r.bytes, r.duration_s) {
        (EventKind::Offload | EventKind::Reload, Some(b), Some(s)) => {
            let phase = r
                .phase
                .as_deref()
                .map(|p| format!("(phase {p})"))
                .unwrap_or_default();
            format!(
                "{} in {s:.2} s {}",
                human_bytes(b),
                clean(&phase, 40, false)
            )
        }
        // `run 'NAME' started`: the list is the run's, so the name goes.
        (EventKind::RunStarted, _, _) if r.worker.is_none() => {
            let text = r.message.trim_end();
            let rest = text
                .strip_prefix("run '")
                .and_then(|t| t.split_once("' "))
                .map_or(text, |(_, rest)| rest);
            clean(rest, ROW_CHARS, false)
        }
        _ => clean(r.message.trim_end(), ROW_CHARS, false),
    }
}

pub fn render(
    frame: &mut Frame,
    area: Rect,
    view: &EventsView,
    until_ms: Option<i64>,
    run_start_ms: i64,
    spinner: &str,
    theme: &Theme,
) {
    let visible = view.visible(until_ms);
    // The count is of the kind shown; what the kind hides is said apart (time-sharing writes
    // hundreds of transfers, which would dwarf "1/599").
    let of_kind = view
        .events
        .iter()
        .filter(|e| view.kind.matches(e.event.kind))
        .count();
    let mut title = format!(" Events {}/{of_kind}", visible.len());
    title.push_str(&format!(" · kind: {}", view.kind.as_str()));
    if of_kind < view.events.len() {
        title.push_str(&format!(" ({} hidden)", view.events.len() - of_kind));
    }
    if !view.filter.is_empty() {
        title.push_str(&format!(" · filter: {}", clean(&view.filter, 30, false)));
    }
    if let Some(u) = until_ms {
        title.push_str(&format!(" · until {}", rel_time(u - run_start_ms)));
    } else if view.follow && !visible.is_empty() {
        title.push_str(" · following");
    }
    title.push(' ');
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(theme.border)
        .title(Span::styled(title, theme.title));
    if !view.loaded {
        let text = Paragraph::new(format!("{spinner} reading the run's events…"))
            .style(theme.muted)
            .block(block);
        frame.render_widget(text, area);
        return;
    }
    if visible.is_empty() {
        let text = if view.events.is_empty() {
            "No events recorded for this run yet: workers, transfers and logs appear here as the run \
             writes them."
        } else if until_ms.is_some_and(|u| view.events.iter().all(|e| e.at > u)) {
            "No event before the replay cursor."
        } else {
            "No event matches: Tab cycles the kind filter, / edits the text filter (Esc clears it)."
        };
        let text = Paragraph::new(text)
            .style(theme.muted)
            .wrap(Wrap { trim: true })
            .block(block);
        frame.render_widget(text, area);
        return;
    }
    let selected = view.position(&visible);
    let (list_area, detail_area) = if area.height >= 14 {
        let detail = if area.height >= 30 { 8 } else { 5 };
        let [a, b] = Layout::vertical([Constraint::Min(0), Constraint::Length(detail)]).areas(area);
        (a, Some(b))
    } else {
        (area, None)
    };
    let source_width = visible
        .iter()
        .map(|&i| source(&view.events[i]).chars().count())
        .max()
        .unwrap_or(0)
        .clamp(3, 22) as u16;
    let rows: Vec<Row> = visible
        .iter()
        .map(|&i| {
            let e = &view.events[i];
            let style = severity_style(e.event.kind, theme);
            Row::new([
                Cell::from(rel_time(e.at - run_start_ms)).style(theme.muted),
                Cell::from(kind_label(e.event.kind)).style(style),
                // A run's own events: the kind column says "run" already.
                Cell::from(if e.event.worker.is_some() {
                    source(e)
                } else {
                    String::new()
                }),
                Cell::from(row_text(e)).style(match e.event.kind {
                    EventKind::Info => theme.text,
                    k => severity_style(k, theme),
                }),
            ])
        })
        .collect();
    let widths = [
        Constraint::Length(9),
        Constraint::Length(7),
        Constraint::Length(source_width),
        Constraint::Min(10),
    ];
    let table = Table::new(rows, widths)
        .block(block)
        .row_highlight_style(theme.selected.add_modifier(Modifier::BOLD))
        .highlight_symbol("▶ ");
    let mut state = TableState::default().with_selected(selected);
    frame.render_stateful_widget(table, list_area, &mut state);
    if let (Some(area), Some(at)) = (detail_area, selected) {
        render_detail(frame, area, &view.events[visible[at]], run_start_ms, theme);
    }
}

/// The whole message of the selected event, wrapped, with its newlines.
fn render_detail(frame: &mut Frame, area: Rect, e: &StoredEvent, run_start_ms: i64, theme: &Theme) {
    let r = &e.event;
    let mut title = format!(
        " {} · {} · {}",
        rel_time(e.at - run_start_ms),
        r.kind.as_str(),
        source(e)
    );
    if let (Some(b), Some(s)) = (r.bytes, r.duration_s) {
        title.push_str(&format!(" · {} in {s:.3} s", human_bytes(b)));
    }
    title.push(' ');
    let lines: Vec<Line> = clean(r.message.trim_end(), DETAIL_CHARS, true)
        .split('\n')
        .map(|l| Line::from(l.to_string()))
        .collect();
    let text = Paragraph::new(lines)
        .style(severity_style(r.kind, theme))
        .wrap(Wrap { trim: false })
        .block(
            Block::default()
                .borders(Borders::ALL)
                .border_style(theme.border)
                .title(Span::styled(title, theme.title)),
        );
    frame.render_widget(text, area);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    pub use crate::store::fixtures::{ev, transfer};

    pub fn screen(width: u16, height: u16, draw: impl FnOnce(&mut Frame)) -> String {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(draw).unwrap();
        terminal.backend().to_string()
    }

    /// A run's events, 1 s apart from 0: one of every kind, a restart, and messages with control
    /// characters, escapes and long lines.
    fn sample() -> Vec<StoredEvent> {
        use EventKind as K;
        let mib = 1u64 << 20;
        let list = vec![
            ev(0, K::RunStarted, None, "run 'grpo-math' started"),
            ev(0, K::WorkerStarted, Some("reward-0"), "started, pid 4101"),
            ev(0, K::WorkerStarted, Some("reward-1"), "started, pid 4102"),
            ev(
                0,
                K::WorkerStarted,
                Some("actor_infer-0"),
                "started, pid 4200",
            ),
            transfer(0, false, "actor_infer", "0", 300 * mib, "train"),
            ev(
                0,
                K::Info,
                Some("reward-1"),
                "stderr: \x1b[31mwarning\x1b[0m: slow sandbox\r\n",
            ),
            ev(
                0,
                K::WorkerFailed,
                Some("reward-1"),
                "pid 4102 died (signal: 9 (SIGKILL))",
            ),
            ev(0, K::WorkerStarted, Some("reward-1"), "started, pid 4103"),
            ev(
                0,
                K::Warning,
                Some("reward-1"),
                "replaced (worker reward-1 died)",
            ),
            transfer(0, true, "actor_infer", "0", 300 * mib, "generate"),
            ev(
                0,
                K::Info,
                Some("actor_infer-0"),
                &format!("stdout: {}", "é→ long line ".repeat(30)),
            ),
            ev(
                0,
                K::Info,
                Some("actor_infer-0"),
                "stdout: line one\nline two\ttabbed\u{202e}reversed",
            ),
            ev(0, K::Error, None, "run failed: worker reward-1 died again"),
            ev(0, K::RunEnded, None, "run finished"),
        ];
        list.into_iter()
            .enumerate()
            .map(|(i, mut e)| {
                e.at = 1_000 * i as i64;
                e
            })
            .collect()
    }

    /// The sample events, every kind shown.
    fn loaded() -> EventsView {
        let mut v = EventsView::new(RunId(1));
        v.set_events(Arc::new(sample()), 0);
        v.kind = KindFilter::All;
        v
    }

    fn kinds(v: &EventsView) -> Vec<EventKind> {
        v.visible(None)
            .iter()
            .map(|&i| v.events()[i].event.kind)
            .collect()
    }

    #[test]
    fn the_kind_filter_cycles_through_every_kind_group() {
        use EventKind as K;
        // A fresh view hides the offloads and reloads, and only them.
        let mut fresh = EventsView::new(RunId(1));
        fresh.set_events(Arc::new(sample()), 0);
        assert_eq!(fresh.kind.as_str(), "all but transfers");
        let mut v = loaded();
        let mut all = kinds(&v);
        all.retain(|k| !matches!(k, K::Offload | K::Reload));
        assert_eq!(kinds(&fresh), all);
        let mut seen = vec![v.kind];
        for _ in 0..7 {
            v.act(Action::NextPane);
            seen.push(v.kind);
        }
        assert_eq!(
            seen.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
            [
                "all",
                "problems",
                "workers",
                "transfers",
                "logs",
                "run",
                "all but transfers",
                "all"
            ]
        );
        v.act(Action::PrevPane); // all → all but transfers
        v.act(Action::PrevPane); // → run
        assert_eq!(kinds(&v), [K::RunStarted, K::RunEnded]);
        v.act(Action::PrevPane);
        assert_eq!(kinds(&v), [K::Info, K::Info, K::Info]);
        v.act(Action::PrevPane);
        assert_eq!(kinds(&v), [K::Offload, K::Reload]);
        v.act(Action::PrevPane);
        assert_eq!(
            kinds(&v),
            [
                K::WorkerStarted,
                K::WorkerStarted,
                K::WorkerStarted,
                K::WorkerFailed,
                K::WorkerStarted
            ]
        );
        v.act(Action::PrevPane);
        assert_eq!(kinds(&v), [K::WorkerFailed, K::Warning, K::Error]);
        // Following the tail: each filter shows its newest event selected.
        assert_eq!(v.selected_event(None).map(|e| e.at), Some(12_000));
    }

    #[test]
    fn the_text_filter_is_case_insensitive_over_kind_worker_and_message() {
        let mut v = loaded();
        v.set_filter("REWARD-1".into());
        assert_eq!(v.filter(), "REWARD-1");
        // Its own five events, and the run error that names it.
        assert_eq!(v.visible(None), [2, 5, 6, 7, 8, 12]);
        v.set_filter("Reload".into()); // the kind
        assert_eq!(v.visible(None), [9]);
        v.set_filter("sigkill".into()); // the message
        assert_eq!(v.visible(None), [6]);
        v.act(Action::NextPane); // problems and the text together
        assert_eq!(v.visible(None), [6]);
        v.act(Action::PrevPane);
        v.set_filter("LOG".into()); // the label of info events
        assert_eq!(v.visible(None), [5, 10, 11]);
        v.act(Action::Top);
        v.set_filter("nothing like this".into());
        assert!(v.visible(None).is_empty());
        v.act(Action::Down); // nothing to move to: no panic, nothing selected
        assert_eq!(v.selected_event(None), None);
        v.set_filter("log".into()); // the selection was kept meanwhile
        assert_eq!(v.selected_event(None).map(|e| e.at), Some(5_000));
    }

    #[test]
    fn the_selection_follows_the_tail_until_moved_off_it() {
        let all = sample();
        let mut v = EventsView::new(RunId(1));
        v.kind = KindFilter::All;
        assert!(!v.loaded);
        v.set_events(Arc::new(all[..5].to_vec()), 0);
        assert!(v.loaded && v.follow);
        assert_eq!(v.selected_event(None), Some(&all[4]));
        v.set_events(Arc::new(all[..8].to_vec()), 5); // new events: still on the newest, like tail -f
        assert_eq!(v.selected_event(None), Some(&all[7]));
        v.act(Action::Up);
        assert!(!v.follow);
        assert_eq!(v.selected_event(None), Some(&all[6]));
        v.set_events(Arc::new(all.clone()), 0); // the selection stays on its event
        assert_eq!(v.selected_event(None), Some(&all[6]));
        // An event recorded with an earlier time lands before it: still the same event.
        let mut shifted = all.clone();
        shifted.insert(1, ev(500, EventKind::Info, Some("env-0"), "late line"));
        v.set_events(Arc::new(shifted.clone()), 0);
        assert_eq!(v.selected_event(None), Some(&all[6]));
        v.act(Action::Bottom);
        assert!(v.follow);
        shifted.push(ev(99_000, EventKind::Info, None, "newest"));
        v.set_events(Arc::new(shifted), 0);
        assert_eq!(v.selected_event(None).map(|e| e.at), Some(99_000));
    }

    #[test]
    fn moves_are_clamped_to_the_events_shown() {
        let all = sample();
        let mut v = loaded();
        v.act(Action::Top);
        assert_eq!(v.selected_event(None), Some(&all[0]));
        v.act(Action::Up);
        assert_eq!(v.selected_event(None), Some(&all[0]));
        v.act(Action::PageDown);
        assert_eq!(v.selected_event(None), Some(&all[10]));
        assert!(!v.follow);
        v.act(Action::PageDown); // past the end: the last, which follows again
        assert_eq!(v.selected_event(None), Some(&all[13]));
        assert!(v.follow);
        v.act(Action::PageUp);
        assert_eq!(v.selected_event(None), Some(&all[3]));
        // A filter that hides the selected event moves it to the nearest shown one before it.
        v.set_filter("reward".into());
        assert_eq!(v.selected_event(None), Some(&all[2]));
        v.set_filter(String::new());
        // The replay cursor hides later events; keys move among the ones before it.
        v.set_until(Some(4_000));
        v.act(Action::Bottom);
        assert_eq!(v.selected_event(Some(4_000)), Some(&all[4]));
        v.act(Action::Down);
        assert_eq!(v.selected_event(Some(4_000)), Some(&all[4]));
        // Rendered with an earlier cursor than the keys know: clamped there too.
        assert_eq!(v.selected_event(Some(2_500)), Some(&all[2]));
        let mut empty = EventsView::new(RunId(2));
        for a in [
            Action::Down,
            Action::PageUp,
            Action::Bottom,
            Action::NextPane,
        ] {
            empty.act(a);
        }
        assert_eq!(empty.selected_event(None), None);
    }

    fn draw(v: &EventsView, until: Option<i64>, width: u16, height: u16) -> String {
        screen(width, height, |f| {
            render(f, f.area(), v, until, 0, "⠋", &Theme::default())
        })
    }

    #[test]
    fn snapshots() {
        let mut v = loaded();
        insta::assert_snapshot!("events_80x24", draw(&v, None, 80, 24));
        v.act(Action::Top);
        v.act(Action::Down);
        v.act(Action::Down);
        v.act(Action::Down);
        v.act(Action::Down);
        v.act(Action::Down);
        insta::assert_snapshot!("events_selected_log_80x24", draw(&v, None, 80, 24));
        v.act(Action::NextPane);
        insta::assert_snapshot!(
            "events_problems_replay_120x40",
            draw(&v, Some(8_000), 120, 40)
        );
        let mut v = loaded();
        v.act(Action::Bottom);
        v.act(Action::Up);
        v.act(Action::Up);
        v.act(Action::Up);
        insta::assert_snapshot!("events_long_line_120x40", draw(&v, None, 120, 40));
        // A long list that follows its tail shows the newest event on the last row.
        let mut v = EventsView::new(RunId(1));
        v.set_events(
            Arc::new(
                (0..100)
                    .map(|i| {
                        ev(
                            i * 1000,
                            EventKind::Info,
                            Some("env-0"),
                            &format!("line {i}"),
                        )
                    })
                    .collect(),
            ),
            0,
        );
        let text = draw(&v, None, 80, 24);
        let rows: Vec<&str> = text.lines().collect();
        assert!(rows[17].contains("▶ +1m39s") && rows[17].contains("line 99"));
        assert!(!text.contains("+0.0 s"));
        let mut v = EventsView::new(RunId(1));
        insta::assert_snapshot!("events_loading", draw(&v, None, 80, 24));
        v.set_events(Arc::new(vec![]), 0);
        insta::assert_snapshot!("events_empty", draw(&v, None, 80, 24));
    }
}
