//! The devices pane of the Workers view: per device, the memory ledger (bytes each role holds on it,
//! rebuilt from the run's offload/reload events), a one-line timeline of which role held it, and
//! its last transitions. Pure functions of the events; drawing is at the bottom.
//!
//! The ledgers themselves are computed in the core (`health::ledger`), which the memory-creep
//! alarm reads too.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};

pub use crate::health::ledger::{DeviceLedger, Transition, ledgers};
use crate::tui::events::{clean, human_bytes, rel_time};
use crate::tui::theme::Theme;

/// The roles in the order the workbench lists them, with the letter the timeline draws.
const ROLES: [(&str, char); 6] = [
    ("actor_train", 'T'),
    ("actor_infer", 'I'),
    ("reference", 'R'),
    ("critic", 'C'),
    ("reward", 'W'),
    ("env", 'E'),
];

pub(crate) use crate::health::ledger::role_rank;

/// The timeline letter of a role.
pub fn role_letter(role: &str) -> char {
    ROLES
        .iter()
        .find(|(r, _)| *r == role)
        .map(|(_, c)| *c)
        .or_else(|| role.chars().find(|c| c.is_alphanumeric()))
        .map(|c| c.to_ascii_uppercase())
        .unwrap_or('?')
}

/// One character cell of a device's timeline.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TimelineCell {
    /// The role resident longest during the cell's time (the larger one when several were resident
    /// together), or `None` when nothing was.
    pub role: Option<String>,
    /// An offload or reload happened during the cell's time.
    pub transition: bool,
}

/// `width` cells covering `[from_ms, to_ms]` evenly.
pub fn timeline(
    ledger: &DeviceLedger,
    from_ms: i64,
    to_ms: i64,
    width: usize,
) -> Vec<TimelineCell> {
    let to_ms = to_ms.max(from_ms);
    let span = (to_ms - from_ms) as f64;
    let edge = |i: usize| from_ms + (span * i as f64 / width.max(1) as f64).round() as i64;
    let intervals = ledger.intervals();
    let mut cells = vec![TimelineCell::default(); width];
    for (i, cell) in cells.iter_mut().enumerate() {
        let (b0, b1) = (edge(i), edge(i + 1));
        let last = i + 1 == width;
        // Transitions and stays are in time order: find the first that can touch the cell.
        let next = ledger.transitions.partition_point(|t| t.at < b0);
        cell.transition = ledger
            .transitions
            .get(next)
            .is_some_and(|t| t.at < b1 || (last && t.at <= b1));
        // A cell of no length (a zero span) shows the state at its instant.
        let mut best: Option<(i64, u64, &str)> = None;
        for (role, spans) in &intervals {
            let mut held = 0;
            let mut bytes = 0;
            let first = spans.partition_point(|&(_, e, _)| e.is_some_and(|e| e <= b0));
            let touching = spans[first..]
                .iter()
                .take_while(|(s, _, _)| *s < b1 || (b0 == b1 && *s <= b0));
            for &(s, e, b) in touching {
                let e = e.unwrap_or(i64::MAX);
                let overlap = e.min(b1) - s.max(b0);
                let at_point = b0 == b1 && s <= b0 && b0 < e;
                if overlap > 0 || at_point {
                    held += overlap.max(1);
                    bytes = bytes.max(b);
                }
            }
            let key = (held, bytes, std::cmp::Reverse(role_rank(role)));
            let better =
                best.is_none_or(|(h, by, r)| key > (h, by, std::cmp::Reverse(role_rank(r))));
            if held > 0 && better {
                best = Some((held, bytes, role));
            }
        }
        cell.role = best.map(|(_, _, r)| r.to_string());
    }
    cells
}

/// The style of a role: its colour in the series palette.
pub(crate) fn role_style(role: &str, theme: &Theme) -> Style {
    Style::default().fg(theme.series_color(role_rank(role)))
}

/// What the devices pane draws.
pub struct DevicesPane<'a> {
    pub ledgers: &'a [DeviceLedger],
    pub selected: usize,
    pub focused: bool,
    pub from_ms: i64,
    pub to_ms: i64,
    pub start_ms: i64,
}

pub fn render(frame: &mut Frame, area: Rect, pane: &DevicesPane<'_>, theme: &Theme) {
    let title = format!(" Devices ({}) ", pane.ledgers.len());
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(if pane.focused {
            theme.focus_border
        } else {
            theme.border
        })
        .title(Span::styled(title, theme.title));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    if pane.ledgers.is_empty() {
        let text =
            "No offload/reload recorded: no roles share a device, or no phase has switched yet.";
        frame.render_widget(
            Paragraph::new(text)
                .style(theme.muted)
                .wrap(ratatui::widgets::Wrap { trim: true }),
            inner,
        );
        return;
    }
    let selected = pane.selected.min(pane.ledgers.len() - 1);
    let dev_w = pane
        .ledgers
        .iter()
        .map(|l| l.device.chars().count())
        .max()
        .unwrap_or(1)
        .clamp(3, 8);
    let prefix = 2 + dev_w + 1 + 9 + 1;
    let width = (inner.width as usize).saturating_sub(prefix).max(1);
    let mut lines = vec![Line::from(vec![
        Span::styled(
            format!("  {:<dev_w$} {:>9} ", "dev", "resident"),
            theme.header,
        ),
        Span::styled(
            axis(
                &rel_time(pane.from_ms - pane.start_ms),
                &rel_time(pane.to_ms - pane.start_ms),
                width,
            ),
            theme.muted,
        ),
    ])];
    for (i, l) in pane.ledgers.iter().enumerate() {
        let mark = if i == selected && pane.focused {
            "▶ "
        } else {
            "  "
        };
        let mut spans = vec![Span::raw(format!(
            "{mark}{:<dev_w$} {:>9} ",
            clean(&l.device, dev_w, false),
            human_bytes(l.total())
        ))];
        for cell in timeline(l, pane.from_ms, pane.to_ms, width) {
            let (text, mut style) = match &cell.role {
                Some(r) => (role_letter(r).to_string(), role_style(r, theme)),
                None => ("·".to_string(), theme.muted),
            };
            if cell.transition {
                style = style.add_modifier(Modifier::BOLD | Modifier::UNDERLINED);
            }
            spans.push(Span::styled(text, style));
        }
        lines.push(Line::from(spans));
    }
    let l = &pane.ledgers[selected];
    let mut legend = vec![Span::styled(
        format!("dev {}: ", clean(&l.device, 8, false)),
        theme.title,
    )];
    for (k, role) in l.roles().into_iter().enumerate() {
        if k > 0 {
            legend.push(Span::styled(" · ", theme.muted));
        }
        let bytes = l.resident.get(role).copied().unwrap_or(0);
        let held = if bytes > 0 {
            human_bytes(bytes)
        } else {
            "off".into()
        };
        legend.push(Span::styled(
            format!("{} {} {held}", role_letter(role), clean(role, 20, false)),
            role_style(role, theme),
        ));
    }
    lines.push(Line::from(legend));
    let room = (inner.height as usize).saturating_sub(lines.len() + 1);
    if room > 0 {
        lines.push(Line::from(Span::styled(
            format!(
                "last transitions on dev {} (underlined on the timeline):",
                clean(&l.device, 8, false)
            ),
            theme.muted,
        )));
        let skip = l.transitions.len().saturating_sub(room);
        for t in &l.transitions[skip..] {
            lines.push(Line::from(vec![
                Span::styled(
                    format!("{:>9} ", rel_time(t.at - pane.start_ms)),
                    theme.muted,
                ),
                Span::raw(format!(
                    "{:<7} ",
                    if t.reload { "reload" } else { "offload" }
                )),
                Span::styled(
                    format!("{:<12} ", clean(&t.role, 12, false)),
                    role_style(&t.role, theme),
                ),
                Span::raw(format!(
                    "{:>9} in {:.2} s → {} resident",
                    human_bytes(t.bytes),
                    t.seconds,
                    human_bytes(t.resident_after),
                )),
                Span::styled(
                    if t.devices.contains(',') {
                        format!(
                            " · {} over dev {}",
                            human_bytes(t.total_bytes),
                            clean(&t.devices, 16, false)
                        )
                    } else {
                        String::new()
                    },
                    theme.muted,
                ),
            ]));
        }
    }
    frame.render_widget(Paragraph::new(lines), inner);
}

/// `from` at the left, `to` at the right, a rule between, `width` characters in all.
fn axis(from: &str, to: &str, width: usize) -> String {
    let used = from.chars().count() + to.chars().count() + 2;
    if used > width {
        return from.chars().take(width).collect();
    }
    format!("{from} {} {to}", "─".repeat(width - used))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::reads::StoredEvent;
    use crate::store::records::EventKind;
    use crate::tui::events::tests::{ev, transfer};

    const MIB: u64 = 1 << 20;

    /// Two phase switches a cycle on device 0, as `TimeSharing::enter` records them: the first
    /// placements copy nothing and are not events.
    ///   t=1000 train:    offload I 300            (I was placed silently at the start)
    ///                    T 200 and R 150 placed silently
    ///   t=5000 generate: offload T, offload R, reload I 300
    ///   t=9000 train:    offload I, reload T 200, reload R 150
    ///   t=13000 generate: offload T, offload R, reload I 300
    pub(crate) fn cycles() -> Vec<StoredEvent> {
        vec![
            ev(0, EventKind::RunStarted, None, "run 'x' started"),
            transfer(1_000, false, "actor_infer", "0", 300 * MIB, "train"),
            transfer(5_000, false, "actor_train", "0", 200 * MIB, "generate"),
            transfer(5_000, false, "reference", "0", 150 * MIB, "generate"),
            transfer(5_000, true, "actor_infer", "0", 300 * MIB, "generate"),
            transfer(9_000, false, "actor_infer", "0", 300 * MIB, "train"),
            transfer(9_000, true, "actor_train", "0", 200 * MIB, "train"),
            transfer(9_000, true, "reference", "0", 150 * MIB, "train"),
            transfer(13_000, false, "actor_train", "0", 200 * MIB, "generate"),
            transfer(13_000, false, "reference", "0", 150 * MIB, "generate"),
            transfer(13_000, true, "actor_infer", "0", 300 * MIB, "generate"),
        ]
    }

    #[test]
    fn the_ledger_adds_reloads_and_removes_offloads() {
        let events = cycles();
        let all = ledgers(&events, 0, None);
        assert_eq!(all.len(), 1);
        let l = &all[0];
        assert_eq!(l.device, "0");
        // Now: only actor_infer is on the device.
        assert_eq!(l.total(), 300 * MIB);
        assert_eq!(l.roles(), ["actor_train", "actor_infer", "reference"]);
        assert_eq!(l.resident["actor_train"], 0);
        // Bytes on the device after each transition, by hand:
        //   offload I: 0 (the silent placements are not counted until their first reload)
        //   offload T: 0, offload R: 0, reload I: 300
        //   offload I: 0, reload T: 200, reload R: 200 + 150 = 350
        //   offload T: 150, offload R: 0, reload I: 300
        let after: Vec<u64> = l
            .transitions
            .iter()
            .map(|t| t.resident_after / MIB)
            .collect();
        assert_eq!(after, [0, 0, 0, 300, 0, 200, 350, 150, 0, 300]);
        // Roles first seen offloading were resident since the batch before (or the start).
        assert_eq!(
            l.initial,
            [
                ("actor_infer".to_string(), 0, 300 * MIB),
                ("actor_train".to_string(), 1_000, 200 * MIB),
                ("reference".to_string(), 1_000, 150 * MIB),
            ]
        );
        // As of t=10000 (replay): the train phase's roles.
        let then = ledgers(&events, 0, Some(10_000));
        assert_eq!(then[0].total(), 350 * MIB);
        assert_eq!(then[0].resident["actor_infer"], 0);
    }

    #[test]
    fn a_transfer_over_several_devices_charges_each_a_share() {
        let events = [
            transfer(10, true, "actor_train", "1,0", 1001, "train"),
            transfer(20, true, "critic", "10", 7, "train"),
            transfer(30, true, "critic", "2", 5, "train"),
        ];
        let all = ledgers(&events, 0, None);
        let names: Vec<&str> = all.iter().map(|l| l.device.as_str()).collect();
        assert_eq!(names, ["0", "1", "2", "10"]); // numerically
        // 1001 bytes over devices "1,0": 501 to the first named, 500 to the second.
        assert_eq!(all[1].resident["actor_train"], 501);
        assert_eq!(all[0].resident["actor_train"], 500);
        assert_eq!(all[0].transitions[0].total_bytes, 1001);
        assert_eq!(all[0].transitions[0].devices, "1,0");
    }

    #[test]
    fn the_timeline_shows_who_held_the_device_and_marks_transitions() {
        let events = cycles();
        let l = &ledgers(&events, 0, None)[0];
        // 16 cells over [0, 16000]: one second each. I held [0,1000), [5000,9000), [13000,…);
        // T and R together held [1000,5000) and [9000,13000): T, the larger, is drawn.
        let cells = timeline(l, 0, 16_000, 16);
        let letters: String = cells
            .iter()
            .map(|c| c.role.as_deref().map_or('·', role_letter))
            .collect();
        assert_eq!(letters, "ITTTTIIIITTTTIII");
        let marked: Vec<usize> = (0..16).filter(|&i| cells[i].transition).collect();
        assert_eq!(marked, [1, 5, 9, 13]);
        // Before anything was known and with nothing recorded, the cells are empty.
        let late = ledgers(&events[6..], 0, None);
        let cells = timeline(&late[0], 0, 16_000, 4);
        assert_eq!(cells[0].role, None);
        assert_eq!(cells[3].role.as_deref(), Some("actor_infer"));
        // A zero-length span draws the state at that instant.
        let cells = timeline(l, 6_000, 6_000, 3);
        assert!(
            cells
                .iter()
                .all(|c| c.role.as_deref() == Some("actor_infer"))
        );
    }

    #[test]
    fn roles_have_letters() {
        assert_eq!(role_letter("actor_infer"), 'I');
        assert_eq!(role_letter("reward"), 'W');
        assert_eq!(role_letter("_judge"), 'J');
        assert_eq!(role_letter(""), '?');
        assert_eq!(axis("+0.0 s", "+16.0 s", 20), "+0.0 s ───── +16.0 s");
        assert_eq!(axis("+0.0 s", "+16.0 s", 4), "+0.0");
    }
}
