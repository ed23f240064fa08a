//! Drawing the Episodes view ([`crate::tui::episodes`]): a header with the step's success rate and
//! mean return, the episodes grouped by start seed, and the selected episode — the selected
//! turn's observation as the environment drew it (line by line, so grids stay grids) or, with
//! `T`, its tokens with the student's and the teachers' log-probs, then every turn's output,
//! parsed action and reward. Observations and outputs are model or program text:
//! each line goes through [`one_line`] first.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table, TableState, Wrap};

use crate::metrics::TrajectoryRecord;
use crate::tui::episodes::{EpisodesView, Pane};
use crate::tui::samples::render::one_line;
use crate::tui::theme::Theme;

/// The most characters of one drawn line.
const LINE_CHARS: usize = 300;

fn episode_return(e: &TrajectoryRecord) -> f64 {
    e.turns.iter().map(|t| t.reward).sum::<f64>() + 0.0
}

fn header<'a>(view: &EpisodesView, theme: &Theme) -> Line<'a> {
    let Some(step) = view.step() else {
        return Line::styled("Episodes", theme.title);
    };
    let at = view
        .steps()
        .iter()
        .position(|s| *s == step)
        .map_or(0, |i| i + 1);
    let kind = if view.validation {
        "evaluation"
    } else {
        "training"
    };
    let mut spans = vec![Span::styled(
        format!("{kind} step {step} ({at}/{})", view.steps().len()),
        theme.title,
    )];
    let episodes = view.episodes();
    if !episodes.is_empty() {
        let n = episodes.len() as f64;
        let success = episodes.iter().filter(|e| e.success).count() as f64 / n;
        let ret = episodes.iter().map(episode_return).sum::<f64>() / n;
        let env = &episodes[0].env;
        spans.push(Span::raw(format!(
            " · {env} · {} episodes · success {success:.2} · return {ret:.2}",
            episodes.len()
        )));
    }
    Line::from(spans)
}

pub fn render(frame: &mut Frame, area: Rect, view: &EpisodesView, spinner: &str, theme: &Theme) {
    let [head, body] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    frame.render_widget(Paragraph::new(header(view, theme)), head);
    let say = |frame: &mut Frame, text: String| {
        frame.render_widget(
            Paragraph::new(text)
                .style(theme.muted)
                .wrap(Wrap { trim: true }),
            body,
        );
    };
    if !view.loaded {
        return say(frame, format!("{spinner} loading episodes…"));
    }
    if view.steps().is_empty() {
        let text = match view.validation {
            true => {
                "No evaluation episodes in this run (rl.env.eval records them); v shows the \
                     training episodes."
            }
            false => {
                "This run has no agentic episodes: they appear once an rl step with an env \
                      is recorded."
            }
        };
        return say(frame, text.into());
    }
    if view.episodes.is_none() {
        let step = view
            .step()
            .map_or(String::new(), |s| format!(" of step {s}"));
        return say(frame, format!("{spinner} loading the episodes{step}…"));
    }
    if view.episodes().is_empty() {
        return say(frame, "No episodes at this step.".into());
    }
    let [left, right] =
        Layout::horizontal([Constraint::Length(34), Constraint::Min(20)]).areas(body);
    episode_table(frame, left, view, theme);
    if let Some(e) = view.selected_episode() {
        episode_detail(frame, right, view, e, theme);
    }
}

fn focused(view: &EpisodesView, pane: Pane, theme: &Theme) -> ratatui::style::Style {
    if view.pane == pane {
        theme.focus_border
    } else {
        theme.border
    }
}

fn episode_table(frame: &mut Frame, area: Rect, view: &EpisodesView, theme: &Theme) {
    let rows = view.episodes().iter().map(|e| {
        let mark = if e.success {
            Span::styled("✓", theme.good)
        } else {
            Span::styled("·", theme.muted)
        };
        Row::new(vec![
            Cell::from(format!("{}.{}", e.group, e.episode)),
            Cell::from(mark),
            Cell::from(format!("{:>6.2}", episode_return(e))),
            Cell::from(format!("{:>5}", e.turns.len())),
            // Why it ended, short: the environment finished it, or it was cut.
            Cell::from(match e.end_reason.as_str() {
                "max_turns" => "turns".to_string(),
                "token_budget" => "budget".to_string(),
                other => one_line(other, 8),
            }),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(6),
            Constraint::Length(2),
            Constraint::Length(7),
            Constraint::Length(5),
            Constraint::Min(4),
        ],
    )
    .header(Row::new(["grp.ep", "", "return", "turns", "end"]).style(theme.header))
    .row_highlight_style(theme.selected)
    .block(
        Block::default()
            .borders(Borders::ALL)
            .border_style(focused(view, Pane::Episodes, theme))
            .title("episodes"),
    );
    let mut state = TableState::default().with_selected(Some(view.selected));
    frame.render_stateful_widget(table, area, &mut state);
}

fn episode_detail(
    frame: &mut Frame,
    area: Rect,
    view: &EpisodesView,
    e: &TrajectoryRecord,
    theme: &Theme,
) {
    let turn = e.turns.get(view.turn);
    let token_table = view.tokens.then(|| {
        crate::tui::samples::tokens::token_lines(turn.and_then(|t| t.tokens.as_ref()), theme)
    });
    let obs_lines = match &token_table {
        Some((_, rows)) => rows.len() + 1,
        None => turn.map_or(0, |t| t.observation.lines().count()),
    } as u16;
    let [obs, turns] = Layout::vertical([
        Constraint::Length((obs_lines + 2).min(area.height / 2).max(3)),
        Constraint::Min(3),
    ])
    .areas(area);
    let title = format!(
        "{}turn {} of {} · group {} episode {} · seed {} · policy v{}",
        if view.tokens {
            "tokens (T: back) of "
        } else {
            ""
        },
        view.turn + 1,
        e.turns.len(),
        e.group,
        e.episode,
        e.env_seed,
        e.policy_version,
    );
    let observation: Vec<Line> = match token_table {
        Some((head, rows)) => std::iter::once(head).chain(rows).collect(),
        None => turn
            .map(|t| {
                t.observation
                    .lines()
                    .map(|l| Line::raw(one_line(l, LINE_CHARS)))
                    .collect()
            })
            .unwrap_or_default(),
    };
    frame.render_widget(
        Paragraph::new(observation).block(
            Block::default()
                .borders(Borders::ALL)
                .border_style(theme.border)
                .title(one_line(&title, LINE_CHARS)),
        ),
        obs,
    );
    let rows = e.turns.iter().enumerate().map(|(i, t)| {
        let parsed = match (&t.parsed_action, t.info.get("action_is_valid")) {
            (Some(a), Some(serde_json::Value::Bool(false))) => {
                format!("{} (invalid)", one_line(a, 40))
            }
            (Some(a), _) => one_line(a, 40),
            (None, _) => "(no action)".into(),
        };
        Row::new(vec![
            Cell::from(format!("{:>3}", i + 1)),
            Cell::from(one_line(&t.action_text, 60)),
            Cell::from(parsed),
            Cell::from(format!("{:>6.2}", t.reward)),
            Cell::from(if t.done { "done" } else { "" }),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(4),
            Constraint::Fill(1),
            Constraint::Fill(1),
            Constraint::Length(6),
            Constraint::Length(4),
        ],
    )
    .header(Row::new(["turn", "output", "action", "reward", ""]).style(theme.header))
    .row_highlight_style(theme.selected)
    .block(
        Block::default()
            .borders(Borders::ALL)
            .border_style(focused(view, Pane::Turns, theme))
            .title("turns (Tab: walk the turns)"),
    );
    let mut state = TableState::default().with_selected(Some(view.turn));
    frame.render_stateful_widget(table, turns, &mut state);
}
