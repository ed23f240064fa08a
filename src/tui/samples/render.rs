//! Drawing the Samples view ([`crate::tui::samples`]): a header saying what is shown, the groups, the
//! responses of the selected group and the selected response's details. Model output can hold
//! anything, so every string goes through [`one_line`] or [`wrap`] first: control characters are
//! made visible, nothing is cut inside a character, and very long text is cut short.

use crate::config::Stage;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, TableState};

use crate::metrics::SampleRecord;
use crate::tui::samples::{Group, Listing, SamplesView};
use crate::tui::theme::Theme;

/// The most characters of a string a one-line cell takes (wider than any terminal).
const ONE_LINE_CHARS: usize = 400;
/// The most characters of a response shown whole.
const WHOLE_CHARS: usize = 50_000;
/// Columns a tab takes in a whole response.
const TAB: &str = "    ";
/// From this width the details get a column of their own.
const WIDE: u16 = 120;

/// Formatting characters that reorder or hide text on a terminal (bidi overrides and isolates).
fn hides_text(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` on one line: newlines as `↵`, tabs as a space, other control characters as `�`; at
/// most `max` characters, then `…`.
pub fn one_line(text: &str, max: usize) -> String {
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n == max {
            out.push('…');
            break;
        }
        out.push(match c {
            '\n' => '↵',
            '\t' => ' ',
            c if c.is_control() || hides_text(c) => '�',
            c => c,
        });
    }
    out
}

/// Columns `c` takes on a terminal (control characters are replaced before this is asked).
fn char_width(c: char) -> usize {
    let mut buf = [0u8; 4];
    Span::raw(&*c.encode_utf8(&mut buf)).width()
}

/// `text` wrapped to `width` columns at spaces (long words are broken): tabs expanded, `\r`
/// dropped, other control characters as `�`. At most [`WHOLE_CHARS`] characters, then a note.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let total = text.chars().count();
    let mut out = vec![];
    for raw in text
        .chars()
        .take(WHOLE_CHARS)
        .collect::<String>()
        .split('\n')
    {
        let mut chars: Vec<(char, usize)> = vec![];
        for c in raw.chars() {
            match c {
                '\r' => {}
                '\t' => chars.extend(TAB.chars().map(|c| (c, 1))),
                c if c.is_control() || hides_text(c) => chars.push(('�', 1)),
                c => chars.push((c, char_width(c))),
            }
        }
        wrap_line(&chars, width, &mut out);
    }
    if total > WHOLE_CHARS {
        out.push(format!("… {} more characters", total - WHOLE_CHARS));
    }
    out
}

fn wrap_line(chars: &[(char, usize)], width: usize, out: &mut Vec<String>) {
    if chars.is_empty() {
        out.push(String::new());
    }
    let mut start = 0;
    while start < chars.len() {
        let (mut end, mut used) = (start, 0);
        while let Some(&(_, w)) = chars.get(end) {
            if used + w > width && end > start {
                break;
            }
            used += w;
            end += 1;
        }
        if end < chars.len() {
            let space = chars[start..end].iter().rposition(|&(c, _)| c == ' ');
            if let Some(at) = space.filter(|&at| at > 0) {
                end = start + at + 1;
            }
        }
        out.push(chars[start..end].iter().map(|&(c, _)| c).collect());
        start = end;
    }
}

/// Lines `text` takes wrapped to `width` columns.
pub fn wrapped_lines(text: &str, width: usize) -> u16 {
    u16::try_from(wrap(text, width).len()).unwrap_or(u16::MAX)
}

/// A reward or advantage with three decimals; NaN (not scored) as `—`.
fn value(v: f64, signed: bool) -> String {
    match v {
        v if v.is_nan() => "—".into(),
        v if signed => format!("{v:+.3}"),
        v => format!("{v:.3}"),
    }
}

/// A bar of `width` cells filled to `frac` (0..=1), in eighths.
fn bar(frac: f64, width: usize) -> String {
    const PARTS: [&str; 8] = ["", "▏", "▎", "▍", "▌", "▋", "▊", "▉"];
    let eighths = (frac.clamp(0.0, 1.0) * (width * 8) as f64).round() as usize;
    format!("{}{}", "█".repeat(eighths / 8), PARTS[eighths % 8])
}

fn block<'a>(title: String, focused: bool, theme: &Theme) -> Block<'a> {
    theme.panel(title, focused)
}

fn header(view: &SamplesView, theme: &Theme) -> Line<'static> {
    let mut spans = vec![Span::styled(" Samples · ", theme.title)];
    let shown = match (view.following(), view.step()) {
        (Some(prompt), step) => {
            let steps = view.listing().map(Listing::step_count);
            let across = steps.map_or(String::new(), |k| format!(" across {k} steps"));
            let back = step.map_or(String::new(), |s| format!(" (f: back to step {s})"));
            format!("following “{}”{across}{back}", one_line(prompt, 40))
        }
        (None, Some(step)) => {
            let last = view.steps().last().copied().unwrap_or(step);
            format!("{} step {step} of {last}", view.stage())
        }
        (None, None) => String::new(),
    };
    spans.push(Span::styled(shown, theme.text));
    if !view.filter().is_empty() {
        let search = format!(" · search “{}”", one_line(view.filter(), 30));
        spans.push(Span::styled(search, theme.muted));
    }
    if let Some(domain) = view.domain() {
        spans.push(Span::styled(
            format!(" · domain {}", one_line(domain, 20)),
            theme.muted,
        ));
    }
    let shown = view.shown();
    if shown.narrow != crate::tui::samples::Narrow::All {
        spans.push(Span::styled(
            format!(" · {}", shown.narrow.as_str()),
            theme.muted,
        ));
    }
    if shown.worst_first {
        spans.push(Span::styled(" · worst first", theme.muted));
    }
    Line::from(spans)
}

pub fn render(frame: &mut Frame, area: Rect, view: &SamplesView, spinner: &str, theme: &Theme) {
    let [head, body] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    frame.render_widget(Paragraph::new(header(view, theme)), head);
    let say = |frame: &mut Frame, text: String| {
        frame.render_widget(Paragraph::new(text).style(theme.muted), body);
    };
    if !view.loaded {
        return say(frame, format!("{spinner} loading samples…"));
    }
    if view.steps().is_empty() {
        let mut stages: Vec<&str> = Stage::ALL
            .into_iter()
            .filter(|s| s.records_samples())
            .map(Stage::as_str)
            .collect();
        let last = stages.pop().unwrap_or_default();
        return say(
            frame,
            format!(
                "No samples yet: they appear as the run's {} or {last} steps are recorded.",
                stages.join(", ")
            ),
        );
    }
    let Some(listing) = view.listing() else {
        return say(
            frame,
            match (view.following(), view.step()) {
                (Some(_), _) => format!("{spinner} loading this prompt's samples at every step…"),
                (None, Some(step)) => format!("{spinner} loading the samples of step {step}…"),
                (None, None) => format!("{spinner} loading samples…"),
            },
        );
    };
    if listing.samples.is_empty() {
        let text = match (view.following(), view.step()) {
            (None, Some(step)) => format!("No {} samples at step {step}.", view.stage()),
            _ => format!("No {} samples of this prompt.", view.stage()),
        };
        return say(frame, text);
    }
    if listing.groups.is_empty() {
        return say(
            frame,
            "No group matches the filters (Esc clears the search, Tab changes the domain, w the wrong/flat filter).".into(),
        );
    }
    let by_step = view.following().is_some();
    if body.width >= WIDE {
        let [left, detail] =
            Layout::horizontal([Constraint::Percentage(55), Constraint::Min(0)]).areas(body);
        let [groups, responses] =
            Layout::vertical([Constraint::Percentage(50), Constraint::Min(0)]).areas(left);
        render_groups(frame, groups, listing, by_step, theme);
        render_responses(frame, responses, listing, theme);
        render_detail(frame, detail, view, listing, theme);
    } else if view.whole {
        let [responses, detail] =
            Layout::vertical([Constraint::Length(6), Constraint::Min(0)]).areas(body);
        render_responses(frame, responses, listing, theme);
        render_detail(frame, detail, view, listing, theme);
    } else {
        let [groups, responses, detail] = Layout::vertical([
            Constraint::Percentage(35),
            Constraint::Percentage(30),
            Constraint::Min(6),
        ])
        .areas(body);
        render_groups(frame, groups, listing, by_step, theme);
        render_responses(frame, responses, listing, theme);
        render_detail(frame, detail, view, listing, theme);
    }
}

fn table<'a>(
    rows: Vec<Row<'a>>,
    widths: Vec<Constraint>,
    header: Row<'a>,
    theme: &Theme,
) -> Table<'a> {
    Table::new(rows, widths)
        .header(header.style(theme.header))
        .row_highlight_style(theme.selected.add_modifier(Modifier::BOLD))
        .highlight_symbol("▶ ")
}

fn render_groups(frame: &mut Frame, area: Rect, l: &Listing, by_step: bool, theme: &Theme) {
    let sample = |g: &Group| g.members.first().and_then(|&i| l.samples.get(i));
    let ok = |g: &Group| format!("{}/{}", g.correct, g.size);
    let flat = |g: &Group| Cell::from(if g.flat { "flat" } else { "" }).style(theme.muted);
    let (rows, widths, head, title): (Vec<Row>, _, _, _) = if by_step {
        // Rewards are usually in 0..1; wider ranges stretch the bars.
        let means = l
            .groups
            .iter()
            .map(|g| f64::from(g.mean))
            .filter(|m| m.is_finite());
        let lo = means.clone().fold(0.0, f64::min);
        let hi = means.fold(1.0, f64::max);
        let rows = l.groups.iter().map(|g| {
            let frac = (f64::from(g.mean) - lo) / (hi - lo);
            Row::new([
                Cell::from(g.step.to_string()),
                Cell::from(value(g.mean.into(), false)),
                Cell::from(ok(g)),
                flat(g),
                Cell::from(if g.mean.is_nan() {
                    String::new()
                } else {
                    bar(frac, 20)
                })
                .style(Style::default().fg(theme.series_color(0))),
            ])
        });
        let widths = vec![
            Constraint::Length(6),
            Constraint::Length(6),
            Constraint::Length(5),
            Constraint::Length(4),
            Constraint::Min(8),
        ];
        let head = Row::new(["step", "reward", "ok", "", "mean reward"]);
        (
            rows.collect(),
            widths,
            head,
            format!(" steps ({}) ", l.groups.len()),
        )
    } else {
        let rows = l.groups.iter().map(|g| {
            let (domain, prompt) = sample(g).map_or((String::new(), String::new()), |s| {
                (one_line(&s.domain, 40), one_line(&s.prompt, ONE_LINE_CHARS))
            });
            Row::new([
                Cell::from(domain).style(theme.muted),
                Cell::from(prompt),
                Cell::from(value(g.mean.into(), false)),
                Cell::from(ok(g)),
                flat(g),
            ])
        });
        let widths = vec![
            Constraint::Length(8),
            Constraint::Min(10),
            Constraint::Length(6),
            Constraint::Length(5),
            Constraint::Length(4),
        ];
        let head = Row::new(["domain", "prompt", "reward", "ok", ""]);
        (
            rows.collect(),
            widths,
            head,
            format!(" groups ({}) ", l.groups.len()),
        )
    };
    let t = table(rows, widths, head, theme).block(block(title, false, theme));
    let mut state = TableState::default().with_selected(l.selected_group());
    frame.render_stateful_widget(t, area, &mut state);
}

fn render_responses(frame: &mut Frame, area: Rect, l: &Listing, theme: &Theme) {
    let group = l.selected_group().and_then(|g| l.groups.get(g));
    let members: &[usize] = group.map_or(&[], |g| &g.members);
    let rows: Vec<Row> = members
        .iter()
        .filter_map(|&i| l.samples.get(i))
        .map(|s| {
            let style = if s.correct { theme.good } else { theme.bad };
            Row::new([
                Cell::from(value(s.reward.into(), false)).style(style),
                Cell::from(value(s.advantage.into(), true)),
                Cell::from(s.response_tokens.to_string()),
                Cell::from(one_line(&s.finish_reason, 20)).style(theme.muted),
                Cell::from(format!("v{}", s.policy_version)).style(theme.muted),
                Cell::from(one_line(&s.response, ONE_LINE_CHARS)),
            ])
        })
        .collect();
    let widths = vec![
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(4),
        // The longest finish: a DPO pair's "rejected".
        Constraint::Length(8),
        Constraint::Length(4),
        Constraint::Min(10),
    ];
    let head = Row::new(["reward", "adv", "tok", "finish", "ver", "response"]);
    let title = match group {
        Some(g) => format!(" responses at step {} ({}) ", g.step, members.len()),
        None => " responses ".into(),
    };
    let at = l
        .selected
        .and_then(|s| members.iter().position(|&i| i == s));
    let t = table(rows, widths, head, theme).block(block(title, true, theme));
    frame.render_stateful_widget(t, area, &mut TableState::default().with_selected(at));
}

fn labelled<'a>(label: &'a str, text: String, theme: &Theme) -> Line<'a> {
    Line::from(vec![
        Span::styled(format!("{label:<10}"), theme.muted),
        Span::raw(text),
    ])
}

fn render_detail(frame: &mut Frame, area: Rect, view: &SamplesView, l: &Listing, theme: &Theme) {
    let Some(s) = l.selected_sample() else {
        frame.render_widget(block(" response ".into(), false, theme), area);
        return;
    };
    let group = l.selected_group().and_then(|g| l.groups.get(g));
    let members: &[usize] = group.map_or(&[], |g| &g.members);
    let n = l
        .selected
        .and_then(|i| members.iter().position(|&m| m == i));
    let title = format!(
        " step {} · response {}/{}{} ",
        s.step,
        n.map_or(0, |n| n + 1),
        members.len(),
        if view.whole { " · whole" } else { "" }
    );
    let outer = block(title, false, theme);
    let inner = outer.inner(area);
    frame.render_widget(outer, area);
    let mut lines = stats(s, inner.width, theme);
    lines.push(breakdown(s, theme));
    lines.push(labelled(
        "truth",
        one_line(&s.ground_truth, ONE_LINE_CHARS),
        theme,
    ));
    if !view.whole {
        lines.push(labelled(
            "prompt",
            one_line(&s.prompt, ONE_LINE_CHARS),
            theme,
        ));
        lines.push(labelled(
            "response",
            one_line(&s.response, ONE_LINE_CHARS),
            theme,
        ));
        lines.push(Line::styled(
            if s.tokens.is_some() {
                "Enter: the whole response · T: its tokens"
            } else {
                "Enter: the whole response"
            },
            theme.muted,
        ));
        frame.render_widget(Paragraph::new(lines), inner);
        return;
    }
    lines.push(Line::styled(
        if view.showing_tokens() {
            "tokens: log-probs, student and teachers (T: the text · PgUp PgDn: scroll)"
        } else if s.tokens.is_some() {
            "response (Enter: one line · T: its tokens · PgUp PgDn: scroll)"
        } else {
            "response (Enter: one line · PgUp PgDn: scroll)"
        },
        theme.muted,
    ));
    let [top, text] =
        Layout::vertical([Constraint::Length(lines.len() as u16), Constraint::Min(0)]).areas(inner);
    frame.render_widget(Paragraph::new(lines), top);
    if view.showing_tokens() {
        let (head, rows) = crate::tui::samples::tokens::token_lines(s.tokens.as_ref(), theme);
        let [head_area, text] =
            Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(text);
        frame.render_widget(Paragraph::new(head), head_area);
        let most = rows.len().saturating_sub(usize::from(text.height));
        let from = usize::from(view.scroll).min(most);
        let shown: Vec<Line> = rows
            .into_iter()
            .skip(from)
            .take(usize::from(text.height))
            .collect();
        frame.render_widget(Paragraph::new(shown), text);
        return;
    }
    let wrapped = wrap(&s.response, usize::from(text.width));
    let most = wrapped.len().saturating_sub(usize::from(text.height));
    let from = usize::from(view.scroll).min(most);
    let shown: Vec<Line> = wrapped
        .into_iter()
        .skip(from)
        .take(usize::from(text.height))
        .map(Line::from)
        .collect();
    frame.render_widget(Paragraph::new(shown), text);
}

/// The numbers of a sample: one line, or two where `width` is narrower than one.
fn stats<'a>(s: &SampleRecord, width: u16, theme: &Theme) -> Vec<Line<'a>> {
    let (mark, style) = if s.correct {
        ("✓ correct", theme.good)
    } else {
        ("✗ wrong", theme.bad)
    };
    let first = vec![
        Span::styled("reward ", theme.muted),
        Span::raw(value(s.reward.into(), false)),
        Span::styled("  adv ", theme.muted),
        Span::raw(value(s.advantage.into(), true)),
        Span::raw("  "),
        Span::styled(mark, style),
    ];
    let second = vec![
        Span::styled("tokens ", theme.muted),
        Span::raw(format!("{} → {}", s.prompt_tokens, s.response_tokens)),
        Span::styled("  finish ", theme.muted),
        Span::raw(one_line(&s.finish_reason, 20)),
        Span::styled("  policy ", theme.muted),
        Span::raw(format!("v{}", s.policy_version)),
    ];
    let (first, second) = (Line::from(first), Line::from(second));
    if first.width() + 2 + second.width() <= usize::from(width) {
        let mut spans = first.spans;
        spans.push(Span::raw("  "));
        spans.extend(second.spans);
        vec![Line::from(spans)]
    } else {
        vec![first, second]
    }
}

fn breakdown<'a>(s: &SampleRecord, theme: &Theme) -> Line<'a> {
    let parts: Vec<String> = s
        .breakdown
        .iter()
        .map(|(k, v)| format!("{} {}", one_line(k, 30), value(*v, false)))
        .collect();
    let text = if parts.is_empty() {
        "-".into()
    } else {
        parts.join(" · ")
    };
    labelled("breakdown", text, theme)
}
