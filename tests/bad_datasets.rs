//! Datasets a run must refuse quickly and clearly, naming file, line and size: a line too long to
//! be an example (read without holding it), a prompt longer than the model can take (refused before
//! tokenizing, which on 50 MB took minutes and 20 GB), and a prompt of more tokens than positions.
//! Each runs through the real binary.

#![allow(clippy::unwrap_used)] // tests fail loudly on purpose

mod common;

use common::{bin, refused};

/// A run of a one-domain config over `data`; its stderr (it must fail).
fn run_on(data: &str) -> String {
    run_with(data, "")
}

/// [`run_on`] with more of the domain's settings (`, val_path: …`).
fn run_with(data: &str, domain_extra: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.jsonl");
    std::fs::write(&path, data).unwrap();
    let cfg = dir.path().join("bad.yaml");
    std::fs::write(
        &cfg,
        format!(
            "name: bad\nmodel:\n  init: {{ arch: qwen2, hidden: 32, layers: 1, heads: 2, kv_heads: 1, intermediate: 64, chars: \"0123456789+=ab\", max_positions: 64 }}\n\
             rl: {{ steps: 1, prompts_per_step: 1, group_size: 2 }}\n\
             data:\n  domains:\n    - {{ name: d, path: {}, reward: math_rule{domain_extra} }}\noutput_dir: {}\n",
            path.display(),
            dir.path().join("out").display()
        ),
    )
    .unwrap();
    let out = bin()
        .arg("--store")
        .arg(dir.path().join("roll.db"))
        .args(["run", "--quiet"])
        .arg(&cfg)
        .output()
        .unwrap();
    refused(out)
}

const GOOD: &str = "{\"prompt\": \"1+2=\", \"ground_truth\": \"3\"}\n";

#[test]
fn a_held_out_file_that_repeats_every_training_prompt_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let val = dir.path().join("val.jsonl");
    std::fs::write(&val, GOOD).unwrap();
    let err = run_with(GOOD, &format!(", val_path: {}", val.display()));
    assert!(
        err.contains("domain 'd': every training prompt is also in val_path")
            && err.contains("nothing is left to train on"),
        "{err}"
    );
}

#[test]
fn a_line_too_long_for_an_example_is_refused_with_its_length() {
    // 20 MB on line 2, without a newline until the end.
    let huge = format!(
        "{GOOD}{{\"prompt\": \"{}\", \"ground_truth\": \"1\"}}\n{GOOD}",
        "1".repeat(20 << 20)
    );
    let err = run_on(&huge);
    let length = huge.lines().nth(1).unwrap().len();
    assert!(
        err.contains(&format!(
            "data.jsonl' line 2: the line is {length} bytes, more than the 8 MiB"
        )),
        "{err}"
    );
}

#[test]
fn a_prompt_longer_than_the_model_is_refused_before_tokenizing() {
    // 1 MB fits a line but not a 64-position model: 64 x 64 bytes is the most tried.
    let long = format!(
        "{GOOD}{{\"prompt\": \"{}\", \"ground_truth\": \"1\"}}\n",
        "1+".repeat(500_000)
    );
    let err = run_on(&long);
    assert!(
        err.contains(
            "data.jsonl' line 2): the prompt is 1000000 bytes; the model holds 64 positions"
        ),
        "{err}"
    );
    // Short enough to tokenize, but 100 tokens for 64 positions.
    let err = run_on(&format!(
        "{{\"prompt\": \"{}\", \"ground_truth\": \"1\"}}\n",
        "1".repeat(100)
    ));
    assert!(
        err.contains("data.jsonl' line 1): the prompt is 100 tokens; the model holds 64 positions"),
        "{err}"
    );
}

#[test]
fn a_run_that_failed_at_set_up_does_not_take_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.jsonl");
    std::fs::write(
        &data,
        "{\"prompt\": \"1+2=\", \"ground_truth\": \"3\"}\nnot json\n",
    )
    .unwrap();
    let cfg = dir.path().join("again.yaml");
    std::fs::write(
        &cfg,
        format!(
            "name: again\nmodel:\n  init: {{ arch: qwen2, hidden: 32, layers: 1, heads: 2, kv_heads: 1, intermediate: 64, chars: \"0123456789+=\" }}\n\
             rl: {{ steps: 1, prompts_per_step: 1, group_size: 2 }}\n\
             data:\n  domains:\n    - {{ name: d, path: {}, reward: math_rule }}\noutput_dir: {}\n",
            data.display(),
            dir.path().join("out").display()
        ),
    )
    .unwrap();
    let store = dir.path().join("roll.db");
    let run = || {
        bin()
            .arg("--store")
            .arg(&store)
            .args(["run", "--quiet"])
            .arg(&cfg)
            .output()
            .unwrap()
    };
    let err = refused(run());
    assert!(err.contains("data.jsonl' line 2: invalid JSON"), "{err}");
    // Fixed, the same name runs again without --overwrite: the failed set-up left nothing to keep.
    std::fs::write(&data, "{\"prompt\": \"1+2=\", \"ground_truth\": \"3\"}\n").unwrap();
    let out = run();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A run that did start keeps its name: a rerun still needs --overwrite (or resume).
    let err = refused(run());
    assert!(err.contains("run 'again' already exists"), "{err}");
}
