//! An agentic run through the binary: no dataset, no SFT, an untrained tiny model acting on a
//! 1x3 lake for one step; `roll-tui trajectories` prints its episodes from the store, and a model
//! whose tokenizer cannot write the observations is refused with a clear error; a run killed with
//! SIGKILL leaves no external env program or env worker behind; env workers give the same metrics
//! as in-process envs and survive a kill of one of them.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use common::{ok, refused, roll};
use serde_json::Value;

fn config(dir: &std::path::Path, name: &str, chars: &str) -> std::path::PathBuf {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &path,
        format!(
            "name: {name}\nseed: 3\noutput_dir: {}\n\
             model: {{ init: {{ arch: qwen2, hidden: 16, layers: 1, heads: 2, kv_heads: 1, intermediate: 32, chars: \"{chars}\", max_positions: 128 }} }}\n\
             rl:\n  steps: 1\n  prompts_per_step: 2\n  group_size: 2\n  sampling: {{ max_new_tokens: 4 }}\n\
             \x20 env: {{ name: frozen_lake, tag: tiny, params: {{ map: SFG, legend: false }}, max_turns: 3, action_pattern: '(\\w+)' }}\n",
            dir.join(name).display()
        ),
    )
    .unwrap();
    path
}

#[test]
fn an_agentic_run_records_episodes_that_the_trajectories_command_prints() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.db");
    let cfg = config(dir.path(), "lake", "SFGPWXLeftRighDowUp\\n");
    ok(roll(&store, &["run", "--quiet", cfg.to_str().unwrap()]));
    let json = ok(roll(&store, &["trajectories", "lake", "--json"]));
    let episodes: Vec<Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(episodes.len(), 4, "{json}");
    assert_eq!(episodes[0]["env_seed"], episodes[1]["env_seed"]);
    assert_ne!(episodes[0]["env_seed"], episodes[2]["env_seed"]);
    for e in &episodes {
        let turns = e["turns"].as_array().unwrap();
        assert!((1..=3).contains(&turns.len()), "{e}");
        assert_eq!(turns[0]["observation"], "PFG");
        assert!(turns[0]["info"]["state_hash"].is_u64());
    }
    // Every stored episode is rebuilt from its seed and outputs, observation by observation.
    let replayed = ok(roll(&store, &["env", "replay", "lake"]));
    assert!(
        replayed.contains("4 of 4 episodes reproduce every stored observation"),
        "{replayed}"
    );
    let err = refused(roll(&store, &["env", "replay", "lake", "--group", "9"]));
    assert!(err.contains("no stored episodes matching"), "{err}");
    // A step past the last one: refused, saying where the episodes are.
    let err = refused(roll(&store, &["trajectories", "lake", "--group", "99"]));
    assert!(err.contains("no group 99: its groups are 0 to 1"), "{err}");
    let err = refused(roll(&store, &["trajectories", "lake", "--step", "9"]));
    assert!(err.contains("its episodes are at steps 1 to 1"), "{err}");
    let text = ok(roll(&store, &["trajectories", "lake", "--group", "1"]));
    assert!(
        text.contains("group 1 episode 0") && text.contains("group 1 episode 1"),
        "{text}"
    );
    assert!(!text.contains("group 0 "), "{text}");
    assert!(text.contains("turn 1: observation\n      PFG\n"), "{text}");
    // An invalid output's reason, as the JSON holds it, is in the text too.
    let reasons: Vec<String> = episodes
        .iter()
        .flat_map(|e| e["turns"].as_array().unwrap().clone())
        .filter_map(|t| t["info"]["invalid_reason"].as_str().map(str::to_string))
        .collect();
    assert!(
        !reasons.is_empty(),
        "a random tiny model's outputs include invalid ones"
    );
    let all = ok(roll(&store, &["trajectories", "lake", "--limit", "0"]));
    assert!(all.contains(&format!(": {})", reasons[0])), "{all}");
    // Text is paged (10 episodes unless --limit says), and says what it left out.
    let out = roll(&store, &["trajectories", "lake", "--limit", "1"]);
    let hint = String::from_utf8_lossy(&out.stderr).to_string();
    let text = ok(out);
    assert_eq!(
        text.lines().filter(|l| l.starts_with("[rl step")).count(),
        1
    );
    assert!(
        hint.contains("the first 1 of 4 matching episodes"),
        "{hint}"
    );
    // The step's metrics are in the store under the env's tag.
    let metrics = ok(roll(&store, &["metrics", "lake", "--key", "env/tiny/*"]));
    assert!(metrics.contains("env/tiny/success"), "{metrics}");

    // Step-wise GiGPO on the same run: one training row per turn, still one record per episode.
    let step = dir.path().join("step.db");
    ok(roll(
        &step,
        &[
            "run",
            "--quiet",
            cfg.to_str().unwrap(),
            "rl.adv_estimator=gigpo",
            "rl.env.mode=step",
            "rl.std_normalize=false",
            &format!("output_dir={}", dir.path().join("step").display()),
        ],
    ));
    let samples: Value =
        serde_json::from_str(&ok(roll(&step, &["samples", "lake", "--json"]))).unwrap();
    assert_eq!(samples.as_array().unwrap().len(), 4, "{samples}");
    let adv = ok(roll(&step, &["metrics", "lake", "--key", "adv/mean"]));
    assert!(adv.contains("adv/mean"), "{adv}");

    // A model that cannot write 'P' cannot read the lake: refused, naming what and where.
    let bad = config(dir.path(), "blind", "SFGLeftRighDowUp\\n");
    let err = refused(roll(&store, &["run", "--quiet", bad.to_str().unwrap()]));
    assert!(err.contains("rl.env") && err.contains("'P'"), "{err}");
}

/// Pids of running processes whose command line contains `marker` (zombies excluded).
fn running_with(marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
                s.rsplit_once(')')
                    .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
            });
            String::from_utf8_lossy(&cmdline).contains(marker) && !zombie
        })
        .collect()
}

#[test]
fn killing_the_trainer_leaves_no_env_program_behind() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    // The example ignores its arguments: this one only marks its processes for /proc.
    let marker = dir.path().join("env-program-marker");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/envs/external/guess_number.py");
    let path = dir.path().join("guess.yaml");
    std::fs::write(
        &path,
        format!(
            "name: guess\nseed: 3\noutput_dir: {}\n\
             model: {{ init: {{ arch: qwen2, hidden: 16, layers: 1, heads: 2, kv_heads: 1, intermediate: 32, chars: \"abcdefghijklmnopqrstuvwxyzGY0123456789 .;!\\n\", max_positions: 512 }} }}\n\
             rl:\n  steps: 1000\n  prompts_per_step: 2\n  group_size: 2\n  sampling: {{ max_new_tokens: 3 }}\n\
             \x20 env: {{ name: external, max_turns: 3, action_pattern: '(?s)(.*)', params: {{ command: 'python3 {script} {}', step_delay: 0.05 }} }}\n",
            dir.path().join("out").display(),
            marker.display()
        ),
    )
    .unwrap();
    let mut trainer = common::bin()
        .args(["--store", dir.path().join("s.db").to_str().unwrap()])
        .args(["run", "--quiet", path.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let marker = marker.to_string_lossy().into_owned();
    let deadline = Instant::now() + Duration::from_secs(120);
    while running_with(&marker).len() < 4 {
        assert!(
            trainer.try_wait().unwrap().is_none(),
            "the run ended before its env programs started"
        );
        assert!(Instant::now() < deadline, "no env programs after 120 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    trainer.kill().unwrap(); // SIGKILL
    trainer.wait().unwrap();
    // Their stdin closes with the trainer; the protocol has them exit then.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !running_with(&marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "env programs outlived the trainer by 10 s: {:?}",
            running_with(&marker)
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // The same for built-in envs served by worker processes.
    let cfg = config(dir.path(), "lake", "SFGPWXLeftRighDowUp\\n");
    let mut trainer = common::bin()
        .args([
            "--store",
            dir.path().join("w.db").to_str().unwrap(),
            "run",
            "--quiet",
        ])
        .arg(&cfg)
        .args([
            "rl.steps=1000",
            "workers.env.mode=process",
            "workers.env.num_workers=2",
        ])
        .arg(format!("output_dir={}", dir.path().join("w").display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let servers = loop {
        let servers = env_servers_of(trainer.id());
        if servers.len() == 2 {
            break servers;
        }
        assert!(trainer.try_wait().unwrap().is_none(), "the run ended first");
        assert!(Instant::now() < deadline, "no env workers after 120 s");
        std::thread::sleep(Duration::from_millis(5));
    };
    trainer.kill().unwrap(); // SIGKILL
    trainer.wait().unwrap();
    let running = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while servers.iter().any(running) {
        assert!(
            Instant::now() < deadline,
            "env workers outlived the trainer by 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Pids of the `env serve` processes whose parent is `parent`.
fn env_servers_of(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // stat: "pid (comm) state ppid …"
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            String::from_utf8_lossy(&cmdline).contains("\0env\0serve\0") && ppid == Some(parent)
        })
        .collect()
}

#[test]
fn envs_in_worker_processes_give_the_same_metrics_and_survive_a_kill_9() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "lake", "SFGPWXLeftRighDowUp\\n");
    let cfg = cfg.to_str().unwrap();
    let (a, b) = (dir.path().join("in.db"), dir.path().join("proc.db"));
    let steps = "rl.steps=3";
    ok(roll(&a, &["run", "--quiet", cfg, steps]));
    let out = |name: &str| format!("output_dir={}", dir.path().join(name).display());
    ok(roll(
        &b,
        &[
            "run",
            "--quiet",
            cfg,
            steps,
            "workers.env.mode=process",
            "workers.env.num_workers=2",
            &out("proc"),
        ],
    ));
    common::assert_same_metrics(&a, &b, "lake");

    // A longer run: one of the two env workers is killed while the run goes on. The episode
    // that meets it first is discarded, counted and played again; the worker is replaced, and its
    // other instances replay their episodes into the new one; the run finishes.
    let store = dir.path().join("kill.db");
    let mut trainer = common::bin()
        .args(["--store", store.to_str().unwrap(), "run", cfg])
        .args([
            "rl.steps=40",
            "workers.env.mode=process",
            "workers.env.num_workers=2",
        ])
        .arg(out("kill"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    // Two workers host the four episodes' environments.
    let victim = loop {
        let servers = env_servers_of(trainer.id());
        assert!(
            servers.len() <= 2,
            "{} env processes for 2 workers",
            servers.len()
        );
        if servers.len() == 2 {
            break servers[0];
        }
        assert!(trainer.try_wait().unwrap().is_none(), "the run ended first");
        assert!(Instant::now() < deadline, "no env process after 120 s");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(common::kill_9(victim));
    let finished = trainer.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&finished.stdout);
    let stderr = String::from_utf8_lossy(&finished.stderr);
    assert!(finished.status.success(), "{stderr}");
    let discarded = common::rl_series(&store, "lake", "env/tiny/discarded");
    assert_eq!(discarded.len(), 40);
    assert!(
        discarded.iter().sum::<f64>() >= 1.0,
        "{discarded:?}\n{stdout}"
    );
    assert!(stdout.contains("discarded and played again"), "{stdout}");
}
