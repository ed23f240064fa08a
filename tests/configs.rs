//! The shipped configs: every run config in `configs/` and `experiments/` loads and validates; the
//! quickstart, now made of fragments, resolves to exactly the config it was when written inline
//! (same values, same hash, so its checkpoints and numbers are unchanged); and a worker fragment
//! included on top changes only what it sets.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

use std::path::{Path, PathBuf};

use roll::config::load::from_yaml_str;
use roll::config::{PlacementMode, RunConfig, is_runnable};

/// `experiments/quickstart.yaml` as it was before it included `configs/` fragments.
const INLINE_QUICKSTART: &str = include_str!("fixtures/quickstart_inline.yaml");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let p = entry.path();
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "yaml") {
            out.push(p);
        }
    }
}

#[test]
fn every_shipped_run_config_loads_and_fragments_are_not_runnable() {
    let mut files = vec![];
    yaml_files(&root().join("configs"), &mut files);
    yaml_files(&root().join("experiments"), &mut files);
    let (runnable, fragments): (Vec<_>, Vec<_>) = files.iter().partition(|p| is_runnable(p));
    assert!(!runnable.is_empty() && fragments.len() >= 4, "{files:?}");
    for path in runnable {
        let cfg = RunConfig::load(path, &[]).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if path.parent().is_some_and(|d| d.ends_with("experiments")) {
            // `roll-tui samples quickstart` works because the run is named as its file.
            assert_eq!(
                Some(cfg.name.as_str()),
                path.file_stem().and_then(|s| s.to_str())
            );
            // A quickstart killed mid-stage can be resumed: it saves at least every minute.
            let c = &cfg.checkpoint;
            assert!(
                c.every > 0 || (c.every_minutes > 0.0 && c.every_minutes <= 1.0),
                "{}: checkpoint {c:?}",
                path.display()
            );
        }
    }
}

#[test]
fn the_quickstart_made_of_fragments_is_the_inline_quickstart() {
    let merged = RunConfig::load(&root().join("experiments/quickstart.yaml"), &[]).unwrap();
    let inline: RunConfig = from_yaml_str(INLINE_QUICKSTART, "inline").unwrap();
    assert_eq!(merged, inline);
    assert_eq!(merged.hash(), inline.hash());
}

#[test]
fn an_included_worker_fragment_changes_only_what_it_sets() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("run.yaml");
    let configs = root().join("configs");
    let text = format!(
        "include:\n  - {}\n  - {}\n  - {}\nname: q\nseed: 7\nrl: {{ steps: 1, prompts_per_step: 2, group_size: 2 }}\n",
        configs.join("models/tiny-qwen2.yaml").display(),
        configs.join("data/add-and-reverse.yaml").display(),
        configs.join("workers/processes.yaml").display(),
    );
    std::fs::write(&cfg, text).unwrap();
    let with = RunConfig::load(&cfg, &[]).unwrap();
    assert_eq!(with.workers.actor_train.mode, PlacementMode::Process);
    assert_eq!(with.workers.reward.num_workers, 2);
    let without = RunConfig::load(&root().join("experiments/quickstart.yaml"), &[]).unwrap();
    assert_eq!(without.workers.actor_train.mode, PlacementMode::InProcess);
    assert_eq!(with.model, without.model);
    assert_eq!(with.data, without.data);
}

#[test]
fn a_dataset_path_is_relative_to_its_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("exp");
    std::fs::create_dir_all(&sub).unwrap();
    let cfg = sub.join("run.yaml");
    std::fs::write(
        &cfg,
        "name: rel\nmodel:\n  init: { arch: qwen2, hidden: 32, layers: 1, heads: 2, kv_heads: 1, \
         intermediate: 64, chars: \"0123456789+=\" }\ndata:\n  domains:\n    - { name: d, path: \
         data/d.jsonl, reward: math_rule }\n    - { name: e, path: /abs/e.jsonl, reward: math_rule }\n\
         rl: { steps: 1, prompts_per_step: 2, group_size: 2 }\noutput_dir: out\n",
    )
    .unwrap();
    let loaded = RunConfig::load(&cfg, &[]).unwrap();
    let paths: Vec<_> = loaded.data.domains.iter().map(|d| d.path.clone()).collect();
    assert_eq!(
        paths,
        [
            Some(sub.join("data/d.jsonl")),
            Some(PathBuf::from("/abs/e.jsonl"))
        ]
    );
    // Where results go stays relative to the working directory.
    assert_eq!(loaded.output_dir(), PathBuf::from("out"));
}

#[test]
fn a_fragments_dataset_path_is_relative_to_the_fragment() {
    // exp/run.yaml includes ../shared/data.yaml, whose `data/d.jsonl` means shared/data/d.jsonl
    // whichever config includes it; the run file's own domain stays relative to exp/.
    let dir = tempfile::tempdir().unwrap();
    let (exp, shared) = (dir.path().join("exp"), dir.path().join("shared"));
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::create_dir_all(&shared).unwrap();
    std::fs::write(
        shared.join("data.yaml"),
        "data:\n  domains:\n    - { name: d, path: data/d.jsonl, reward: math_rule }\n",
    )
    .unwrap();
    let model = "model:\n  init: { arch: qwen2, hidden: 32, layers: 1, heads: 2, kv_heads: 1, \
                 intermediate: 64, chars: \"0123456789+=\" }\n\
                 rl: { steps: 1, prompts_per_step: 2, group_size: 2 }\n";
    let cfg = exp.join("run.yaml");
    std::fs::write(
        &cfg,
        format!("include: [../shared/data.yaml]\nname: frag\n{model}"),
    )
    .unwrap();
    std::fs::create_dir_all(shared.join("data")).unwrap();
    std::fs::write(shared.join("data/d.jsonl"), "").unwrap();
    let loaded = RunConfig::load(&cfg, &[]).unwrap();
    let path = loaded.data.domains[0].path.clone().unwrap();
    // `exp/../shared/data/d.jsonl` (absolute keeps the `..`): the same file.
    assert_eq!(
        std::fs::canonicalize(&path).map_err(|e| format!("{}: {e}", path.display())),
        Ok(std::fs::canonicalize(shared.join("data/d.jsonl")).unwrap())
    );
    // The including file's own domains are still relative to it.
    std::fs::write(
        &cfg,
        format!(
            "include: [../shared/data.yaml]\nname: frag\n{model}data:\n  domains:\n    \
             - {{ name: e, path: mine.jsonl, reward: math_rule }}\n"
        ),
    )
    .unwrap();
    let loaded = RunConfig::load(&cfg, &[]).unwrap();
    assert_eq!(loaded.data.domains[0].path, Some(exp.join("mine.jsonl")));
}
