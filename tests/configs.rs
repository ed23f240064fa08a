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

/// `configs/examples/qwen2.5-0.5b-instruct-gsm8k.yaml` as its comment says to use it, on a
/// stand-in for the real model (none is downloaded here): a tiny model whose characters cover
/// the text, with Qwen2.5-Instruct's chat template, and GSM8K lines converted by the example's
/// script. One RL step with its evaluations runs, and `roll-tui eval` scores its checkpoint.
#[test]
fn the_real_model_example_runs_on_a_stand_in() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    // GSM8K's own format: a question, and a worked answer with calculator annotations ending
    // in `#### <answer>` (thousands separated by commas).
    let gsm8k = [
        r#"{"question": "Tom has 3 apples and buys 4 more. How many apples does he have?", "answer": "He has 3+4=<<3+4=7>>7 apples.\n#### 7"}"#,
        r#"{"question": "A box holds 12 pens. How many pens are in 2 boxes?", "answer": "2*12=<<2*12=24>>24 pens.\n#### 24"}"#,
        r#"{"question": "Sara read 1,200 pages in 4 days, the same each day. How many a day?", "answer": "1200/4=<<1200/4=300>>300\n#### 1,200"}"#,
    ];
    let script = root().join("configs/examples/gsm8k_to_jsonl.py");
    for (name, lines) in [("train", &gsm8k[..2]), ("test", &gsm8k[2..])] {
        let raw = work.join(format!("{name}.jsonl"));
        std::fs::write(&raw, lines.join("\n") + "\n").unwrap();
        let out = std::process::Command::new("python3")
            .arg(&script)
            .arg(&raw)
            .arg(work.join(format!("data/gsm8k/{name}.jsonl")))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let converted = std::fs::read_to_string(work.join("data/gsm8k/train.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = converted
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows[0]["ground_truth"], "7");
    assert_eq!(
        rows[1]["response"],
        "2*12=24 pens.\nThe answer is \\boxed{24}."
    );
    let test = std::fs::read_to_string(work.join("data/gsm8k/test.jsonl")).unwrap();
    assert!(test.contains(r#""ground_truth": "1200""#), "{test}");
    // The stand-in model, where the config looks for the real one.
    let model = work.join("models/Qwen2.5-0.5B-Instruct");
    let chars: String = (' '..='~').chain(['\n']).collect();
    roll::model::init_model_dir(
        &model,
        &roll::model::InitOptions {
            arch: roll::model::Arch::Qwen2,
            hidden: 16,
            layers: 1,
            heads: 2,
            kv_heads: 1,
            intermediate: 32,
            head_dim: None,
            tie_embeddings: true,
            max_positions: 512,
            rope_theta: 10_000.0,
            chars,
            dtype: "bfloat16".into(),
            seed: 1,
        },
    )
    .unwrap();
    std::fs::copy(
        root().join("tests/fixtures/chat_templates/qwen2.5-instruct.jinja"),
        model.join("chat_template.jinja"),
    )
    .unwrap();
    std::fs::copy(
        root().join("configs/examples/qwen2.5-0.5b-instruct-gsm8k.yaml"),
        work.join("qwen2.5-0.5b-instruct-gsm8k.yaml"),
    )
    .unwrap();
    let roll_tui = |args: &[&str]| {
        let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("roll-tui"))
            .current_dir(work)
            .args(["--store", "runs.db"])
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    let small = [
        "rl.steps=1",
        "rl.prompts_per_step=2",
        "rl.group_size=2",
        "rl.mini_batches=1",
        "rl.micro_batch_size=2",
        "rl.sampling.max_new_tokens=4",
    ];
    let mut args = vec!["run", "qwen2.5-0.5b-instruct-gsm8k.yaml"];
    args.extend(small);
    let out = roll_tui(&args);
    // The baseline before RL and the evaluation after its one step, on the test file's prompt.
    assert!(out.contains("rl      0/1  val pass@1 gsm8k="), "{out}");
    assert!(
        out.contains("rl      1/1") && out.contains("val pass@1 gsm8k="),
        "{out}"
    );
    let out = roll_tui(&["eval", "qwen2.5-0.5b-instruct-gsm8k", "--max-tokens", "4"]);
    assert!(out.contains("gsm8k                  1"), "{out}");
}

#[test]
fn override_mistakes_are_said_in_config_terms() {
    let quickstart = root().join("experiments/quickstart.yaml");
    let err = |overrides: &[&str]| {
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        RunConfig::load(&quickstart, &overrides)
            .unwrap_err()
            .to_string()
    };
    // Not serde's `integer `-1`, expected usize`.
    assert_eq!(
        err(&["rl.steps=-1"]),
        "override 'rl.steps=-1': invalid value -1 for 'rl.steps', expected a whole number, 0 or \
         more"
    );
    // A section an override creates, short of a field it needs: which section, which field.
    let dpo = err(&["dpo.steps=1"]);
    assert!(dpo.contains("lacks 'data' (likely 'dpo')"), "{dpo}");
    // A directory instead of the quickstart's included init: the way to say it.
    let both_models = err(&["model.path=/tmp"]);
    assert!(both_models.contains("add model.init=null"), "{both_models}");
    // Both problems came from the command line, and both say so.
    let both = err(&["rl.steps=0", "sft.steps=0"]);
    assert_eq!(
        both.matches("(set on the command line)").count(),
        2,
        "{both}"
    );
}

/// Every page the WebShop experiment's shop can show fits its tokenizer and its positions: an
/// agentic prompt refuses a character outside `model.init.chars`, and a step-wise prompt is the
/// page alone, which with the longest answer must fit `max_positions` (or the episode is cut).
/// The pages walked: every episode's (40 seeds) from the search page three actions deep, and
/// every product of the shop through a search that lists them all, page by page.
#[test]
fn the_webshop_experiments_model_takes_every_page_its_shop_shows() {
    use roll::env::{Env, make, webshop::catalogue};
    use std::collections::{BTreeSet, HashSet};

    fn walk(env: &dyn Env, depth: usize, seen: &mut HashSet<u64>, pages: &mut Vec<String>) {
        pages.push(env.render_text());
        if depth == 0 || !seen.insert(env.state_hash()) {
            return;
        }
        for action in env.actions() {
            let mut next = env.clone_box();
            if next.step(&action).is_ok_and(|s| !s.done) {
                walk(next.as_ref(), depth - 1, seen, pages);
            }
        }
    }

    let cfg = RunConfig::load(&root().join("experiments/agentic_webshop.yaml"), &[]).unwrap();
    let init = cfg.model.init.as_ref().unwrap();
    let known: HashSet<char> = init.chars.chars().collect();
    let rl = cfg.rl.as_ref().unwrap();
    let shop = rl.env.as_ref().unwrap();
    let mut env = make(&shop.name, &shop.param_pairs()).unwrap();
    let (mut seen, mut pages) = (HashSet::new(), vec![]);
    for seed in 0..40 {
        env.reset(seed).unwrap();
        walk(env.as_ref(), 3, &mut seen, &mut pages);
    }
    // A query of every word of every title lists the whole shop, ten products a page.
    let products = shop.params["products"].as_u64().unwrap() as usize;
    let shelf = catalogue::generate(0, products);
    let words: BTreeSet<&str> = shelf
        .iter()
        .flat_map(|p| p.title.split_whitespace())
        .collect();
    env.reset(0).unwrap();
    let query = words.into_iter().collect::<Vec<_>>().join(" ");
    env.step(&format!("search[{query}]")).unwrap();
    assert!(
        env.render_text()
            .contains(&format!(", {products} products)")),
        "{}",
        env.render_text()
    );
    let (mut listed, mut full) = (1, vec![]);
    loop {
        walk(env.as_ref(), 1, &mut HashSet::new(), &mut full);
        match env.step("click[next >]") {
            Ok(step) if !step.done => listed += 1,
            _ => break,
        }
    }
    assert_eq!(listed, products.div_ceil(10));
    let text = pages.concat() + &full.concat();
    let missing: BTreeSet<char> = text.chars().filter(|c| !known.contains(c)).collect();
    assert!(missing.is_empty(), "not in model.init.chars: {missing:?}");
    // Characters are tokens; the prompt is the page and a newline. A full results page shows its
    // query, which the policy writes in at most `answer - 8` characters (`search[…]`), not the
    // whole vocabulary this search used.
    let answer = shop
        .max_tokens_per_turn
        .unwrap_or(rl.sampling.max_new_tokens);
    let longest_query = answer - "search[]".len();
    let longest = pages
        .iter()
        .map(|p| p.chars().count() + 1)
        .chain(full.iter().map(|p| match p.contains(&query) {
            true => p.chars().count() + 1 - query.chars().count() + longest_query,
            false => p.chars().count() + 1,
        }))
        .max()
        .unwrap();
    assert!(
        longest + answer <= init.max_positions,
        "a {longest}-token page and a {answer}-token answer exceed {} positions",
        init.max_positions
    );
}
