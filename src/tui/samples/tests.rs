//! The Samples view's state and its screens (`TestBackend` snapshots).

use std::collections::BTreeMap;

use ratatui::Terminal;
use ratatui::backend::TestBackend;

use super::super::theme::Theme;
use super::*;
use crate::tui::samples::render::{one_line, wrap};

const ADD: &str = "What is 2+3?";
const REV: &str = "Reverse 'abc'.";

fn sample(step: usize, domain: &str, prompt: &str, response: &str, reward: f32) -> SampleRecord {
    SampleRecord {
        stage: DEFAULT_STAGE.into(),
        step,
        domain: domain.into(),
        prompt: prompt.into(),
        response: response.into(),
        ground_truth: if domain == "add" { "5" } else { "cba" }.into(),
        reward,
        correct: reward > 0.5,
        breakdown: BTreeMap::from([
            ("correct".to_string(), f64::from(reward)),
            ("format_ok".to_string(), 1.0),
        ]),
        advantage: reward - 0.5,
        prompt_tokens: 7,
        response_tokens: response.chars().count(),
        finish_reason: "stop".into(),
        policy_version: step.saturating_sub(1),
        tokens: None,
    }
}

/// Two groups of two: `add` learns something (rewards 1 and 0), `rev` does not (both 1).
fn step_samples(step: usize) -> Vec<SampleRecord> {
    vec![
        sample(step, "add", ADD, "2+3 = 5", 1.0),
        sample(step, "add", ADD, "It is 6.", 0.0),
        sample(step, "rev", REV, "cba", 1.0),
        sample(step, "rev", REV, "cba", 1.0),
    ]
}

/// A view of steps 1, 3 and 5 showing step 5.
fn view() -> SamplesView {
    let mut v = SamplesView::new(RunId(1));
    assert_eq!(v.set_steps(vec![5, 1, 3]), Some(SamplesRequest::Step(5)));
    v.set_step_samples(5, step_samples(5));
    v
}

/// Each kept group's domain with its responses.
fn kept(v: &SamplesView) -> Vec<(String, Vec<String>)> {
    let l = v.listing().expect("loaded");
    l.groups
        .iter()
        .map(|g| {
            let of = |i: &usize| l.samples[*i].clone();
            let domain = of(&g.members[0]).domain;
            (domain, g.members.iter().map(|i| of(i).response).collect())
        })
        .collect()
}

#[test]
fn w_narrows_to_wrong_answers_or_flat_groups_and_s_puts_the_worst_first() {
    let mut v = view();
    let both = |d: &str, r: &[&str]| (d.to_string(), r.iter().map(|s| s.to_string()).collect());
    assert_eq!(
        kept(&v),
        [
            both("add", &["2+3 = 5", "It is 6."]),
            both("rev", &["cba", "cba"])
        ]
    );
    // Worst mean reward first: add (0.5) before rev (1.0) — already so; flip the data's
    // order to see it move.
    let mut samples = step_samples(5);
    samples.rotate_left(2); // rev first
    v.set_step_samples(5, samples);
    assert_eq!(kept(&v)[0].0, "rev");
    v.act(Action::WorstFirst);
    assert_eq!(kept(&v)[0].0, "add");
    v.act(Action::WorstFirst);
    assert_eq!(kept(&v)[0].0, "rev");
    // Wrong only: the one wrong response, in its group (whose mean stays that of both).
    v.act(Action::Narrow);
    assert_eq!(kept(&v), [both("add", &["It is 6."])]);
    let l = v.listing().expect("loaded");
    assert_eq!(
        (l.groups[0].mean, l.groups[0].correct, l.groups[0].size),
        (0.5, 1, 2)
    );
    assert_eq!(
        l.selected_sample().map(|s| s.response.as_str()),
        Some("It is 6.")
    );
    // Flat groups only: rev's, whose rewards are all 1.
    v.act(Action::Narrow);
    assert_eq!(kept(&v), [both("rev", &["cba", "cba"])]);
    v.act(Action::Narrow);
    assert_eq!(kept(&v).len(), 2);
}

fn selected(v: &SamplesView) -> Option<(String, String)> {
    let s = v.listing()?.selected_sample()?;
    Some((s.prompt.clone(), s.response.clone()))
}

/// Every selection is a member of a kept group, or there is none and no group is kept.
fn assert_valid(v: &SamplesView) {
    if let Some(l) = v.listing() {
        match l.selected {
            Some(i) => assert!(l.groups.iter().any(|g| g.members.contains(&i))),
            None => assert!(l.groups.is_empty()),
        }
    }
}

#[test]
fn left_and_right_walk_the_sample_steps_and_stop_at_the_ends() {
    let mut v = view();
    assert_eq!(v.step(), Some(5));
    assert_eq!(v.act(Action::Right), None, "already the newest");
    assert_eq!(v.act(Action::Left), Some(SamplesRequest::Step(3)));
    assert!(v.listing().is_none(), "step 3 is loading");
    v.set_step_samples(3, step_samples(3));
    assert_eq!(v.act(Action::Left), Some(SamplesRequest::Step(1)));
    assert_eq!(v.act(Action::Left), None, "step 1 is the first");
    assert_eq!(v.step(), Some(1));
    assert_eq!(v.act(Action::Right), Some(SamplesRequest::Step(3)));
    // New steps arriving (a live run) do not move a view that shows one.
    assert_eq!(v.set_steps(vec![1, 3, 5, 7]), None);
    assert_eq!(v.step(), Some(3));
    assert_eq!(v.act(Action::Refresh), Some(SamplesRequest::Step(3)));
}

#[test]
fn go_to_shows_the_newest_sample_step_at_or_before_the_target() {
    let mut v = SamplesView::new(RunId(1));
    assert_eq!(v.step(), None);
    // Asked before the steps are known: the answer to set_steps loads it.
    assert_eq!(v.go_to(4), None);
    assert_eq!(v.set_steps(vec![1, 3, 5]), Some(SamplesRequest::Step(3)));
    assert_eq!(v.go_to(3), None, "already shown");
    assert_eq!(v.go_to(100), Some(SamplesRequest::Step(5)));
    assert_eq!(v.go_to(5), None);
    assert_eq!(v.go_to(2), Some(SamplesRequest::Step(1)));
    // Before the first sample step there is nothing older: the first is shown.
    assert_eq!(v.go_to(0), None);
    assert_eq!(v.step(), Some(1));
}

#[test]
fn answers_for_steps_or_prompts_no_longer_wanted_are_ignored() {
    let mut v = view();
    assert_eq!(v.act(Action::Left), Some(SamplesRequest::Step(3)));
    v.set_step_samples(5, step_samples(5)); // late answer for the step left
    assert!(v.listing().is_none());
    v.set_prompt_samples(ADD, step_samples(1)); // nothing is followed
    assert!(v.following().is_none());
    v.set_step_samples(3, step_samples(3));
    assert_eq!(v.listing().map(|l| l.groups.len()), Some(2));
    assert_eq!(
        v.act(Action::Follow),
        Some(SamplesRequest::Prompt(ADD.into()))
    );
    v.set_prompt_samples(REV, step_samples(1));
    assert!(v.listing().is_none(), "REV is not the prompt followed");
}

#[test]
fn follow_shows_the_prompt_across_steps_and_comes_back_to_the_step() {
    let mut v = view();
    v.act(Action::Down);
    v.act(Action::Down); // the first `rev` response, across the group boundary
    assert_eq!(selected(&v), Some((REV.into(), "cba".into())));
    assert_eq!(
        v.act(Action::Follow),
        Some(SamplesRequest::Prompt(REV.into()))
    );
    assert_eq!(v.following(), Some(REV));
    // Recorded order is by step already; shuffled here to check the grouping sorts.
    let mut all: Vec<SampleRecord> = [5, 1, 3]
        .iter()
        .flat_map(|&s| step_samples(s).into_iter().skip(2))
        .collect();
    all[0].reward = f32::NAN;
    v.set_prompt_samples(REV, all);
    let l = v.listing().unwrap();
    let steps: Vec<u64> = l.groups.iter().map(|g| g.step).collect();
    assert_eq!(steps, [1, 3, 5]);
    assert_eq!(l.step_count(), 3);
    // Step 5 has one unscored response: its mean is the scored one's, and it is not flat.
    assert_eq!((l.groups[2].mean, l.groups[2].flat), (1.0, false));
    assert!(l.groups[0].flat);
    assert_eq!(
        l.selected_sample().map(|s| s.step),
        Some(5),
        "the shown step"
    );
    v.act(Action::Top);
    assert_eq!(
        v.listing().unwrap().selected_sample().map(|s| s.step),
        Some(1)
    );
    // f again: the step view, with its selection where it was.
    assert_eq!(v.act(Action::Follow), None);
    assert_eq!(v.following(), None);
    assert_eq!(selected(&v), Some((REV.into(), "cba".into())));
    // Left (or Right) also leaves following, without moving the step.
    v.act(Action::Follow);
    assert_eq!(v.act(Action::Left), None);
    assert_eq!((v.following(), v.step()), (None, Some(5)));
}

#[test]
fn search_and_domain_filters_keep_the_selection_in_range() {
    let mut v = view();
    v.act(Action::Bottom);
    assert_eq!(selected(&v), Some((REV.into(), "cba".into())));
    v.set_filter("IT IS".into()); // a response of the `add` group, any case
    assert_eq!(v.listing().unwrap().groups.len(), 1);
    assert_eq!(selected(&v), Some((ADD.into(), "2+3 = 5".into())));
    assert_valid(&v);
    v.set_filter("nothing like this".into());
    assert_eq!(v.listing().unwrap().selected, None);
    for a in [
        Action::Down,
        Action::Up,
        Action::PageDown,
        Action::Bottom,
        Action::Open,
    ] {
        v.act(a);
        assert_valid(&v);
    }
    assert_eq!(v.act(Action::Follow), None, "nothing selected to follow");
    v.set_filter("cba".into()); // a ground truth
    assert_eq!(selected(&v), Some((REV.into(), "cba".into())));
    v.set_filter(String::new());
    // all → add → rev → all, and back.
    let mut seen = vec![];
    for _ in 0..3 {
        v.act(Action::NextPane);
        seen.push(v.domain().map(String::from));
        assert_valid(&v);
    }
    assert_eq!(seen, [Some("add".into()), Some("rev".into()), None]);
    v.act(Action::PrevPane);
    assert_eq!(v.domain(), Some("rev"));
    assert_eq!(v.listing().unwrap().groups.len(), 1);
    assert_eq!(selected(&v).map(|s| s.0), Some(REV.into()));
    // The domain stays on the next step, whose groups are filtered too.
    assert_eq!(v.act(Action::Left), Some(SamplesRequest::Step(3)));
    v.set_step_samples(3, step_samples(3));
    assert_eq!(selected(&v).map(|s| s.0), Some(REV.into()));
}

#[test]
fn empty_runs_and_empty_steps_never_panic() {
    let mut v = SamplesView::new(RunId(1));
    assert_eq!(v.set_steps(vec![]), None);
    assert!(v.loaded);
    for a in [
        Action::Left,
        Action::Right,
        Action::Follow,
        Action::NextPane,
        Action::Down,
        Action::Bottom,
        Action::Open,
        Action::PageDown,
        Action::Refresh,
    ] {
        assert_eq!(v.act(a), None);
    }
    assert_eq!(v.set_steps(vec![2]), Some(SamplesRequest::Step(2)));
    v.set_step_samples(2, vec![]);
    v.act(Action::Down);
    v.act(Action::NextPane);
    assert_eq!(v.listing().map(|l| l.selected), Some(None));
    // Samples of another stage are not shown.
    let mut sft = step_samples(2);
    sft.iter_mut().for_each(|s| s.stage = "sft".into());
    v.act(Action::Refresh);
    v.set_step_samples(2, sft);
    assert!(v.listing().unwrap().samples.is_empty());
}

#[test]
fn a_whole_response_scrolls_a_page_at_a_time_within_its_length() {
    let mut v = view();
    v.act(Action::Open);
    assert!(v.whole);
    v.act(Action::PageDown);
    assert_eq!(v.scroll, 0, "one line: nothing to scroll");
    let long = "word ".repeat(400); // 2000 columns: 40 lines at 50
    v.set_step_samples(5, vec![sample(5, "add", ADD, &long, 1.0)]);
    for _ in 0..10 {
        v.act(Action::PageDown);
    }
    assert_eq!(v.scroll, 39);
    v.act(Action::PageUp);
    assert_eq!(v.scroll, 29);
    v.act(Action::Down);
    assert_eq!(v.scroll, 0, "a new selection starts at its top");
}

#[test]
fn model_text_is_made_safe_to_draw() {
    assert_eq!(one_line("a\nb\tc\u{1b}[31m\u{202e}x", 100), "a↵b c�[31m�x");
    assert_eq!(one_line("日本語です", 2), "日本…");
    assert_eq!(wrap("hello world foo", 11), ["hello ", "world foo"]);
    assert_eq!(wrap("abcdefgh", 3), ["abc", "def", "gh"]);
    // Wide characters take two columns: one per line at width 3.
    assert_eq!(wrap("日本語", 3), ["日", "本", "語"]);
    assert_eq!(wrap("a\r\n\tb\n", 10), ["a", "    b", ""]);
    assert_eq!(wrap("", 10), [""]);
}

fn screen(view: &SamplesView, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    let theme = Theme::default();
    terminal
        .draw(|f| render(f, f.area(), view, "⠋", &theme))
        .unwrap();
    terminal.backend().to_string()
}

/// Step 5 of a run with four groups, one of them scored NaN, one answer long and messy.
fn busy_view() -> SamplesView {
    let mut v = SamplesView::new(RunId(1));
    v.set_steps(vec![1, 3, 5]);
    let mut samples = step_samples(5);
    let messy = "Let me think.\n\tFirst, 2+3:\r\n\u{1b}[31m5\u{1b}[0m — 日本語の答え 🙂 \u{7}\n\n\
        So the answer is 20, because ten plus ten is twenty, and twenty is what we wanted; a \
        line this long wraps at the edge of the detail area without splitting any word.\n\u{202e}done";
    samples.push(sample(
        5,
        "add",
        "What is 10+10?\nAnswer briefly.",
        messy,
        1.0,
    ));
    samples.push(sample(
        5,
        "add",
        "What is 10+10?\nAnswer briefly.",
        &"20 ".repeat(60),
        0.0,
    ));
    let mut unscored = sample(5, "count", "Count the r's in 'strawberry'.", "3", f32::NAN);
    unscored.advantage = f32::NAN;
    unscored.finish_reason = "length".into();
    samples.push(unscored);
    v.set_step_samples(5, samples);
    v
}

#[test]
fn renders_a_step_at_80x24_and_wider() {
    let mut v = busy_view();
    v.act(Action::Down);
    insta::assert_snapshot!("samples_step_80x24", screen(&v, 80, 24));
    v.act(Action::Down);
    v.act(Action::Down);
    insta::assert_snapshot!("samples_step_140x32", screen(&v, 140, 32));
}

#[test]
fn renders_a_messy_response_whole_and_filters_in_the_header() {
    let mut v = busy_view();
    for _ in 0..4 {
        v.act(Action::Down);
    }
    v.act(Action::Open);
    insta::assert_snapshot!("samples_whole_80x24", screen(&v, 80, 24));
    v.act(Action::Open);
    v.set_filter("日本".into());
    v.act(Action::NextPane);
    insta::assert_snapshot!("samples_filtered_80x24", screen(&v, 80, 24));
}

#[test]
fn renders_a_prompt_followed_across_steps() {
    let mut v = view();
    v.act(Action::Follow);
    insta::assert_snapshot!("samples_follow_loading", screen(&v, 80, 4));
    let all: Vec<SampleRecord> = (1..=12)
        .flat_map(|s| {
            let right = s.min(4);
            (0..4).map(move |i| {
                let ok = i < right;
                let text = if ok { "2+3 = 5" } else { "It is 6." };
                sample(s, "add", ADD, text, if ok { 1.0 } else { 0.0 })
            })
        })
        .collect();
    v.set_prompt_samples(ADD, all);
    insta::assert_snapshot!("samples_follow_80x24", screen(&v, 80, 24));
}

#[test]
fn renders_loading_and_a_run_without_samples() {
    let mut v = SamplesView::new(RunId(1));
    insta::assert_snapshot!("samples_loading", screen(&v, 80, 3));
    v.set_steps(vec![]);
    insta::assert_snapshot!("samples_none", screen(&v, 80, 3));
}

/// A DPO pair's two records as the stage writes them (`pipeline/dpo/samples.rs`): chosen
/// then rejected, each with its implicit reward, both correct when the pair ranks right.
fn pair(
    domain: &str,
    prompt: &str,
    chosen: (&str, f32),
    rejected: (&str, f32),
) -> [SampleRecord; 2] {
    let margin = f64::from(chosen.1 - rejected.1);
    [("chosen", chosen), ("rejected", rejected)].map(|(side, (text, reward))| SampleRecord {
        stage: "dpo".into(),
        step: 2,
        domain: domain.into(),
        prompt: prompt.into(),
        response: text.into(),
        ground_truth: String::new(),
        reward,
        correct: margin > 0.0,
        breakdown: BTreeMap::from([
            ("logp".to_string(), -2.5),
            ("ref_logp".to_string(), -2.5 - f64::from(reward) / 0.1),
            ("margin".to_string(), margin),
        ]),
        advantage: f32::NAN,
        prompt_tokens: 4,
        response_tokens: text.chars().count(),
        finish_reason: side.into(),
        policy_version: 1,
        tokens: None,
    })
}

#[test]
fn a_dpo_run_shows_its_pairs_and_reads_its_own_stage() {
    let mut v = SamplesView::new(RunId(3));
    let request = v.set_stage_steps(SampleSteps {
        stage: Some("dpo".into()),
        steps: vec![1, 2],
    });
    assert_eq!(request, Some(SamplesRequest::Step(2)));
    assert_eq!(
        v.effect(SamplesRequest::Step(2)),
        Effect::LoadSamples {
            run: RunId(3),
            stage: "dpo".into(),
            step: 2
        }
    );
    // An rl record in the answer (another stage's step 2) is not the view's.
    let mut samples: Vec<SampleRecord> = vec![sample(2, "add", ADD, "2+3 = 5", 1.0)];
    samples.extend(pair("add", "4+4=", ("8", 0.42), ("0", -0.31)));
    samples.extend(pair("rev", "abc>", ("cba", -0.05), ("abc", 0.12)));
    v.set_step_samples(2, samples);
    let both = |d: &str, r: &[&str]| (d.to_string(), r.iter().map(|s| s.to_string()).collect());
    assert_eq!(
        kept(&v),
        [both("add", &["8", "0"]), both("rev", &["cba", "abc"])]
    );
    // The pairs the policy still ranks wrong.
    v.act(Action::Narrow);
    assert_eq!(kept(&v), [both("rev", &["cba", "abc"])]);
    v.act(Action::Narrow);
    v.act(Action::Narrow);
    insta::assert_snapshot!("samples_dpo_80x24", screen(&v, 80, 24));
    // Following a prompt reads the same stage.
    let follow = v.act(Action::Follow).expect("a prompt to follow");
    assert!(matches!(v.effect(follow), Effect::LoadPrompt { stage, .. } if stage == "dpo"));
    // The run goes on to an rl stage: the view starts afresh on it.
    let request = v.set_stage_steps(SampleSteps {
        stage: Some("rl".into()),
        steps: vec![1],
    });
    assert_eq!(request, Some(SamplesRequest::Step(1)));
    assert!(v.listing().is_none() && v.following().is_none());
    assert_eq!(v.stage(), "rl");
}

/// An on-policy distillation sample: four trained tokens, the student's log-probs and one
/// teacher's (it did not score the last token: `None`).
fn traced() -> SampleRecord {
    let mut s = sample(5, "add", ADD, "5\n", 1.0);
    s.tokens = Some(crate::metrics::TokenTrace {
        pieces: vec!["5".into(), "\n".into(), "<|im_end|>".into(), "x".into()],
        student: vec![Some(-0.25), Some(-1.5), None, Some(-0.125)],
        teachers: BTreeMap::from([(
            "math".to_string(),
            vec![Some(-0.5), Some(-0.75), Some(-2.0), None],
        )]),
    });
    s
}

#[test]
fn t_shows_the_tokens_with_the_students_and_the_teachers_log_probs() {
    let mut v = view();
    v.set_step_samples(5, vec![traced(), sample(5, "add", ADD, "It is 6.", 0.0)]);
    v.act(Action::Tokens);
    assert!(v.showing_tokens() && v.showing_whole());
    // k1 = student − teacher: −0.25 − (−0.5) = 0.250, −1.5 − (−0.75) = −0.750; a token without
    // either log-prob has none.
    let (head, rows) = crate::tui::samples::tokens::token_lines(
        v.listing()
            .and_then(Listing::selected_sample)
            .and_then(|s| s.tokens.as_ref()),
        &Theme::default(),
    );
    assert_eq!(head.to_string(), "   # token      student    math      k1");
    let rows: Vec<String> = rows.iter().map(|l| l.to_string()).collect();
    assert_eq!(rows[0], "   1 5           -0.250  -0.500   0.250");
    assert_eq!(rows[1], "   2 ↵           -1.500  -0.750  -0.750");
    assert_eq!(rows[2], "   3 <|im_end|>       -  -2.000       -");
    assert_eq!(rows[3], "   4 x           -0.125       -       -");
    insta::assert_snapshot!("samples_tokens_80x24", screen(&v, 80, 24));
    v.act(Action::PageDown);
    assert_eq!(v.scroll, 3, "four tokens: the last at the top at most");
    // T again: the text, still whole; a sample without a trace says what records one.
    v.act(Action::Tokens);
    assert!(!v.showing_tokens() && v.showing_whole());
    v.act(Action::Down);
    v.act(Action::Tokens);
    assert!(screen(&v, 80, 24).contains("No per-token log-probs here"));
    assert!(v.close_whole());
    assert!(!v.showing_tokens());
}
