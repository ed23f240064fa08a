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

/// A stand-in for ssh that runs the remote command here, as sshd would, after logging the
/// destination, the command and what the shared directory holds then; it also keeps the first
/// line of its stdin (the run's secret) in `secrets`, and passes the rest on.
fn fake_ssh(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let (fake, log, shared) = (
        dir.join("fake-ssh"),
        dir.join("ssh.log"),
        dir.join("shared"),
    );
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nhost=\"$1\"; shift\nprintf '%s %s\\n' \"$host\" \"$*\" >> {log}\n\
             ls {shared} >> {log}\nIFS= read -r secret\nprintf '%s\\n' \"$secret\" >> {secrets}\n\
             {{ printf '%s\\n' \"$secret\"; exec cat; }} | sh -c \"$*\"\n",
            log = log.display(),
            shared = shared.display(),
            secrets = dir.join("secrets").display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    (fake, log)
}

fn ssh_cluster(dir: &std::path::Path, fake: &std::path::Path) -> String {
    format!(
        "cluster={{launcher: ssh, listen: 127.0.0.1, hosts: [alpha, beta], role_hosts: {{reference: beta}}, ssh: [{}], remote_dir: {d}, shared_dir: {d}/shared}}",
        fake.display(),
        d = dir.display()
    )
}

/// `launcher: ssh`: each worker is started by ssh on its role's host, gets the secret on stdin
/// (never on the command line), works in the shared directory, and computes what a local worker
/// computes.
#[test]
fn workers_started_over_ssh_on_their_hosts_compute_as_local_ones() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, log) = fake_ssh(dir.path());
    let local = run_quiet(dir.path(), "local", RL, &WORKERS);
    let mut over_ssh = WORKERS.to_vec();
    let cluster = ssh_cluster(dir.path(), &fake);
    over_ssh.push(&cluster);
    let ssh = run_quiet(dir.path(), "ssh", RL, &over_ssh);
    assert_same_metrics(&local, &ssh, "net");

    let log = std::fs::read_to_string(&log).unwrap();
    let launches: Vec<&str> = log.lines().filter(|l| l.contains(" worker ")).collect();
    assert_eq!(launches.len(), 3, "{log}");
    for (role, host) in [
        ("actor_train", "alpha"),
        ("actor_infer", "alpha"),
        ("reference", "beta"),
    ] {
        let line = launches
            .iter()
            .find(|l| l.contains(&format!(" worker {role} ")))
            .unwrap_or_else(|| panic!("{role}: {log}"));
        assert!(line.starts_with(&format!("{host} cd ")), "{line}");
        assert!(
            line.contains("--connect 127.0.0.1:") && line.ends_with("--secret-stdin"),
            "{line}"
        );
    }
    // Each worker got the run's one secret on its stdin, and it is nowhere else: not on a
    // command line, not in the store, not in the run's files.
    let secrets = std::fs::read_to_string(dir.path().join("secrets")).unwrap();
    let secrets: Vec<&str> = secrets.lines().collect();
    assert_eq!(secrets.len(), 3, "{secrets:?}");
    let secret = secrets[0];
    assert!(
        secrets.iter().all(|s| *s == secret) && secret.len() == 64,
        "{secrets:?}"
    );
    assert!(!log.contains(secret), "{log}");
    let store_bytes = std::fs::read(&ssh).unwrap();
    assert!(
        !store_bytes
            .windows(secret.len())
            .any(|w| w == secret.as_bytes()),
        "the secret is in the store"
    );
    for entry in walk(dir.path()) {
        if entry.file_name().is_some_and(|n| n == "secrets") {
            continue;
        }
        let text = std::fs::read(&entry).unwrap_or_default();
        assert!(
            !text.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "the secret is in {}",
            entry.display()
        );
    }
    // The head's host areas (offloaded weights, rows files) are in the shared directory, and
    // gone from it after the run.
    assert!(log.contains("roll-tui-host-"), "{log}");
    assert_eq!(
        std::fs::read_dir(dir.path().join("shared"))
            .unwrap()
            .count(),
        0
    );
    // Each start names its node as a field (the Workers view groups by it); local workers none.
    for e in of_kind(&run_events(&ssh, "net"), "worker_started") {
        let m = e["message"].as_str().unwrap();
        let node = if e["worker"] == "reference-0" {
            "beta"
        } else {
            "alpha"
        };
        assert!(m.contains(&format!("started by ssh on {node}")), "{m}");
        assert_eq!(e["node"], node, "{e}");
    }
    for e in of_kind(&run_events(&local, "net"), "worker_started") {
        assert!(e.get("node").is_none(), "{e}");
    }
    // Device 0 of beta is not device 0 of alpha: on one machine the reference time-shares
    // device 0 with the generator; on its own node it is never offloaded, while actor_train
    // still makes way for the generator on alpha.
    let offloads = |store: &std::path::Path, role: &str| {
        of_kind(&run_events(store, "net"), "offload")
            .iter()
            .filter(|e| e["role"] == role)
            .count()
    };
    assert!(offloads(&local, "reference") > 0);
    assert_eq!(offloads(&ssh, "reference"), 0);
    assert!(offloads(&ssh, "actor_train") > 0);
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let path = e.path();
        if path.is_dir() {
            out.extend(walk(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Workers started over ssh are gone within seconds of their head's SIGKILL: the end of their
/// stdin (the head's pipe) ends them, with no cleanup by anyone.
#[test]
fn no_ssh_worker_outlives_its_killed_head() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, _) = fake_ssh(dir.path());
    let long = RL.replace("steps: 6", "steps: 400");
    let cfg = common::write_config(dir.path(), "net", &long);
    let store = dir.path().join("killed.db");
    let cluster = ssh_cluster(dir.path(), &fake);
    let mut args = vec!["run", cfg.to_str().unwrap()];
    args.extend(WORKERS);
    args.push(&cluster);
    let (mut child, _lines) = common::spawn_until(&store, args, "rl      2/");
    // This test's workers: in its directory (the other tests run beside it).
    let here = dir.path().canonicalize().unwrap();
    let workers = || -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| {
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
                let cwd = std::fs::read_link(e.path().join("cwd")).ok()?;
                (String::from_utf8_lossy(&cmd).contains(" worker ")
                    || String::from_utf8_lossy(&cmd).contains("\0worker\0"))
                .then_some(())?;
                (String::from_utf8_lossy(&cmd).contains("--secret-stdin") && cwd == here)
                    .then_some(pid)
            })
            .collect()
    };
    assert_eq!(workers().len(), 3, "three workers while the run runs");
    assert!(common::kill_9(child.id()));
    child.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !workers().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "left running: {:?}",
            workers()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A stand-in for srun that runs the step's command here, as slurmd would: it logs the node it
/// was given, the working directory and the command; keeps the first line of its stdin (the
/// run's secret) in `secrets` and passes the rest on, as srun forwards its stdin to the task.
fn fake_srun(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let fake = dir.join("fake-srun");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/bash\nwhile [[ \"$1\" == --* ]]; do\n  case \"$1\" in\n    \
             --nodelist=*) node=\"${{1#--nodelist=}}\";;\n    --chdir=*) wd=\"${{1#--chdir=}}\";;\n  \
             esac\n  shift\ndone\nprintf '%s %s %s\\n' \"$node\" \"$wd\" \"$*\" >> {log}\n\
             IFS= read -r secret\nprintf '%s\\n' \"$secret\" >> {secrets}\ncd \"$wd\"\n\
             {{ printf '%s\\n' \"$secret\"; exec cat; }} | \"$@\"\n",
            log = dir.join("srun.log").display(),
            secrets = dir.join("srun-secrets").display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    fake
}

/// `launcher: slurm`: inside an allocation (`SLURM_JOB_NODELIST` as SLURM writes it) each
/// worker is a step srun starts on its role's node, gets the secret on stdin, keeps a mirror of
/// its host area (no `shared_dir`), and computes what a local worker computes; outside an allocation, or with a node the allocation lacks, the run
/// is refused before anything starts.
#[test]
fn workers_started_by_srun_on_their_nodes_compute_as_local_ones() {
    let dir = tempfile::tempdir().unwrap();
    let fake = fake_srun(dir.path());
    let local = run_quiet(dir.path(), "local", RL, &WORKERS);
    let cfg = write_config(dir.path(), "net", RL);
    let store = dir.path().join("slurm.db");
    let cluster = |reference: &str| {
        format!(
            "cluster={{launcher: slurm, listen: 127.0.0.1, role_hosts: {{reference: {reference}}}, srun: [{}], remote_dir: {}}}",
            fake.display(),
            dir.path().display()
        )
    };
    let run = |cluster: &str, nodelist: Option<&str>| {
        let mut command = common::bin();
        command
            .arg("--store")
            .arg(&store)
            .args(["run", "--quiet", cfg.to_str().unwrap()])
            .args(WORKERS)
            .arg(cluster)
            .env_remove("SLURM_JOB_NODELIST")
            .env_remove("SLURM_NODELIST");
        if let Some(list) = nodelist {
            command.env("SLURM_JOB_NODELIST", list);
        }
        command.output().unwrap()
    };
    let e = refused(run(&cluster("node02"), None));
    assert!(e.contains("not inside a SLURM allocation"), "{e}");
    let e = refused(run(&cluster("node07"), Some("node[01-02]")));
    assert!(
        e.contains("'node07' is not a node of this SLURM allocation (node01, node02)"),
        "{e}"
    );
    common::ok(run(&cluster("node02"), Some("node[01-02]")));
    assert_same_metrics(&local, &store, "net");

    let log = std::fs::read_to_string(dir.path().join("srun.log")).unwrap();
    let launches: Vec<&str> = log.lines().collect();
    assert_eq!(launches.len(), 3, "{log}");
    for (role, node) in [
        ("actor_train", "node01"),
        ("actor_infer", "node01"),
        ("reference", "node02"),
    ] {
        let line = launches
            .iter()
            .find(|l| l.contains(&format!(" worker {role} ")))
            .unwrap_or_else(|| panic!("{role}: {log}"));
        assert!(
            line.starts_with(&format!("{node} {} ", dir.path().display())),
            "{line}"
        );
        assert!(
            line.contains("--connect 127.0.0.1:") && line.ends_with("--secret-stdin --mirror"),
            "{line}"
        );
    }
    let secrets = std::fs::read_to_string(dir.path().join("srun-secrets")).unwrap();
    let secrets: Vec<&str> = secrets.lines().collect();
    assert_eq!(secrets.len(), 3, "{secrets:?}");
    assert!(secrets.iter().all(|s| *s == secrets[0] && s.len() == 64));
    assert!(!log.contains(secrets[0]), "{log}");
    for e in of_kind(&run_events(&store, "net"), "worker_started") {
        let m = e["message"].as_str().unwrap();
        assert!(m.contains("started by srun on node0"), "{m}");
    }
}

/// Workers on nodes that do not see the head's files (`launcher: ssh` without `shared_dir`)
/// each keep a mirror of their role's host area, which the head keeps up to date over a second
/// proven connection: they compute exactly what local workers compute, the run's metrics say
/// what each mirror moved, checkpoints written by actor_train's worker reach the head's output
/// directory, a run killed mid-way resumes through the mirror (the checkpoint's optimizer state
/// goes to the worker that way), and no mirror is left on the node.
#[test]
fn workers_without_the_heads_files_mirror_their_host_areas() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, _) = fake_ssh(dir.path());
    std::fs::create_dir(dir.path().join("shared")).unwrap();
    let rest = format!("{RL}checkpoint: {{ every: 2 }}\n").replace("steps: 6", "steps: 8");
    let local = run_quiet(dir.path(), "local", &rest, &WORKERS);
    let cluster = format!(
        "cluster={{launcher: ssh, listen: 127.0.0.1, hosts: [alpha, beta], role_hosts: {{reference: beta}}, ssh: [{}], remote_dir: {}}}",
        fake.display(),
        dir.path().display()
    );
    let mut overrides = WORKERS.to_vec();
    overrides.push(&cluster);
    let mirrors = || -> std::collections::BTreeSet<std::ffi::OsString> {
        std::fs::read_dir("/dev/shm")
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name())
                    .filter(|n| n.to_string_lossy().starts_with("roll-tui-mirror-"))
                    .collect()
            })
            .unwrap_or_default()
    };
    let before = mirrors();
    let mirrored = run_quiet(dir.path(), "mirrored", &rest, &overrides);
    assert_same_metrics(&local, &mirrored, "net");
    for e in of_kind(&run_events(&mirrored, "net"), "worker_started") {
        let m = e["message"].as_str().unwrap();
        assert!(m.ends_with(", mirroring its host area"), "{m}");
    }
    // actor_infer's mirror got its model (weights, config, tokenizer) and a weight sync each
    // step; each of the three workers' mirrors moved something, at a measured rate.
    let all: Vec<serde_json::Value> =
        serde_json::from_str(&common::ok(roll(&mirrored, &["metrics", "net", "--json"]))).unwrap();
    let last = |key: &str| {
        all.iter()
            .find(|s| s["key"] == key)
            .and_then(|s| s["values"].as_array()?.last()?.as_f64())
            .unwrap_or_else(|| panic!("no {key}"))
    };
    for worker in ["actor_train-0", "actor_infer-0", "reference-0"] {
        assert!(
            last(&format!("workers/{worker}/mirror_mb")) > 0.0,
            "{worker}"
        );
        assert!(
            last(&format!("workers/{worker}/mirror_gb_per_s")) > 0.0,
            "{worker}"
        );
        // The heartbeat's round trip over loopback: above nothing, far below a second.
        let rtt = last(&format!("workers/{worker}/rtt_ms"));
        assert!(rtt > 0.0 && rtt < 1000.0, "{worker}: {rtt}");
    }
    // The weights alone, synced 8 times, are more than 8 copies of the tiny model's f32 weights.
    let weights_mb = std::fs::metadata(
        dir.path()
            .join("mirrored/checkpoints/rl-step8/model.safetensors"),
    )
    .unwrap()
    .len() as f64
        / 1e6;
    assert!(last("workers/actor_infer-0/mirror_mb") > 8.0 * weights_mb);
    // The optimizer state of every checkpoint came back from the worker's mirror.
    for step in [2, 4, 6, 8] {
        let moments = dir.path().join(format!(
            "mirrored/checkpoints/rl-step{step}/optimizer.safetensors"
        ));
        assert!(moments.is_file(), "{}", moments.display());
    }
    assert_eq!(mirrors(), before, "a mirror is left in /dev/shm");

    let (resumed_store, resumed) =
        common::killed_and_resumed(dir.path(), "net", &rest, &overrides, "rl      5/");
    assert!(
        resumed.contains("resumed run 'net' from rl step"),
        "{resumed}"
    );
    assert_same_metrics(&local, &resumed_store, "net");
    assert_eq!(mirrors(), before, "a mirror is left in /dev/shm");
}
