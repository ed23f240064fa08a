//! Real worker processes (`roll-tui worker reward`): calls, handshake, exit and kill detection, and
//! no orphans when the parent is killed with SIGKILL. Waits use deadlines, never fixed sleeps.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::time::{Duration, Instant};

use roll::reward::{self, Reward, RewardFn, RewardKind};
use roll::role::remote::call_typed;
use roll::role::reward::{RewardCall, RewardProtocol, RewardReply, ScoreItem};
use roll::worker::protocol::{Channel, handshake_parent};
use roll::worker::{Role, WorkerError, WorkerEvent, WorkerProcess, WorkerSpec};
use tokio::sync::mpsc;

fn spec(role: Role) -> WorkerSpec {
    WorkerSpec {
        program: assert_cmd::cargo::cargo_bin("roll-tui"),
        ..WorkerSpec::new(role, 0).unwrap()
    }
}

const CASES: [(RewardKind, &str, &str); 6] = [
    (RewardKind::MathRule, "the answer is \\boxed{12}", "12"),
    (RewardKind::MathRule, "13", "12"),
    (RewardKind::MathVerify, "so \\boxed{2\\sqrt3}", "\\sqrt{12}"),
    // A program run in the worker's sandbox (needs bubblewrap, as tests/code_sandbox.rs does).
    (
        RewardKind::CodeSandbox,
        "```python\nprint(6 * 7)\n```",
        r#"{"tests": [{"stdin": "", "stdout": "42"}]}"#,
    ),
    (RewardKind::ExactMatch, " cba ", "cba"),
    (RewardKind::ExactMatch, "", "cba"),
];

fn items() -> Vec<ScoreItem> {
    CASES
        .into_iter()
        .map(|(kind, response, ground_truth)| ScoreItem {
            reward: Reward::One(match kind {
                RewardKind::MathRule => RewardFn::MathRule,
                RewardKind::MathVerify => RewardFn::MathVerify {
                    percent_is_fraction: true,
                },
                RewardKind::ExactMatch => RewardFn::ExactMatch { ignore_case: false },
                RewardKind::CodeSandbox => RewardFn::CodeSandbox(Default::default()),
                RewardKind::Ifeval => RewardFn::Ifeval(Default::default()),
                RewardKind::RegexMatch => RewardFn::RegexMatch {
                    pattern: r"\S".into(),
                },
                RewardKind::LlmJudge => {
                    RewardFn::LlmJudge(reward::llm_judge::Params::new("/no/judge".into()))
                }
            }),
            domain: kind.as_str().into(),
            prompt: String::new(),
            response: response.into(),
            ground_truth: ground_truth.into(),
            metadata: None,
        })
        .collect()
}

/// The next event matching `want`, waiting at most `within`.
async fn wait_for(
    events: &mut mpsc::UnboundedReceiver<WorkerEvent>,
    within: Duration,
    want: impl Fn(&WorkerEvent) -> bool,
) -> WorkerEvent {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Some(e)) if want(&e) => return e,
            Ok(Some(_)) => continue,
            Ok(None) => panic!("event channel closed"),
            Err(_) => panic!("no matching event within {within:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reward_worker_scores_exactly_like_the_in_process_rule() {
    let (tx, mut events) = mpsc::unbounded_channel();
    let worker = WorkerProcess::spawn(&spec(Role::Reward), tx).await.unwrap();
    let started = wait_for(&mut events, Duration::from_secs(1), |e| {
        matches!(e, WorkerEvent::Started { .. })
    })
    .await;
    assert_eq!(
        started,
        WorkerEvent::Started {
            role: Role::Reward,
            index: 0,
            pid: worker.pid,
            via: "unix socket".into(),
            node: None,
        }
    );
    let call = RewardCall::Score { items: items() };
    let reply = call_typed::<RewardProtocol>(&worker, &call, Duration::from_secs(10))
        .await
        .unwrap();
    let expected: Vec<_> = CASES
        .iter()
        .map(|(kind, response, truth)| reward::score(*kind, response, truth))
        .collect();
    let code = &expected[3];
    assert!(code.correct && code.error.is_none(), "{code:?}");
    assert_eq!(reply, RewardReply::Scores(expected));
    let pid = worker.pid;
    let status = worker.shutdown(Duration::from_secs(5)).await;
    assert_eq!(status, "exit status 0");
    let exited = wait_for(&mut events, Duration::from_secs(5), |e| {
        matches!(e, WorkerEvent::Exited { .. })
    })
    .await;
    assert_eq!(
        exited,
        WorkerEvent::Exited {
            role: Role::Reward,
            index: 0,
            pid,
            status: "exit status 0".into(),
            expected: true
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_is_reported_within_5_s_and_calls_fail_at_once() {
    let (tx, mut events) = mpsc::unbounded_channel();
    let worker = WorkerProcess::spawn(&spec(Role::Reward), tx).await.unwrap();
    let killed_at = Instant::now();
    let kill = std::process::Command::new("kill")
        .args(["-9", &worker.pid.to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let exited = wait_for(&mut events, Duration::from_secs(5), |e| {
        matches!(e, WorkerEvent::Exited { .. })
    })
    .await;
    assert!(killed_at.elapsed() < Duration::from_secs(5));
    let WorkerEvent::Exited {
        status, expected, ..
    } = exited
    else {
        unreachable!()
    };
    assert_eq!((status.as_str(), expected), ("killed by signal 9", false));
    let call = RewardCall::Score { items: items() };
    let err = call_typed::<RewardProtocol>(&worker, &call, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "reward worker 0 died during 'score' (killed by signal 9)"
    );
}

#[tokio::test]
async fn roles_that_cannot_run_out_of_process_and_missing_programs_are_clear_errors() {
    let (tx, _events) = mpsc::unbounded_channel();
    let err = WorkerProcess::spawn(&spec(Role::Env), tx.clone())
        .await
        .err()
        .unwrap();
    assert!(matches!(err, WorkerError::Unsupported(Role::Env)), "{err}");
    let missing = WorkerSpec {
        program: "/nonexistent/roll-tui".into(),
        ..spec(Role::Reward)
    };
    let err = WorkerProcess::spawn(&missing, tx)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.starts_with("reward worker 0: cannot start '/nonexistent/roll-tui'"),
        "{err}"
    );
}

#[tokio::test]
async fn a_worker_whose_parent_is_killed_9_does_not_outlive_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("w.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    // A shell plays the parent: it starts the worker and waits; we then SIGKILL the shell.
    let mut shell = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#""$0" worker reward --index 0 --socket "$1" --parent $$ & wait"#)
        .arg(assert_cmd::cargo::cargo_bin("roll-tui"))
        .arg(&socket)
        .spawn()
        .unwrap();
    let (stream, _) = tokio::time::timeout(Duration::from_secs(20), listener.accept())
        .await
        .expect("the worker connects")
        .unwrap();
    let mut ch = Channel::new(stream);
    let worker_pid = handshake_parent(&mut ch, Role::Reward, 0).await.unwrap();
    let alive = |pid: u32| {
        // Gone, or a zombie waiting for a reaper: either way no longer running.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
            })
            .unwrap_or(false)
    };
    assert!(alive(worker_pid));
    shell.kill().unwrap(); // SIGKILL
    shell.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(worker_pid) {
        assert!(
            Instant::now() < deadline,
            "worker {worker_pid} outlived its parent by 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn the_worker_command_refuses_roles_it_cannot_serve() {
    let out = assert_cmd::Command::cargo_bin("roll-tui")
        .unwrap()
        .args([
            "worker",
            "env",
            "--index",
            "0",
            "--socket",
            "/nonexistent.sock",
            "--parent",
        ])
        .arg(std::process::id().to_string())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("role 'env' cannot run in a worker process yet"),
        "{err}"
    );
}
