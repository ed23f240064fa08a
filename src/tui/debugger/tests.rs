#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

use super::*;
use crate::debugger::TokenView;
use crate::debugger::open::{StoredEpisode, env_config};
use crate::debugger::policy::SamplingOverrides;
use crate::metrics::{TrajectoryRecord, TurnRecord};
use crate::model::{Arch, InitOptions, init_model};
use crate::tui::debugger::render::render;
use crate::tui::theme::Theme;

fn lake() -> DebugView {
    let env = env_config(
        "frozen_lake",
        &[
            ("map".into(), "SFF/FHF/FFG".into()),
            ("legend".into(), "false".into()),
        ],
    )
    .unwrap();
    DebugView::new(env, 0)
}

fn screen(view: &DebugView, width: u16, height: u16) -> String {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    let theme = Theme::default();
    terminal
        .draw(|f| render(f, f.area(), view, "⠋", &theme))
        .unwrap();
    terminal.backend().to_string()
}

fn type_line(view: &mut DebugView, text: &str) -> Vec<DebugJob> {
    for c in text.chars() {
        view.input_key(KeyEvent::new(KeyCode::Char(c), KeyModifiers::NONE));
    }
    view.input_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE))
}

/// A tiny random model whose alphabet covers the lake and `<answer>` actions.
fn model(env: &EnvConfig, temperature: f64) -> ModelPolicy {
    let m = init_model(&InitOptions {
        arch: Arch::Qwen2,
        hidden: 32,
        layers: 1,
        heads: 2,
        kv_heads: 1,
        intermediate: 64,
        head_dim: None,
        tie_embeddings: true,
        max_positions: 256,
        rope_theta: 10_000.0,
        chars: "SFHGP\n<>/answerDoRightLfUp".into(),
        dtype: "float32".into(),
        seed: 3,
    })
    .unwrap();
    let sampling = SamplingParams {
        temperature,
        max_new_tokens: 5,
        ..SamplingParams::default()
    };
    ModelPolicy::new("tiny".into(), m, false, env, sampling).unwrap()
}

/// Carry out a job as the runtime would (without the store), and hand its answer back.
fn run_job(view: &mut DebugView, job: DebugJob) -> Vec<DebugJob> {
    let msg = job
        .compute()
        .unwrap_or_else(|other| panic!("not run here: {other:?}"));
    view.answer(msg)
}

#[test]
fn a_person_walks_to_the_goal_undoes_forks_and_the_screen_shows_it() {
    let mut v = lake();
    for a in [Action::MoveDown, Action::MoveDown, Action::MoveRight] {
        assert!(v.act(a).is_empty());
    }
    insta::assert_snapshot!("debugger_human_three_turns_100x30", screen(&v, 100, 30));
    v.act(Action::MoveRight);
    let s = v.session.as_ref().unwrap();
    assert!(s.done() && s.success());
    assert_eq!(s.total_reward(), 1.0);
    assert_eq!(v.selected, 4);
    // After the end no action is offered.
    let shown = screen(&v, 100, 30);
    assert!(
        shown.contains("the episode is over: no action is taken now"),
        "{shown}"
    );
    assert!(!shown.contains("valid actions now"), "{shown}");
    // Acting after the end says what to do.
    v.act(Action::MoveLeft);
    assert!(v.error.as_deref().unwrap().contains("the episode is over"));
    // Undo twice, then fork at the second turn: select it with k and press f.
    v.act(Action::Undo);
    v.act(Action::Undo);
    assert_eq!(v.turns(), 2);
    v.act(Action::Up);
    assert_eq!(v.selected, 1);
    v.act(Action::Fork);
    assert_eq!(v.turns(), 1);
    assert!(v.notice.as_deref().unwrap().contains("forked at turn 2"));
    // Right from (1,0) falls in the hole.
    v.act(Action::MoveRight);
    let s = v.session.as_ref().unwrap();
    assert!(s.done() && !s.success());
    // Keys that are not an action of the env say so.
    let mut sokoban_like = lake();
    sokoban_like.act(Action::TypeOutput);
    type_line(&mut sokoban_like, "jump");
    let t = &sokoban_like.session.as_ref().unwrap().turns[0];
    assert_eq!((t.output.as_str(), t.valid()), ("jump", false));
    // The picker takes the env's listed actions.
    v.act(Action::RestartEpisode);
    v.act(Action::PickAction);
    assert_eq!(v.picker, Some(0));
    // ↓ moves in the list (the arrows are env actions elsewhere); k and ↑ back.
    v.act(Action::MoveDown);
    v.act(Action::Down);
    v.act(Action::MoveUp);
    assert_eq!(v.picker, Some(1));
    v.act(Action::Open);
    let t = &v.session.as_ref().unwrap().turns[0];
    assert_eq!(
        t.parsed_action(),
        Some("Down"),
        "the second of Left, Down, Right, Up"
    );
}

#[test]
fn a_model_turn_shows_its_prompt_output_and_token_log_probs() {
    let mut v = lake();
    v.model = Some(model(&v.env, 1.0));
    v.policy = PolicyKind::Model;
    v.changed();
    let prompt = v.next_prompt.clone().unwrap().unwrap();
    assert_eq!(prompt.text, "PFF\nFHF\nFFG\n");
    let jobs = v.act(Action::StepTurn);
    assert_eq!(jobs.len(), 1);
    assert!(matches!(v.busy, Some((Work::Drawing { to_end: false }, _))));
    // While it draws, another step is refused, and the screen says what is under way.
    assert!(v.act(Action::StepTurn).is_empty());
    assert!(screen(&v, 100, 30).contains("the model is writing its turn"));
    run_job(&mut v, jobs.into_iter().next().unwrap());
    assert_eq!(v.busy, None);
    let t = &v.session.as_ref().unwrap().turns[0];
    assert_eq!(t.actor, Actor::Model);
    let m = t.model.as_ref().unwrap();
    assert_eq!(m.prompt_text, prompt.text);
    assert!(!m.tokens.is_empty());
    v.act(Action::NextToken);
    // The sampled text depends on the CPU's rounding, so the picture is checked for its parts
    // here and snapshotted from fixed values below.
    let shown = screen(&v, 100, 30);
    for part in [
        "raw output:",
        "tokens · log-prob",
        ": log-prob",
        "entropy",
        "model   ",
    ] {
        assert!(shown.contains(part), "{part}: {shown}");
    }
    v.act(Action::PrevPane);
    assert_eq!(v.pane, Pane::Prompt);
    assert!(screen(&v, 100, 30).contains("the prompt of turn 1"));
}

#[test]
fn running_to_the_end_chains_turns_and_esc_cancels_a_draw() {
    let mut v = lake();
    v.env.max_turns = 3;
    v.model = Some(model(&v.env, 1.0));
    v.policy = PolicyKind::Model;
    let mut jobs = v.act(Action::RunToEnd);
    while let Some(job) = jobs.pop() {
        jobs = run_job(&mut v, job);
    }
    let s = v.session.as_ref().unwrap();
    assert!(s.done() || s.turns.len() == 3, "{}", s.turns.len());
    // A draw cancelled with Esc ends without a turn.
    v.act(Action::RestartEpisode);
    let job = v.act(Action::StepTurn).pop().unwrap();
    assert!(v.back(), "Esc cancels the draw first");
    run_job(&mut v, job);
    assert_eq!(v.turns(), 0);
    assert_eq!(v.notice.as_deref(), Some("cancelled"));
    assert!(!v.back(), "then Esc leaves the view");
    // Esc after the last decode step: the finished draw is dropped, and a run to the end stops.
    let DebugJob::Generate {
        job,
        policy,
        prompt,
        seed,
        ..
    } = v.act(Action::RunToEnd).pop().unwrap()
    else {
        panic!("a draw");
    };
    let result = policy.generate(&prompt, seed, None);
    assert!(v.back());
    assert!(v.answer(DebugMsg::Generated { job, result }).is_empty());
    assert_eq!((v.turns(), v.busy), (0, None));
}

#[test]
fn resampling_shows_the_action_distribution() {
    // A parser that takes the first character, so a random model's draws hold actions (none of
    // them one of the lake's) and the histogram has several bars.
    let mut env = lake().env;
    env.action_pattern = Some(r"(?s)^\s*(\S)".into());
    let mut v = DebugView::new(env, 0);
    let mut m = model(&v.env, 1.0);
    m.sampling.max_new_tokens = 4;
    v.model = Some(m);
    v.act(Action::EditSampling);
    v.input.as_mut().unwrap().text.clear();
    type_line(&mut v, "temperature=1.5 samples=16");
    assert_eq!(v.draws, 16);
    assert_eq!(v.model.as_ref().unwrap().sampling.temperature, 1.5);
    let job = v.act(Action::Resample).pop().unwrap();
    run_job(&mut v, job);
    let (turn, r) = v.resample.clone().unwrap();
    assert_eq!((turn, r.draws), (0, 16));
    assert_eq!(r.counts.iter().map(|c| c.count).sum::<usize>(), 16);
    assert_eq!(v.pane, Pane::Samples);
    assert!(screen(&v, 100, 24).contains("16 draws of turn 1"));
}

/// A token as the policy module reports it.
fn token(text: &str, logprob: f32, entropy: f32, alternatives: &[(&str, f32)]) -> TokenView {
    TokenView {
        id: 0,
        text: text.into(),
        logprob,
        entropy,
        alternatives: alternatives
            .iter()
            .map(|(t, p)| (t.to_string(), *p))
            .collect(),
    }
}

#[test]
fn the_model_and_resample_panels_draw_fixed_values() {
    use crate::debugger::policy::{ActionCount, ModelTurn, Resample};
    use crate::rollout::FinishReason;
    let mut v = lake();
    // A model's turn with hand-written numbers: "Down" was drawn at p = 0.055, the model
    // preferring Right (0.61); that token is selected with ].
    let tokens = vec![
        token("<answer>", -0.02, 0.11, &[("<answer>", 0.98), ("D", 0.01)]),
        token(
            "Down",
            -2.9,
            1.17,
            &[
                ("Right", 0.61),
                ("Left", 0.2),
                ("Up", 0.12),
                ("Down", 0.055),
            ],
        ),
        token("</answer>", -0.01, 0.06, &[("</answer>", 0.99)]),
        token("<eos>", -0.3, 0.7, &[("<eos>", 0.74), ("\n", 0.2)]),
    ];
    let turn = ModelTurn {
        prompt_text: "PFF\nFHF\nFFG\n".into(),
        prompt_tokens: 12,
        output_ids: vec![1, 2, 3, 4],
        finish: FinishReason::Eos,
        tokens,
    };
    v.session
        .as_mut()
        .unwrap()
        .act("<answer>Down</answer>".into(), Actor::Model, Some(turn))
        .unwrap();
    v.selected = 0;
    v.pane = Pane::Output;
    v.act(Action::NextToken);
    insta::assert_snapshot!("debugger_model_turn_100x30", screen(&v, 100, 30));
    // The distribution of 32 draws of the next turn.
    v.resample = Some((
        1,
        Resample {
            draws: 32,
            counts: vec![
                ActionCount {
                    action: Some("Down".into()),
                    unknown: false,
                    count: 20,
                },
                ActionCount {
                    action: Some("Right".into()),
                    unknown: false,
                    count: 7,
                },
                ActionCount {
                    action: None,
                    unknown: false,
                    count: 3,
                },
                ActionCount {
                    action: Some("Jump".into()),
                    unknown: true,
                    count: 2,
                },
            ],
            mean_logprob: -4.25,
        },
    ));
    v.pane = Pane::Samples;
    insta::assert_snapshot!("debugger_resample_100x24", screen(&v, 100, 24));
}

fn stored(observations: &[&str], outputs: &[&str]) -> StoredEpisode {
    let env = env_config(
        "frozen_lake",
        &[
            ("map".into(), "SFF/FHF/FFG".into()),
            ("legend".into(), "false".into()),
        ],
    )
    .unwrap();
    let run = crate::store::RunInfo {
        id: crate::store::RunId(7),
        name: "lake".into(),
        status: crate::store::RunStatus::Finished,
        created_at: 0,
        updated_at: 0,
        heartbeat_at: 0,
        config_json: String::new(),
        config_hash: String::new(),
        git_revision: None,
        seed: 1,
        output_dir: String::new(),
        notes: String::new(),
        tags: vec![],
        last_stage: None,
        last_step: 3,
        error: None,
        host: None,
        pid: None,
        process_token: None,
    };
    let cfg: crate::config::RunConfig =
        serde_json::from_value(serde_json::json!({"name": "lake", "model": {}})).unwrap();
    StoredEpisode {
        run,
        cfg,
        env,
        rl_checkpoints: vec![2],
        record: TrajectoryRecord {
            stage: "rl".into(),
            step: 3,
            env: "frozen_lake".into(),
            env_seed: 0,
            policy_version: 2,
            success: false,
            group: 1,
            episode: 0,
            end_reason: "max_turns".into(),
            turns: observations
                .iter()
                .zip(outputs)
                .map(|(o, a)| TurnRecord {
                    observation: o.to_string(),
                    action_text: a.to_string(),
                    parsed_action: None,
                    reward: 0.0,
                    done: false,
                    prompt_tokens: 0,
                    response_tokens: 0,
                    info: Default::default(),
                    tokens: None,
                })
                .collect(),
        },
    }
}

/// The runtime's answer to an `Open` job: the stored episode rebuilt at the job's turn.
fn opened(job: &DebugJob, stored: StoredEpisode) -> DebugMsg {
    let DebugJob::Open { job, at, .. } = job else {
        panic!("{job:?}");
    };
    let session = crate::debugger::open::session_at(&stored, *at).unwrap();
    DebugMsg::Opened {
        job: *job,
        result: Ok(Box::new(crate::tui::debugger::jobs::OpenedEpisode {
            stored,
            session,
        })),
    }
}

#[test]
fn a_stored_episode_opens_at_its_turn_and_a_divergence_is_reported() {
    let obs = ["PFF\nFHF\nFFG", "SFF\nPHF\nFFG", "SFF\nFHF\nPFG"];
    let out = [
        "<answer>Down</answer>",
        "<answer>Down</answer>",
        "<answer>Right</answer>",
    ];
    let (mut v, job) = DebugView::opening("lake", 3, 1, 0, None, 1);
    assert!(matches!(
        job,
        DebugJob::Open {
            step: 3,
            group: 1,
            ..
        }
    ));
    v.answer(opened(&job, stored(&obs, &out)));
    let s = v.session.as_ref().unwrap();
    assert_eq!((s.turns.len(), s.divergence.clone()), (1, None));
    assert_eq!(s.observation(), obs[1]);
    // Step 3's episodes were played by policy version 2: the checkpoint after RL step 2.
    assert_eq!(v.model_spec, "lake@rl-2");
    // Without a checkpoint at step 2, the last one before it; without one, the start policy.
    let mut other = stored(&obs, &out);
    other.rl_checkpoints = vec![1, 5];
    assert_eq!(other.played_by(), "lake@rl-1");
    other.rl_checkpoints = vec![5];
    assert_eq!(other.played_by(), "lake@rl-0");
    assert!(matches!(
        v.save_target,
        SaveTarget::Run {
            step: 3,
            group: 1,
            ..
        }
    ));
    // A stored observation the env does not produce: reported with the turn it happened at.
    let edited = ["PFF\nFHF\nFFG", "SFF\nPHF\nFFG", "SFF\nFHF\nFFP"];
    let (mut v, job) = DebugView::opening("lake", 3, 1, 0, None, usize::MAX);
    v.answer(opened(&job, stored(&edited, &out)));
    assert_eq!(v.turns(), 2, "the turns before the divergence");
    assert!(v.error.as_deref().unwrap().contains("diverges at turn 3"));
    insta::assert_snapshot!("debugger_divergence_100x30", screen(&v, 100, 30));
}

#[test]
fn bad_settings_and_environments_are_named_and_change_nothing() {
    let mut v = lake();
    v.act(Action::EditSampling);
    v.input.as_mut().unwrap().text = "top_p=3".into();
    type_line(&mut v, "");
    assert!(
        v.error
            .as_deref()
            .unwrap()
            .contains("top_p must be in (0, 1]")
    );
    assert_eq!(v.overrides, SamplingOverrides::default());
    v.act(Action::ChooseEnv);
    v.input.as_mut().unwrap().text = "sokobon".into();
    assert!(type_line(&mut v, "").is_empty());
    assert!(
        v.error
            .as_deref()
            .unwrap()
            .contains("did you mean 'sokoban'")
    );
    assert_eq!(v.session.as_ref().unwrap().env_name, "frozen_lake");
    v.act(Action::ChooseEnv);
    v.input.as_mut().unwrap().text = "sokoban seed=4".into();
    for job in type_line(&mut v, "") {
        run_job(&mut v, job);
    }
    assert_eq!(v.session.as_ref().unwrap().env_name, "sokoban");
    assert_eq!(v.session.as_ref().unwrap().seed, 4);
    // Model turns without a model say how to get one.
    v.policy = PolicyKind::Model;
    assert!(v.act(Action::StepTurn).is_empty());
    assert!(v.error.as_deref().unwrap().contains("m chooses"));
    assert!(v.act(Action::Resample).is_empty());
    // Esc closes an open input before anything else.
    v.act(Action::ChooseModel);
    assert!(v.back() && v.input.is_none());
}

#[test]
fn the_workbench_opens_the_debugger_as_view_7_without_a_run() {
    use crate::tui::app::{App, Msg, View};
    let key = |c: KeyCode| Msg::Key(KeyEvent::new(c, KeyModifiers::NONE));
    let mut app = App::new();
    app.update(key(KeyCode::Char('7')));
    assert_eq!(app.view, View::Debugger);
    app.update(key(KeyCode::Down));
    assert_eq!(app.debugger.as_ref().unwrap().turns(), 1);
    // j and k walk the turns; the arrows act.
    app.update(key(KeyCode::Char('k')));
    assert_eq!(app.debugger.as_ref().unwrap().selected, 0);
    // Typing goes to the input line, not to the keymap ('q' does not quit).
    app.update(key(KeyCode::Char('i')));
    for c in "q?7".chars() {
        app.update(key(KeyCode::Char(c)));
    }
    assert!(!app.quit && !app.help && app.view == View::Debugger);
    app.update(key(KeyCode::Enter));
    let t = &app
        .debugger
        .as_ref()
        .unwrap()
        .session
        .as_ref()
        .unwrap()
        .turns[1];
    assert_eq!(t.output, "q?7");
    // The help lists the debugger's keys.
    let help = crate::tui::action::help_lines(app.keys(), crate::tui::action::Scope::Debugger);
    for what in [
        "resample the turn",
        "fork at the selected turn",
        "undo the last turn",
    ] {
        assert!(help.iter().any(|(_, w)| *w == what), "{what}");
    }
    // Esc leaves for the runs list (no run is open); the debugger keeps its episode.
    app.update(key(KeyCode::Esc));
    assert_eq!(app.view, View::Runs);
    app.update(key(KeyCode::Char('7')));
    assert_eq!(app.debugger.as_ref().unwrap().turns(), 2);
}

#[test]
fn d_on_the_episodes_view_opens_the_selected_turn_in_the_debugger() {
    use crate::tui::app::{App, Effect, Msg, OpenRun, View};
    use crate::tui::episodes::EpisodesView;
    let key = |c: KeyCode| Msg::Key(KeyEvent::new(c, KeyModifiers::NONE));
    let mut app = App::new();
    let run = crate::store::RunId(7);
    app.open = Some(OpenRun {
        id: run,
        name: "lake".into(),
        live: false,
        start_ms: 0,
    });
    let mut episodes = EpisodesView::new(run);
    episodes.set_steps(vec![(3, false)]);
    let mut second = stored(&["PFF\nFHF\nFFG", "SFF\nPHF\nFFG"], &["a", "b"]).record;
    second.episode = 1;
    let first = TrajectoryRecord {
        episode: 0,
        ..second.clone()
    };
    episodes.set_episodes(3, vec![first, second]);
    app.episodes = Some(episodes);
    app.view = View::Episodes;
    // The second episode, its second turn.
    for k in [KeyCode::Char('j'), KeyCode::Tab, KeyCode::Char('j')] {
        app.update(key(k));
    }
    // The debugger holds an episode not saved, and a model: one D asks, a second replaces the
    // episode and keeps the model.
    let mut held = lake();
    held.act(Action::MoveDown);
    held.model = Some(model(&held.env, 1.0));
    app.debugger = Some(held);
    assert!(app.update(key(KeyCode::Char('D'))).is_empty());
    assert_eq!(app.view, View::Episodes);
    assert!(
        app.notice
            .as_deref()
            .unwrap()
            .contains("D again replaces it")
    );
    let effects = app.update(key(KeyCode::Char('D')));
    assert_eq!(app.view, View::Debugger);
    assert!(app.debugger.as_ref().unwrap().model.is_some());
    let [Effect::Debug(job)] = effects.as_slice() else {
        panic!("{effects:?}");
    };
    match job.as_ref() {
        DebugJob::Open {
            run,
            step,
            group,
            episode,
            env,
            ..
        } => assert_eq!(
            (run.as_str(), *step, *group, *episode, env.as_deref()),
            ("lake", 3, 1, 1, Some("frozen_lake"))
        ),
        other => panic!("{other:?}"),
    }
    assert!(
        matches!(job.as_ref(), DebugJob::Open { at: 1, .. }),
        "before the selected (second) turn"
    );
    let d = app.debugger.as_mut().unwrap();
    assert!(screen(d, 80, 24).contains("opening the stored episode"));
    // Esc cancels the opening first, then goes back where D was pressed; reached by its
    // number, the debugger goes back to the dashboard.
    app.update(key(KeyCode::Esc));
    assert_eq!(app.view, View::Debugger);
    app.update(key(KeyCode::Esc));
    assert_eq!(app.view, View::Episodes);
    app.update(key(KeyCode::Char('7')));
    assert_eq!(app.view, View::Debugger);
    app.update(key(KeyCode::Esc));
    assert_eq!(app.view, View::Dashboard);
}

#[test]
fn the_model_input_offers_the_stores_checkpoints() {
    let mut v = lake();
    let jobs = v.act(Action::ChooseModel);
    let [DebugJob::ListCheckpoints { job }] = jobs.as_slice() else {
        panic!("{jobs:?}");
    };
    v.answer(DebugMsg::Checkpoints {
        job: *job,
        specs: vec!["lake@rl-2".into(), "lake@sft-1".into()],
    });
    // Nothing typed: the newest is picked, so Enter right away loads it.
    assert_eq!(v.input.as_ref().unwrap().text, "lake@rl-2");
    assert_eq!(v.input.as_ref().unwrap().choice, Some(0));
    let down = KeyEvent::new(KeyCode::Down, KeyModifiers::NONE);
    v.input_key(down);
    v.input_key(down);
    assert_eq!(v.input.as_ref().unwrap().text, "lake@sft-1");
    assert!(screen(&v, 100, 30).contains("checkpoints in the store"));
    let jobs = v.input_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE));
    assert!(matches!(jobs.as_slice(), [DebugJob::LoadModel { spec, .. }] if spec == "lake@sft-1"));
    assert!(matches!(v.busy, Some((Work::LoadingModel, _))));
}

#[test]
fn a_program_backed_env_steps_off_the_screens_thread() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/envs/external/guess_number.py");
    let env = env_config(
        "external",
        &[
            ("command".into(), format!("python3 {script}")),
            ("high".into(), "10".into()),
        ],
    )
    .unwrap();
    // Seed 1 hides 3 (Python: random.Random(1).randint(1, 10) == 3).
    let mut v = DebugView::new(env, 1);
    v.act(Action::TypeOutput);
    let jobs = type_line(&mut v, "<answer>5</answer>");
    assert!(
        matches!(jobs.as_slice(), [DebugJob::Step { .. }]),
        "{jobs:?}"
    );
    assert!(v.session.is_none(), "the episode is with the step");
    assert!(matches!(v.busy, Some((Work::Stepping, _))));
    assert!(screen(&v, 100, 24).contains("the environment's program is stepping"));
    // Esc cannot interrupt a program's step, and says so.
    assert!(v.back());
    assert!(
        v.notice
            .as_deref()
            .unwrap()
            .contains("cannot be interrupted")
    );
    for job in jobs {
        assert!(run_job(&mut v, job).is_empty());
    }
    let s = v.session.as_ref().unwrap();
    assert_eq!(s.turns.len(), 1);
    assert_eq!(
        s.observation(),
        "5 is too high. It is between 1 and 4; 6 guesses left."
    );
    // Undo goes through the program as well, and comes back with the first observation.
    let jobs = v.act(Action::Undo);
    for job in jobs {
        run_job(&mut v, job);
    }
    assert_eq!(v.turns(), 0);
    assert_eq!(v.busy, None);
}

/// `m` with a model of a run of this env: the env is played with the run's settings (its
/// penalty, turns, …), as `env debug --model` does, and an episode not yet begun restarts under
/// them; one under way keeps its own and the notice says when they apply.
#[test]
fn a_run_s_model_plays_the_env_with_the_run_s_settings() {
    let load = |v: &mut DebugView| {
        let mut m = model(&v.env, 1.0);
        m.run_env = Some(EnvConfig {
            format_penalty: -0.5,
            max_turns: 7,
            params: Default::default(),
            ..v.env.clone()
        });
        let DebugJob::LoadModel { job, .. } = v.load_model("lake@rl-3") else {
            panic!("not a model load");
        };
        v.answer(DebugMsg::ModelLoaded {
            job,
            result: Ok(Box::new(m)),
        })
    };
    let mut v = lake();
    let jobs = load(&mut v);
    assert_eq!((v.env.format_penalty, v.env.max_turns), (-0.5, 7));
    // The map chosen here stays; the run's other settings come in.
    assert_eq!(v.env.params["map"], "SFF/FHF/FFG");
    let [job] = <[DebugJob; 1]>::try_from(jobs).ok().unwrap();
    assert!(matches!(job, DebugJob::StartEnv { seed: 0, .. }));
    assert!(run_job(&mut v, job).is_empty());
    assert!(v.session.as_ref().unwrap().turns.is_empty());
    assert!(
        v.notice
            .as_deref()
            .unwrap()
            .contains("with its run's settings")
    );
    // A turn already played: nothing restarts.
    let mut v = lake();
    v.act(Action::MoveDown);
    let played = v.session.as_ref().unwrap().turns.len();
    assert!(played > 0);
    assert!(load(&mut v).is_empty());
    assert_eq!(v.session.as_ref().unwrap().turns.len(), played);
    assert!(
        v.notice
            .as_deref()
            .unwrap()
            .contains("apply to the next episode")
    );
}
