//! The Samples view's token table (`T`): each trained token of the selected sample with the
//! log-prob the student sampled it with and each teacher's (on-policy distillation), and with one
//! teacher their difference, the k1 estimate of the per-token KL that the run learned from.

use ratatui::text::Line;

use crate::metrics::TokenTrace;
use crate::tui::samples::render::one_line;
use crate::tui::theme::Theme;

/// Characters of a token's text shown.
const PIECE: usize = 10;
/// Characters of a column (a teacher's name in the header is cut to it).
const NAME: usize = 7;

fn logp(x: Option<f32>) -> String {
    x.map_or("-".into(), |x| format!("{x:.3}"))
}

/// The table's header and one line per token; without a trace, what records one.
pub fn token_lines(
    trace: Option<&TokenTrace>,
    theme: &Theme,
) -> (Line<'static>, Vec<Line<'static>>) {
    let Some(t) = trace else {
        return (
            Line::styled(
                "No per-token log-probs here: RL stages with on-policy distillation (rl.opd) \
                 record them.",
                theme.muted,
            ),
            vec![],
        );
    };
    let names: Vec<&String> = t.teachers.keys().collect();
    let k1 = names.len() == 1;
    let mut head = format!("{:>4} {:<PIECE$} {:>NAME$}", "#", "token", "student");
    for name in &names {
        let short: String = name.chars().take(NAME).collect();
        head.push_str(&format!(" {short:>NAME$}"));
    }
    if k1 {
        head.push_str(&format!(" {:>NAME$}", "k1"));
    }
    let rows = t
        .pieces
        .iter()
        .enumerate()
        .map(|(i, piece)| {
            let student = t.student.get(i).copied().flatten();
            let mut line = format!(
                "{:>4} {:<PIECE$} {:>NAME$}",
                i + 1,
                one_line(piece, PIECE),
                logp(student)
            );
            for name in &names {
                line.push_str(&format!(" {:>NAME$}", logp(teacher_at(t, name, i))));
            }
            if let (true, Some(name)) = (k1, names.first()) {
                let diff = student.zip(teacher_at(t, name, i)).map(|(s, t)| s - t);
                line.push_str(&format!(" {:>NAME$}", logp(diff)));
            }
            Line::from(line)
        })
        .collect();
    (Line::styled(head, theme.muted), rows)
}

fn teacher_at(t: &TokenTrace, name: &str, i: usize) -> Option<f32> {
    t.teachers
        .get(name)
        .and_then(|v| v.get(i).copied().flatten())
}
