//! Tests of [`super`]: strict YAML loading, error messages and validation. The fixtures are shared
//! with the override tests.

use super::*;
use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Estimator {
    Gae,
    Reinforce,
    Grpo,
    ReinforcePlusPlus,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Algo {
    pub(crate) adv_estimator: Estimator,
    #[serde(default)]
    pub(crate) whiten: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Train {
    pub(crate) learning_rate: f64,
    #[serde(default = "default_batch")]
    pub(crate) batch_size: u32,
    #[serde(default)]
    pub(crate) warmup_steps: Option<u32>,
}

fn default_batch() -> u32 {
    8
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Run {
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) seed: Option<u64>,
    pub(crate) actor_train: Train,
    pub(crate) algo: Algo,
    #[serde(default)]
    pub(crate) domains: Vec<String>,
}

impl Validate for Run {
    fn validate(&self, problems: &mut Vec<String>) {
        if self.actor_train.learning_rate <= 0.0 || self.actor_train.learning_rate.is_nan() {
            problems.push(format!(
                "actor_train.learning_rate must be > 0, got '{}'",
                self.actor_train.learning_rate
            ));
        }
        if self.actor_train.batch_size == 0 {
            problems.push("actor_train.batch_size must be > 0, got '0'".to_string());
        }
        if self.name.is_empty() {
            problems.push("name must not be empty".to_string());
        }
    }
}

pub(crate) const GOOD: &str = "\
# a run
name: tiny
actor_train:
  learning_rate: 0.001
algo:
  adv_estimator: grpo
domains: [math, code]
";

pub(crate) fn err_text<T: std::fmt::Debug>(r: Result<T, ConfigError>) -> String {
    r.expect_err("expected an error").to_string()
}

#[test]
fn good_config_with_defaults() {
    let run: Run = from_yaml_str(GOOD, "good.yaml").unwrap();
    assert_eq!(run.name, "tiny");
    assert_eq!(run.seed, None);
    assert_eq!(run.actor_train.batch_size, 8);
    assert_eq!(run.actor_train.warmup_steps, None);
    assert_eq!(run.algo.adv_estimator, Estimator::Grpo);
    assert!(!run.algo.whiten);
    assert_eq!(run.domains, vec!["math", "code"]);
}

#[test]
fn unknown_nested_key_names_line_parent_and_suggestion() {
    let text = GOOD.replace(
        "  learning_rate: 0.001",
        "  learning_rate: 0.001\n  lerning_rate: 3",
    );
    let msg = err_text(from_yaml_str::<Run>(&text, "configs/x.yaml"));
    assert_eq!(
        msg,
        "config 'configs/x.yaml' line 5: unknown field 'lerning_rate' in 'actor_train' \
         (did you mean 'learning_rate'?)"
    );
}

#[test]
fn unknown_top_level_key() {
    let text = format!("{GOOD}sede: 3\n");
    let msg = err_text(from_yaml_str::<Run>(&text, "x.yaml"));
    assert!(
        msg.starts_with("config 'x.yaml' line 8: unknown field 'sede'"),
        "{msg}"
    );
    assert!(msg.contains("(did you mean 'seed'?)"), "{msg}");
}

#[test]
fn bad_enum_value_lists_choices_and_suggests() {
    let text = GOOD.replace("adv_estimator: grpo", "adv_estimator: gpro");
    let msg = err_text(from_yaml_str::<Run>(&text, "x.yaml"));
    assert!(
        msg.starts_with("config 'x.yaml' line 6: invalid value 'gpro' for 'algo.adv_estimator'"),
        "{msg}"
    );
    assert!(
        msg.contains("expected one of: gae, reinforce, grpo, reinforce_plus_plus"),
        "{msg}"
    );
    assert!(msg.contains("did you mean 'grpo'?"), "{msg}");
}

#[test]
fn wrong_type_and_missing_field() {
    let text = GOOD.replace("learning_rate: 0.001", "learning_rate: fast");
    let msg = err_text(from_yaml_str::<Run>(&text, "x.yaml"));
    assert!(msg.starts_with("config 'x.yaml' line 4: "), "{msg}");
    assert!(msg.contains("'actor_train.learning_rate'"), "{msg}");
    assert!(msg.contains("fast"), "{msg}");

    let text = GOOD.replace("name: tiny\n", "");
    let msg = err_text(from_yaml_str::<Run>(&text, "x.yaml"));
    assert_eq!(
        msg,
        "config 'x.yaml' line 6: missing field 'name' at the top level"
    );
}

#[test]
fn scalar_errors_quote_the_value() {
    let cases = [
        (
            "learning_rate: 0.001",
            "learning_rate: 0.001\n  batch_size: -3",
            "line 5: invalid value '-3' for 'actor_train.batch_size', expected a whole number \
             from 0 to 4294967295",
        ),
        (
            "adv_estimator: grpo",
            "adv_estimator: grpo\n  whiten: yes  # typo",
            "line 7: invalid value 'yes' for 'algo.whiten', expected true or false",
        ),
        (
            "name: tiny",
            "name: ~",
            "line 2: invalid value null for 'name', expected a string",
        ),
        (
            "algo:\n  adv_estimator: grpo",
            "algo:\n  whiten: false",
            "line 6: missing field 'adv_estimator' in 'algo'",
        ),
        (
            "actor_train:\n  learning_rate: 0.001",
            "actor_train: 3",
            "line 3: expected mapping start (at 'actor_train', found '3')",
        ),
    ];
    for (from, to, want) in cases {
        let text = GOOD.replace(from, to);
        let msg = err_text(from_yaml_str::<Run>(&text, "x.yaml"));
        assert_eq!(msg, format!("config 'x.yaml' {want}"));
    }
}

#[test]
fn yaml_syntax_error_names_file_and_line() {
    let msg = err_text(from_yaml_str::<Run>("name: [tiny\nalgo: {", "broken.yaml"));
    assert!(msg.starts_with("config 'broken.yaml'"), "{msg}");
}

#[test]
fn duplicate_key_is_an_error() {
    let text = format!("{GOOD}name: again\n");
    let msg = err_text(from_yaml_str::<Run>(&text, "x.yaml"));
    assert!(msg.starts_with("config 'x.yaml' line 8:"), "{msg}");
}

#[test]
fn unreadable_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.yaml");
    let msg = err_text(load_yaml::<Run>(&path, &[]));
    assert!(
        msg.starts_with(&format!("config '{}': cannot read: ", path.display())),
        "{msg}"
    );
}

#[test]
fn validation_reports_every_problem() {
    let text = GOOD
        .replace("learning_rate: 0.001", "learning_rate: -1\n  batch_size: 0")
        .replace("name: tiny", "name: ''");
    let run: Run = from_yaml_str(&text, "x.yaml").unwrap();
    let msg = err_text(validated(run, "x.yaml"));
    assert_eq!(
        msg,
        "config 'x.yaml' is invalid:\n  \
         - actor_train.learning_rate must be > 0, got '-1'\n  \
         - actor_train.batch_size must be > 0, got '0'\n  \
         - name must not be empty"
    );
    let ok: Run = from_yaml_str(GOOD, "x.yaml").unwrap();
    assert!(validated(ok, "x.yaml").is_ok());
    // A problem with a key an override set is the command line's, the others the file's.
    let run: Run = from_yaml_str(&text, "x.yaml").unwrap();
    let overrides = [
        "name=".to_string(),
        "actor_train.learning_rat=2".to_string(),
    ];
    let msg = err_text(validated_with(run, Path::new("x.yaml"), &overrides));
    assert_eq!(
        msg,
        "config 'x.yaml' is invalid:\n  \
         - actor_train.learning_rate must be > 0, got '-1'\n  \
         - actor_train.batch_size must be > 0, got '0'\n  \
         - name must not be empty (set on the command line)"
    );
}

#[test]
fn context_heuristic_handles_lists() {
    let text = "a:\n  items:\n    - name: x\n      sub:\n        k: 1\n";
    assert_eq!(
        yaml_context(text, 5),
        (
            Some("k".to_string()),
            vec!["a".into(), "items".into(), "sub".into()]
        )
    );
    assert_eq!(
        yaml_context(text, 3),
        (Some("name".to_string()), vec!["a".into(), "items".into()])
    );
}
