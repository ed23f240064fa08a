use ratatui::Terminal;
use ratatui::backend::TestBackend;

use super::*;
use crate::metrics::TurnRecord;
use crate::tui::episodes::render::render;
use crate::tui::theme::Theme;

fn turn(
    observation: &str,
    output: &str,
    parsed: Option<&str>,
    valid: bool,
    reward: f64,
) -> TurnRecord {
    let mut info = serde_json::Map::new();
    info.insert("action_is_valid".into(), valid.into());
    TurnRecord {
        observation: observation.into(),
        action_text: output.into(),
        parsed_action: parsed.map(str::to_string),
        reward,
        done: reward > 0.5,
        prompt_tokens: 4,
        response_tokens: 6,
        info,
        tokens: None,
    }
}

/// Step `step`: two groups of two episodes on a 2x3 lake; episode (g, 0) reaches the goal in two
/// moves, episode (g, 1) writes nothing valid three times.
fn episodes(step: usize) -> Vec<TrajectoryRecord> {
    let mut out = vec![];
    for group in [1, 0] {
        for episode in [1, 0] {
            let turns = match episode {
                0 => vec![
                    turn("PFF\nHFG", "Right", Some("Right"), true, 0.0),
                    turn("SPF\nHFG", "Down\u{1b}[31m", Some("Down"), true, 1.0),
                ],
                _ => vec![turn("PFF\nHFG", "hm", None, false, -0.1); 3],
            };
            out.push(TrajectoryRecord {
                stage: "rl".into(),
                step,
                env: "lake".into(),
                env_seed: 100 + group as u64,
                policy_version: step - 1,
                success: episode == 0,
                group,
                episode,
                end_reason: if episode == 0 {
                    "done".into()
                } else {
                    "max_turns".into()
                },
                turns,
            });
        }
    }
    out
}

fn loaded() -> EpisodesView {
    let mut v = EpisodesView::new(RunId(1));
    assert_eq!(
        v.set_steps(vec![(4, false), (2, false), (6, false)]),
        Some(6),
        "the newest step is shown first"
    );
    v.set_episodes(6, episodes(6));
    v
}

#[test]
fn steps_walk_and_the_selection_stays_on_the_same_episode() {
    let mut v = loaded();
    // Sorted by (group, episode).
    let order: Vec<(usize, usize)> = v.episodes().iter().map(|e| (e.group, e.episode)).collect();
    assert_eq!(order, [(0, 0), (0, 1), (1, 0), (1, 1)]);
    v.act(Action::Down);
    v.act(Action::Down);
    assert_eq!(
        v.selected_episode().map(|e| (e.group, e.episode)),
        Some((1, 0))
    );
    // Into the turns: down walks them and stops at the last.
    v.act(Action::NextPane);
    for _ in 0..5 {
        v.act(Action::Down);
    }
    assert_eq!(v.turn, 1);
    // h: the step before; its answer keeps group 1 episode 0 selected.
    assert_eq!(v.act(Action::Left), Some(4));
    assert!(
        v.episodes.is_none(),
        "step 4 is loading, not step 6 under its number"
    );
    assert!(screen(&v, 80, 4).contains("loading the episodes of step 4"));
    v.set_episodes(4, episodes(4));
    assert_eq!(
        v.selected_episode().map(|e| (e.group, e.episode, e.step)),
        Some((1, 0, 4))
    );
    assert_eq!(v.act(Action::Left), Some(2));
    assert_eq!(v.act(Action::Left), None, "no step before the first");
    // An answer for a step no longer shown is dropped; the asked one keeps the selection.
    v.set_episodes(4, vec![]);
    assert_eq!(v.step(), Some(2));
    assert!(v.episodes.is_none());
    v.set_episodes(2, episodes(2));
    assert_eq!(
        v.selected_episode().map(|e| (e.group, e.episode, e.step)),
        Some((1, 0, 2))
    );
}

#[test]
fn the_replay_cursor_shows_the_newest_step_at_or_before_it() {
    let mut v = EpisodesView::new(RunId(1));
    // Asked before the steps are known: remembered.
    assert_eq!(v.go_to(5), None);
    assert_eq!(
        v.set_steps(vec![(2, false), (4, false), (6, false)]),
        Some(4)
    );
    assert_eq!(v.go_to(4), None, "already shown");
    assert_eq!(v.go_to(100), Some(6));
    assert_eq!(v.go_to(1), Some(2), "before the first: the first");
    // Empty runs and empty steps never panic.
    let mut empty = EpisodesView::new(RunId(2));
    assert_eq!(empty.set_steps(vec![]), None);
    assert_eq!(empty.act(Action::Validation), None);
    for a in [
        Action::Down,
        Action::Left,
        Action::Right,
        Action::NextPane,
        Action::Bottom,
    ] {
        assert_eq!(empty.act(a), None);
    }
    assert!(empty.selected_episode().is_none());
}

fn screen(view: &EpisodesView, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    let theme = Theme::default();
    terminal
        .draw(|f| render(f, f.area(), view, "⠋", &theme))
        .unwrap();
    terminal.backend().to_string()
}

#[test]
fn renders_a_step_its_episodes_and_a_turn_with_its_grid() {
    let mut v = loaded();
    v.act(Action::NextPane);
    v.act(Action::Down);
    insta::assert_snapshot!("episodes_step_80x24", screen(&v, 80, 24));
    v.act(Action::NextPane);
    v.act(Action::Down);
    insta::assert_snapshot!("episodes_invalid_turns_100x20", screen(&v, 100, 20));
}

#[test]
fn renders_loading_and_a_run_without_episodes() {
    let mut v = EpisodesView::new(RunId(1));
    insta::assert_snapshot!("episodes_loading", screen(&v, 80, 3));
    v.set_steps(vec![]);
    insta::assert_snapshot!("episodes_none", screen(&v, 80, 3));
}

/// Evaluation episodes of `step`: three fixed seeds, the same at every evaluation.
fn evaluation(step: usize) -> Vec<TrajectoryRecord> {
    (0..3)
        .map(|i| TrajectoryRecord {
            env: "val/lake".into(),
            env_seed: 900 + i as u64,
            group: i,
            episode: 0,
            success: i == 1,
            ..episodes(step)[0].clone()
        })
        .collect()
}

#[test]
fn v_switches_to_evaluation_episodes_and_a_seed_is_followed_across_evaluations() {
    let mut v = EpisodesView::new(RunId(1));
    // Training episodes at steps 1..=4, evaluations before steps 1 and 3.
    let steps = vec![
        (1, false),
        (1, true),
        (2, false),
        (3, false),
        (3, true),
        (4, false),
    ];
    assert_eq!(v.set_steps(steps), Some(4));
    v.set_episodes(4, episodes(4));
    assert_eq!(v.episodes().len(), 4);
    // No evaluation at step 4: the newest one before it, step 3.
    assert_eq!(v.act(Action::Validation), Some(3));
    assert_eq!(v.steps(), [1, 3]);
    let mut both = episodes(3);
    both.extend(evaluation(3));
    v.set_episodes(3, both);
    assert!(v.episodes().iter().all(|e| e.env == "val/lake"));
    assert_eq!(v.episodes().len(), 3);
    // Follow seed 902 (group 2) back to the first evaluation.
    v.act(Action::Bottom);
    assert_eq!(v.selected_episode().map(|e| e.env_seed), Some(902));
    assert_eq!(v.act(Action::Left), Some(1));
    let mut both = episodes(1);
    both.extend(evaluation(1));
    v.set_episodes(1, both);
    assert_eq!(
        v.selected_episode().map(|e| (e.env_seed, e.step)),
        Some((902, 1))
    );
    insta::assert_snapshot!("episodes_evaluation_80x12", screen(&v, 80, 12));
    // Back to training at the same step: no reload, the step has both kinds.
    assert_eq!(v.act(Action::Validation), None);
    assert_eq!(v.step(), Some(1));
    assert!(v.episodes().iter().all(|e| e.env == "lake"));
    assert_eq!(v.steps(), [1, 2, 3, 4]);
}

/// `T` puts the selected turn's tokens, with the student's and the teacher's log-probs, where
/// its observation was; a turn without them says what records them.
#[test]
fn t_shows_the_selected_turns_tokens_in_place_of_its_observation() {
    let mut v = EpisodesView::new(RunId(1));
    v.set_steps(vec![(6, false)]);
    let mut step = episodes(6);
    let first = step
        .iter_mut()
        .find(|e| (e.group, e.episode) == (0, 0))
        .unwrap();
    first.turns[1].tokens = Some(crate::metrics::TokenTrace {
        pieces: vec!["Down".into(), "<eos>".into()],
        student: vec![Some(-0.5), Some(-1.25)],
        teachers: [("lake".to_string(), vec![Some(-0.25), Some(-2.0)])].into(),
    });
    v.set_episodes(6, step);
    v.act(Action::NextPane);
    v.act(Action::Down);
    v.act(Action::Tokens);
    let shown = screen(&v, 80, 24);
    assert!(shown.contains("tokens (T: back) of turn 2"), "{shown}");
    // k1 of "Down": −0.5 − (−0.25) = −0.250.
    assert!(
        shown.contains("   1 Down        -0.500  -0.250  -0.250"),
        "{shown}"
    );
    insta::assert_snapshot!("episodes_turn_tokens_80x24", shown);
    v.act(Action::Up);
    assert!(screen(&v, 80, 24).contains("No per-token log-probs here"));
    v.act(Action::Tokens);
    assert!(screen(&v, 80, 24).contains("PFF"), "the observation again");
}
