use super::*;
use crate::config::{EnvConfig, RunConfig};
use crate::debugger::open::{env_config, run_env, session};
use crate::debugger::session::Actor;
use crate::store::OpenMode;

fn lake() -> EnvConfig {
    env_config(
        "frozen_lake",
        &[
            ("map".into(), "SFF/FHF/FFG".into()),
            ("legend".into(), "false".into()),
        ],
    )
    .unwrap()
}

fn played() -> Session {
    let mut s = session(&lake(), 4).unwrap();
    s.take("Down", Actor::Human).unwrap();
    s.act("oops".into(), Actor::Human, None).unwrap();
    s.take("Down", Actor::Random).unwrap();
    s
}

#[tokio::test]
async fn a_saved_session_is_a_debug_trajectory_of_a_run_that_replays() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("s.db"), OpenMode::Create)
        .await
        .unwrap();
    let s = played();
    let mut target = SaveTarget::NewRun;
    let first = save(&store, &SaveRequest::of(&s, &lake()), &mut target)
        .await
        .unwrap();
    assert_eq!(first.run_name, "debug-frozen_lake");
    assert_eq!((first.step, first.episode), (1, 0));
    // A second save of the session goes beside the first.
    let second = save(&store, &SaveRequest::of(&s, &lake()), &mut target)
        .await
        .unwrap();
    assert_eq!((second.run, second.episode), (first.run, 1));
    // Another session gets a run of its own, its name numbered.
    let other = save(
        &store,
        &SaveRequest::of(&s, &lake()),
        &mut SaveTarget::NewRun,
    )
    .await
    .unwrap();
    assert_eq!(other.run_name, "debug-frozen_lake-2");

    let run = store.run(first.run).await.unwrap();
    assert_eq!(run.status, crate::store::RunStatus::Finished);
    assert_eq!(run.tags, ["debug"]);
    let cfg: RunConfig = serde_json::from_str(&run.config_json).unwrap();
    assert_eq!(cfg.name, "debug-frozen_lake");
    let (_, env) = run_env(&run).unwrap();
    assert_eq!(
        env,
        lake(),
        "the whole env config, so the episode replays as played"
    );

    let stored = store.trajectories(first.run, None).await.unwrap();
    assert_eq!(stored.len(), 2);
    let t = &stored[0];
    assert_eq!(
        (t.stage.as_str(), t.env.as_str()),
        ("debug", "debug/frozen_lake")
    );
    assert_eq!((t.env_seed, t.end_reason.as_str()), (4, "stopped"));
    assert_eq!(t.turns.len(), 3);
    assert_eq!(t.turns[1].action_text, "oops");
    assert_eq!(t.turns[1].parsed_action, None);
    assert_eq!(t.turns[1].reward, -0.1);
    assert_eq!(t.turns[2].info["actor"], "random");
    // The stored episode opens again, every observation reproduced.
    let recorded: Vec<(String, String)> = t
        .turns
        .iter()
        .map(|u| (u.observation.clone(), u.action_text.clone()))
        .collect();
    let reopened = session(&env, t.env_seed)
        .unwrap()
        .open_recorded(&recorded, 99)
        .unwrap();
    assert_eq!(reopened.divergence, None);
    assert_eq!(reopened.observation(), s.observation());
    store.close().await;
}

#[test]
fn jsonl_has_one_line_per_turn() {
    let s = played();
    let text = to_jsonl(&s);
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[0]["parsed_action"], "Down");
    assert_eq!(lines[0]["next_observation"], "SFF\nPHF\nFFG");
    assert_eq!(lines[1]["valid"], false);
    assert_eq!(lines[2]["turn"], 3);
    assert_eq!(lines[2]["params"]["map"], "SFF/FHF/FFG");
}
