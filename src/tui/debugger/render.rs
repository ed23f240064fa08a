//! Drawing the Env view ([`crate::tui::debugger`]): a header (env, seed, policy, turn, return), the
//! state before the selected turn as the env drew it (line by line, so grids stay grids), the
//! turns, and a detail panel (Tab): the exact prompt, the raw output with each token's
//! probability (unlikely ones marked) and the selected token's alternatives, the step's reward and
//! info (and a stored episode's divergence), and the action distribution of the last resample.
//! Model and program text goes through [`one_line`] first.

use ratatui::Frame;
use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Clear, Paragraph, Row, Table, TableState, Wrap};

use crate::debugger::{DebugTurn, Session};
use crate::tui::debugger::{DebugView, Pane, PolicyKind, Work};
use crate::tui::samples::render::one_line;
use crate::tui::theme::Theme;

/// The most characters of one drawn line.
const LINE_CHARS: usize = 300;
/// Tokens drawn less likely than this are marked.
const UNLIKELY: f32 = 0.1;

fn policy_text(view: &DebugView) -> String {
    match view.policy {
        PolicyKind::Human => "human".into(),
        PolicyKind::Random => "random".into(),
        PolicyKind::Model => match &view.model {
            Some(m) => {
                let s = &m.sampling;
                format!(
                    "model {} (T {} · top-k {} · top-p {} · ≤{} tokens)",
                    one_line(&m.source, 60),
                    s.temperature,
                    s.top_k,
                    s.top_p,
                    s.max_new_tokens
                )
            }
            None => "model (none loaded: m)".into(),
        },
    }
}

fn header<'a>(view: &DebugView, s: Option<&Session>, theme: &Theme) -> Line<'a> {
    let mut spans = vec![Span::styled("Env debugger", theme.title)];
    if let Some(s) = s {
        let end = match (s.done(), s.success()) {
            (true, true) => " · done ✓",
            (true, false) => " · done",
            _ => "",
        };
        // How many turns are played, not a turn number: the panels name turns by their number
        // (`before turn 5`, `draws of turn 6`), and this must not read as a third one.
        let played = s.turns.len();
        spans.push(Span::raw(format!(
            " · {} · seed {} · {} · {played} turn{} played · return {:.2}{end}",
            s.env_name,
            s.seed,
            policy_text(view),
            crate::text::plural_s(played),
            s.total_reward() + 0.0,
        )));
    }
    if let Some(o) = &view.origin {
        spans.push(Span::styled(format!(" · from {o}"), theme.muted));
    }
    Line::from(spans)
}

pub fn render(frame: &mut Frame, area: Rect, view: &DebugView, spinner: &str, theme: &Theme) {
    let [head, body, message] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(2),
    ])
    .areas(area);
    let session = view.session.as_ref();
    frame.render_widget(Paragraph::new(header(view, session, theme)), head);
    frame.render_widget(
        Paragraph::new(message_line(view, spinner, theme)).wrap(Wrap { trim: false }),
        message,
    );
    let Some(s) = session else {
        let text = match view.busy {
            Some((Work::Opening, _)) => format!("{spinner} opening the stored episode…"),
            Some((Work::Stepping, _)) => {
                format!("{spinner} the environment's program is stepping…")
            }
            _ => "No episode: c chooses an environment (NAME key=value … seed=N).".into(),
        };
        frame.render_widget(Paragraph::new(text).style(theme.muted), body);
        return;
    };
    let [top, detail] =
        Layout::vertical([Constraint::Percentage(45), Constraint::Min(6)]).areas(body);
    let observation = match s.turns.get(view.selected) {
        Some(t) => t.observation.as_str(),
        None => s.observation(),
    };
    // The state's panel fits its widest line (and a border), within half the width.
    let widest = observation
        .lines()
        .map(|l| l.chars().count())
        .max()
        .unwrap_or(0)
        .saturating_add(2)
        .clamp(24, usize::from(area.width / 2).max(24));
    let [state, turns] = Layout::horizontal([
        Constraint::Length(u16::try_from(widest).unwrap_or(u16::MAX)),
        Constraint::Min(30),
    ])
    .areas(top);
    let title = match view.selected < s.turns.len() {
        true => format!("before turn {}", view.selected + 1),
        false => "now".into(),
    };
    frame.render_widget(
        Paragraph::new(
            observation
                .lines()
                .map(|l| Line::raw(one_line(l, LINE_CHARS)))
                .collect::<Vec<_>>(),
        )
        .block(theme.panel(title, false)),
        state,
    );
    turn_table(frame, turns, view, s, theme);
    detail_panel(frame, detail, view, s, theme);
    if let Some(i) = view.picker {
        let title = "action (Enter takes it, Esc closes)";
        list(frame, body, Some(i), &s.env().actions(), title, theme);
    }
    if let Some(input) = view.input.as_ref().filter(|i| !i.choices.is_empty()) {
        let title = "checkpoints in the store (↑ ↓ pick, Enter loads)";
        list(frame, body, input.choice, &input.choices, title, theme);
    }
}

fn message_line<'a>(view: &DebugView, spinner: &str, theme: &Theme) -> Line<'a> {
    if let Some(input) = &view.input {
        return Line::from(vec![
            Span::styled(format!("{}: ", input.kind.prompt()), theme.title),
            Span::raw(one_line(&input.text, LINE_CHARS)),
            Span::styled("▏", theme.muted),
            Span::styled("  Enter · Esc cancels", theme.muted),
        ]);
    }
    if let Some((work, _)) = view.busy {
        let what = match work {
            Work::LoadingModel => "loading the model",
            Work::Drawing { to_end: false } => "the model is writing its turn",
            Work::Drawing { to_end: true } => "the model is playing to the end",
            Work::Resampling => "drawing the turn again and again",
            Work::Saving => "saving",
            Work::Opening => "opening the stored episode",
            Work::Stepping => "the environment's program is stepping",
            Work::Starting => "starting the environment",
        };
        let esc = match work {
            Work::Drawing { .. } | Work::Resampling => "Esc cancels",
            Work::Stepping | Work::Saving => "this cannot be stopped half way",
            Work::LoadingModel | Work::Opening | Work::Starting => "Esc drops it",
        };
        return Line::styled(format!("{spinner} {what}… ({esc})"), theme.muted);
    }
    if let Some(e) = &view.error {
        return Line::styled(one_line(e, 2 * LINE_CHARS), theme.bad);
    }
    if let Some(n) = &view.notice {
        return Line::styled(one_line(n, LINE_CHARS), theme.good);
    }
    // Each key and its word held together (no-break spaces): a narrow footer wraps between
    // items, never inside one (`x` on one line, `export` on the next).
    let items = [
        "←↓→↑ act",
        "a pick",
        "i type",
        "p policy",
        "s step",
        "e to the end",
        "u undo",
        "f fork",
        "d resample",
        "n/N new/restart",
        "m model",
        "t sampling",
        "c env",
        "w save",
        "x export",
    ];
    let text: Vec<String> = items.iter().map(|i| i.replace(' ', "\u{a0}")).collect();
    Line::styled(text.join(" · "), theme.muted)
}

fn action_cell(t: &DebugTurn) -> String {
    match (t.parsed_action(), t.valid()) {
        (Some(a), true) => one_line(a, 30),
        (Some(a), false) => format!("✗ {}", one_line(a, 28)),
        (None, _) => "✗ (no action)".into(),
    }
}

fn turn_table(frame: &mut Frame, area: Rect, view: &DebugView, s: &Session, theme: &Theme) {
    let mut rows: Vec<Row> = s
        .turns
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let forked = s.forked_at == Some(i);
            Row::new(vec![
                Cell::from(format!("{:>3}{}", i + 1, if forked { "⑂" } else { " " })),
                Cell::from(t.actor.as_str()),
                Cell::from(action_cell(t)),
                Cell::from(format!("{:>6.2}", t.step.reward + 0.0)),
                Cell::from(if t.step.done { "done" } else { "" }),
            ])
            .style(if t.valid() { theme.text } else { theme.bad })
        })
        .collect();
    rows.push(Row::new(vec![
        Cell::from("now"),
        Cell::from(""),
        Cell::from(if s.done() { "(over)" } else { "" }),
        Cell::from(""),
        Cell::from(""),
    ]));
    let table = Table::new(
        rows,
        [
            Constraint::Length(5),
            Constraint::Length(7),
            Constraint::Fill(1),
            Constraint::Length(7),
            Constraint::Length(4),
        ],
    )
    .header(Row::new(["turn", "by", "action", "reward", ""]).style(theme.header))
    .row_highlight_style(theme.selected)
    .block(theme.panel("turns (j k select)".into(), false));
    let mut state = TableState::default().with_selected(Some(view.selected));
    frame.render_stateful_widget(table, area, &mut state);
}

fn detail_panel(frame: &mut Frame, area: Rect, view: &DebugView, s: &Session, theme: &Theme) {
    let tabs = [
        (Pane::Prompt, "prompt"),
        (Pane::Output, "output"),
        (Pane::Info, "info"),
        (Pane::Samples, "samples"),
    ];
    let title = tabs
        .iter()
        .map(|(p, name)| match *p == view.pane {
            true => format!("[{name}]"),
            false => name.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ");
    let turn = s.turns.get(view.selected);
    let lines = match view.pane {
        Pane::Prompt => prompt_lines(view, turn),
        Pane::Output => output_lines(view, turn, s, theme),
        Pane::Info => info_lines(turn, s, theme),
        Pane::Samples => sample_lines(view, theme),
    };
    // Long text scrolls: the end shows first (the newest turn of a prompt), PgUp goes back.
    let inner = area.height.saturating_sub(2);
    let bottom = (lines.len() as u16).saturating_sub(inner);
    let top = match view.pane {
        Pane::Prompt => bottom.saturating_sub(view.scroll),
        _ => view.scroll.min(bottom),
    };
    frame.render_widget(
        Paragraph::new(lines)
            .scroll((top, 0))
            .block(theme.panel(format!("{title} (Tab)"), true)),
        area,
    );
}

fn text_lines<'a>(text: &str) -> Vec<Line<'a>> {
    text.split('\n')
        .map(|l| Line::raw(one_line(l, LINE_CHARS)))
        .collect()
}

fn prompt_lines<'a>(view: &DebugView, turn: Option<&DebugTurn>) -> Vec<Line<'a>> {
    match turn {
        Some(t) => match &t.model {
            Some(m) => {
                let mut lines = vec![Line::raw(format!(
                    "the prompt of turn {} ({} tokens):",
                    1 + view.selected,
                    m.prompt_tokens
                ))];
                lines.extend(text_lines(&m.prompt_text));
                lines
            }
            None => vec![Line::raw(format!(
                "turn {} was played by {}: no model prompt",
                1 + view.selected,
                t.actor.as_str()
            ))],
        },
        None => match &view.next_prompt {
            Some(Ok(p)) => {
                let mut lines = vec![Line::raw(format!(
                    "the next turn's prompt ({} tokens; up to {} new):",
                    p.ids.len(),
                    p.max_new_tokens
                ))];
                lines.extend(text_lines(&p.text));
                lines
            }
            Some(Err(e)) => vec![Line::raw(format!("no prompt: {}", one_line(e, LINE_CHARS)))],
            None => vec![Line::raw(
                "the prompt a model reads shows here once one is chosen (m)",
            )],
        },
    }
}

fn output_lines<'a>(
    view: &DebugView,
    turn: Option<&DebugTurn>,
    s: &Session,
    theme: &Theme,
) -> Vec<Line<'a>> {
    let Some(t) = turn else {
        // An episode that is over takes no action: `u` undoes its last turn, `N` starts anew.
        if s.done() {
            return vec![Line::styled(
                "the episode is over: no action is taken now (u undo · N new episode)",
                theme.muted,
            )];
        }
        return vec![Line::raw(format!(
            "valid actions now: {}",
            one_line(&s.env().actions().join(", "), LINE_CHARS)
        ))];
    };
    let mut lines = vec![Line::styled("raw output:", theme.header)];
    lines.extend(text_lines(&t.output));
    lines.push(match (t.parsed_action(), t.valid()) {
        (Some(a), true) => Line::styled(format!("parsed action: {}", one_line(a, 80)), theme.good),
        _ => Line::styled(
            format!(
                "no valid action: {} · reward {:.2}",
                one_line(t.invalid_reason().unwrap_or("not an action"), LINE_CHARS),
                t.step.reward
            ),
            theme.bad,
        ),
    });
    let Some(m) = &t.model else {
        return lines;
    };
    let total: f32 = m.tokens.iter().map(|k| k.logprob).sum();
    lines.push(Line::styled(
        format!(
            "{} tokens · log-prob {total:.3} · ended by {} ([ ] select a token; red: p < {UNLIKELY})",
            m.tokens.len(),
            m.finish.as_str()
        ),
        theme.header,
    ));
    let selected = view.token.min(m.tokens.len().saturating_sub(1));
    let strip: Vec<Span> = m
        .tokens
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let mut style = match k.logprob.exp() < UNLIKELY {
                true => theme.bad,
                false => theme.text,
            };
            if i == selected {
                style = style.add_modifier(Modifier::REVERSED);
            }
            Span::styled(one_line(&k.text, 20), style)
        })
        .collect();
    lines.push(Line::from(strip));
    if let Some(k) = m.tokens.get(selected) {
        lines.push(Line::raw(format!(
            "token {} {:?}: log-prob {:.4} (p {:.3}) · entropy {:.3} nats",
            selected + 1,
            one_line(&k.text, 20),
            k.logprob,
            k.logprob.exp(),
            k.entropy
        )));
        for (text, p) in &k.alternatives {
            let bar = "█".repeat((p * 30.0).round() as usize);
            lines.push(Line::raw(format!(
                "  {:<12} {p:>6.3} {bar}",
                format!("{:?}", one_line(text, 10))
            )));
        }
    }
    lines
}

fn info_lines<'a>(turn: Option<&DebugTurn>, s: &Session, theme: &Theme) -> Vec<Line<'a>> {
    let mut lines = vec![];
    if let Some(d) = &s.divergence {
        lines.push(Line::styled(
            format!(
                "the stored episode diverges at turn {}: the env, replayed from seed {} with the \
                 stored outputs, shows another observation",
                d.turn + 1,
                s.seed
            ),
            theme.bad,
        ));
        lines.push(Line::styled("stored:", theme.header));
        lines.extend(text_lines(&d.recorded));
        lines.push(Line::styled("replayed:", theme.header));
        lines.extend(text_lines(&d.replayed));
        lines.push(Line::raw(""));
    }
    let (reward, done, info) = match turn {
        Some(t) => (t.step.reward, t.step.done, t.step.info.clone()),
        None => (0.0, s.done(), s.env().info()),
    };
    if turn.is_some() {
        lines.push(Line::raw(format!("reward {reward:.3} · done {done}")));
    } else {
        lines.push(Line::raw("the state now:"));
    }
    let pretty = serde_json::to_string_pretty(&info).unwrap_or_default();
    lines.extend(text_lines(&pretty));
    lines
}

fn sample_lines<'a>(view: &DebugView, theme: &Theme) -> Vec<Line<'a>> {
    let Some((turn, r)) = &view.resample else {
        return vec![Line::raw(format!(
            "d draws the current turn {} times from the model and shows which actions come out",
            view.draws
        ))];
    };
    let mut lines = vec![Line::styled(
        format!(
            "{} draws of turn {} · mean log-prob of a draw {:.3}",
            r.draws,
            turn + 1,
            r.mean_logprob
        ),
        theme.header,
    )];
    for c in &r.counts {
        let label = match (&c.action, c.unknown) {
            (Some(a), false) => one_line(a, 24),
            (Some(a), true) => format!("{} (not an action)", one_line(a, 16)),
            (None, _) => "no action found".into(),
        };
        let share = c.count as f64 / r.draws.max(1) as f64;
        let bar = "█".repeat((share * 40.0).round() as usize);
        let style = match (&c.action, c.unknown) {
            (Some(_), false) => theme.text,
            _ => theme.bad,
        };
        lines.push(Line::styled(
            format!("{label:<26} {:>4} {:>5.1}% {bar}", c.count, 100.0 * share),
            style,
        ));
    }
    lines
}

/// A list over the view: `items`, `selected` highlighted.
fn list(
    frame: &mut Frame,
    area: Rect,
    selected: Option<usize>,
    items: &[String],
    title: &str,
    theme: &Theme,
) {
    let height = u16::try_from(items.len().saturating_add(2))
        .unwrap_or(u16::MAX)
        .min(area.height);
    let width = items
        .iter()
        .map(|a| a.chars().count())
        .chain([title.chars().count()])
        .max()
        .unwrap_or(0)
        .clamp(20, 60) as u16
        + 4;
    let [row] = Layout::vertical([Constraint::Length(height)])
        .flex(Flex::Center)
        .areas(area);
    let [popup] = Layout::horizontal([Constraint::Length(width)])
        .flex(Flex::Center)
        .areas(row);
    let rows = items.iter().map(|a| Row::new(vec![one_line(a, 60)]));
    let table = Table::new(rows, [Constraint::Fill(1)])
        .row_highlight_style(theme.selected)
        .block(
            Block::default()
                .borders(Borders::ALL)
                .border_style(theme.focus_border)
                .title(title.to_string()),
        );
    frame.render_widget(Clear, popup);
    let mut state = TableState::default().with_selected(selected);
    frame.render_stateful_widget(table, popup, &mut state);
}
