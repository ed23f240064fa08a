//! Which series go into which chart: the chart table and the stage rule. No drawing, no IO.
//!
//! Charts, in output order (metric keys per docs/DESIGN.md §Metric keys):
//! - `reward`: `reward/<domain>/mean` for every domain;
//! - `accuracy`: `score/<domain>/accuracy` for every domain;
//! - `validation`: `rl.eval`'s `val/<domain>/pass@k` and `val/<domain>/mean@k`;
//! - `success`, `turns`, `invalid_actions`: an agentic run's `env/<tag>/success`, `steps` and
//!   `invalid_action_frac`, with its evaluation's `val/env/<tag>/…` beside them;
//! - `loss`: `actor/pg_loss`, `critic/value_loss`, `sft/loss`, and DPO's `loss` and `eval/loss`;
//! - `preference_accuracy`: DPO's `rewards/accuracies`, `eval/rewards/accuracies`, and per domain
//!   `rewards/<domain>/accuracies`, `eval/rewards/<domain>/accuracies`;
//! - `implicit_reward`: DPO's `rewards/chosen|rejected|margins`, `eval/rewards/margins`;
//! - `logps`: DPO's `logps/chosen`, `logps/rejected`;
//! - `kl`: `actor/kl`; `entropy`: `actor/entropy`;
//! - `response_length`: `response_length/mean`, `response_length/max`;
//! - `grad_norm`: `actor/grad_norm`, `critic/grad_norm`;
//! - `staleness`: `async/staleness_mean`, `async/staleness_max`;
//! - `throughput`: `system/tokens_per_s`;
//! - `timings`: every `time/*` key.
//!
//! Stage rule: every stage counts steps from 1, so one chart never mixes stages. The series of the
//! run's last stage (in the stage list's order: `rl` after `dpo` after `sft`) go into the file named
//! after the chart (`loss`), every other stage's into a file prefixed with the stage (`sft_loss`,
//! `sft_timings`). Lines keep the order of the input. A series without a single
//! finite value draws nothing and is left out; a chart left with no series is skipped.

use crate::metrics::Series;

/// One chart to draw: a file name without extension, a title and its lines.
#[derive(Debug)]
pub(crate) struct ChartPlan<'a> {
    pub file_stem: String,
    /// The chart and stage, e.g. `reward (rl)`; the drawing adds the run name.
    pub title: String,
    pub y_label: &'static str,
    pub lines: Vec<&'a Series>,
}

struct ChartKind {
    name: &'static str,
    y_label: &'static str,
    matches: fn(&str) -> bool,
}

const KINDS: &[ChartKind] = &[
    ChartKind {
        name: "reward",
        y_label: "mean reward",
        matches: |key| is_domain_key(key, "reward", "mean"),
    },
    ChartKind {
        name: "accuracy",
        y_label: "accuracy",
        matches: |key| is_domain_key(key, "score", "accuracy"),
    },
    ChartKind {
        name: "validation",
        y_label: "held-out score",
        matches: |key| {
            let parts: Vec<&str> = key.split('/').collect();
            matches!(parts.as_slice(), ["val", domain, k]
                if *domain != "env" && (k.starts_with("pass@") || k.starts_with("mean@")))
        },
    },
    ChartKind {
        name: "success",
        y_label: "success rate",
        matches: |key| is_env_key(key, "success"),
    },
    ChartKind {
        name: "turns",
        y_label: "turns per episode",
        matches: |key| is_env_key(key, "steps"),
    },
    ChartKind {
        name: "invalid_actions",
        y_label: "share of turns",
        matches: |key| is_env_key(key, "invalid_action_frac"),
    },
    ChartKind {
        name: "loss",
        y_label: "loss",
        matches: |key| {
            matches!(
                key,
                "actor/pg_loss"
                    | "critic/value_loss"
                    | "sft/loss"
                    | "distill/loss"
                    | "distill/kd"
                    | "loss"
                    | "eval/loss"
            )
        },
    },
    ChartKind {
        name: "preference_accuracy",
        y_label: "accuracy",
        matches: |key| {
            let held_out = key.strip_prefix("eval/");
            matches!(key, "rewards/accuracies" | "eval/rewards/accuracies")
                || is_domain_key(held_out.unwrap_or(key), "rewards", "accuracies")
        },
    },
    ChartKind {
        name: "implicit_reward",
        y_label: "beta * log-ratio",
        matches: |key| {
            matches!(
                key,
                "rewards/chosen" | "rewards/rejected" | "rewards/margins" | "eval/rewards/margins"
            )
        },
    },
    ChartKind {
        name: "logps",
        y_label: "log-prob",
        matches: |key| matches!(key, "logps/chosen" | "logps/rejected"),
    },
    ChartKind {
        name: "kl",
        y_label: "kl",
        matches: |key| key == "actor/kl",
    },
    ChartKind {
        name: "entropy",
        y_label: "entropy",
        matches: |key| key == "actor/entropy",
    },
    ChartKind {
        name: "response_length",
        y_label: "tokens",
        matches: |key| matches!(key, "response_length/mean" | "response_length/max"),
    },
    ChartKind {
        name: "grad_norm",
        y_label: "grad norm",
        matches: |key| matches!(key, "actor/grad_norm" | "critic/grad_norm"),
    },
    ChartKind {
        name: "staleness",
        y_label: "steps",
        matches: |key| matches!(key, "async/staleness_mean" | "async/staleness_max"),
    },
    ChartKind {
        name: "throughput",
        y_label: "tokens/s",
        matches: |key| key == "system/tokens_per_s",
    },
    ChartKind {
        name: "timings",
        y_label: "seconds",
        matches: |key| key.starts_with("time/"),
    },
];

/// An agentic run's `env/<tag>/<name>`, or its evaluation's `val/env/<tag>/<name>`.
fn is_env_key(key: &str, name: &str) -> bool {
    is_domain_key(key.strip_prefix("val/").unwrap_or(key), "env", name)
}

/// `<prefix>/<domain>/<suffix>` with a non-empty domain.
pub(crate) fn is_domain_key(key: &str, prefix: &str, suffix: &str) -> bool {
    let parts: Vec<&str> = key.split('/').collect();
    matches!(parts.as_slice(), [p, domain, s] if *p == prefix && !domain.is_empty() && *s == suffix)
}

/// The charts to draw for `series`, in output order.
pub(crate) fn plan_charts(series: &[Series]) -> Vec<ChartPlan<'_>> {
    let drawable: Vec<&Series> = series
        .iter()
        .filter(|s| s.values.iter().any(|v| v.is_finite()))
        .collect();
    // The stage whose charts get the plain names comes first: the last one the run has (its
    // result), in the order of the stage list.
    let mut stages: Vec<&str> = vec![];
    for s in &drawable {
        if !stages.contains(&s.stage.as_str()) {
            stages.push(&s.stage);
        }
    }
    let main = stages
        .iter()
        .copied()
        .filter(|s| crate::names::Stage::parse(s).is_some())
        .max_by_key(|s| crate::names::Stage::rank_of(s))
        .unwrap_or(crate::names::Stage::Rl.as_str());
    stages.retain(|s| *s != main);
    stages.insert(0, main);

    let mut plans = Vec::new();
    for kind in KINDS {
        for stage in &stages {
            let lines: Vec<&Series> = drawable
                .iter()
                .copied()
                .filter(|s| s.stage == *stage && (kind.matches)(&s.key))
                .collect();
            // A synchronous run's staleness is 0 at every step by construction: a chart of it
            // says nothing (and drew two zero lines on a -1..1 axis).
            let all_zero = lines.iter().all(|s| s.values.iter().all(|v| *v == 0.0));
            if lines.is_empty() || (kind.name == "staleness" && all_zero) {
                continue;
            }
            let file_stem = if *stage == main {
                kind.name.to_string()
            } else {
                format!("{}_{}", file_safe(stage), kind.name)
            };
            plans.push(ChartPlan {
                file_stem,
                title: format!("{} ({stage})", kind.name),
                y_label: kind.y_label,
                lines,
            });
        }
    }
    // Series no chart kind draws (a workbench panel of metrics its filter found, exported on
    // their own) still get a chart: one per stage, named by its keys.
    if plans.is_empty() {
        for stage in &stages {
            let lines: Vec<&Series> = drawable
                .iter()
                .copied()
                .filter(|s| s.stage == *stage && !KINDS.iter().any(|k| (k.matches)(&s.key)))
                .collect();
            if lines.is_empty() {
                continue;
            }
            let keys: Vec<&str> = lines.iter().map(|s| s.key.as_str()).collect();
            let name = match keys.as_slice() {
                [one] => one.to_string(),
                _ => "metrics".to_string(),
            };
            plans.push(ChartPlan {
                file_stem: match *stage == main {
                    true => file_safe(&name),
                    false => format!("{}_{}", file_safe(stage), file_safe(&name)),
                },
                title: format!("{} ({stage})", keys.join(", ")),
                y_label: "value",
                lines,
            });
        }
    }
    plans
}

/// A stage name usable in a file name: anything but ASCII letters, digits, `-` and `_` becomes `_`.
fn file_safe(stage: &str) -> String {
    let safe: String = stage
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.is_empty() {
        "stage".to_string()
    } else {
        safe
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::tests::series;

    fn summary(series: &[Series]) -> Vec<(String, Vec<String>)> {
        plan_charts(series)
            .into_iter()
            .map(|p| (p.file_stem, p.lines.iter().map(|s| s.key.clone()).collect()))
            .collect()
    }

    fn owned(rows: &[(&str, &[&str])]) -> Vec<(String, Vec<String>)> {
        rows.iter()
            .map(|(f, keys)| (f.to_string(), keys.iter().map(|k| k.to_string()).collect()))
            .collect()
    }

    #[test]
    fn series_no_chart_claims_are_drawn_when_nothing_else_is() {
        // A workbench panel of what its filter found, exported alone: one chart, not none.
        let input = vec![
            series("rl", "group/frac_zero_std", &[0.5, 0.25]),
            series("rl", "adv/mean", &[0.0, 0.1]),
        ];
        let plans = plan_charts(&input);
        assert_eq!(plans.len(), 1);
        assert_eq!(plans[0].title, "group/frac_zero_std, adv/mean (rl)");
        assert_eq!(plans[0].file_stem, "metrics");
        let one = plan_charts(&input[..1]);
        assert_eq!(one[0].file_stem, "group_frac_zero_std");
        // Beside a chart of its own kind, such a series is left to the CSV as before.
        let mut with_reward = input.clone();
        with_reward.push(series("rl", "reward/add/mean", &[0.1, 0.2]));
        let stems: Vec<String> = plan_charts(&with_reward)
            .into_iter()
            .map(|p| p.file_stem)
            .collect();
        assert_eq!(stems, ["reward"]);
    }

    #[test]
    fn keys_go_to_their_charts_and_stages_to_prefixed_files() {
        let input = vec![
            series("sft", "sft/loss", &[1.0]),
            series("sft", "time/step", &[1.0]),
            series("rl", "time/rollout", &[1.0]),
            series("rl", "reward/math/mean", &[1.0]),
            series("rl", "reward/math/std", &[1.0]),
            series("rl", "reward/mean", &[1.0]),
            series("rl", "reward/code/mean", &[1.0]),
            series("rl", "score/math/accuracy", &[1.0]),
            series("rl", "critic/value_loss", &[1.0]),
            series("rl", "actor/pg_loss", &[1.0]),
            series("rl", "actor/kl", &[1.0]),
            series("rl", "actor/entropy", &[1.0]),
            series("rl", "actor/lr", &[1.0]),
            series("rl", "response_length/max", &[1.0]),
            series("rl", "response_length/mean", &[1.0]),
            series("rl", "response_length/clip_ratio", &[1.0]),
            series("rl", "time/train", &[1.0]),
        ];
        let expected = owned(&[
            ("reward", &["reward/math/mean", "reward/code/mean"]),
            ("accuracy", &["score/math/accuracy"]),
            ("loss", &["critic/value_loss", "actor/pg_loss"]),
            ("sft_loss", &["sft/loss"]),
            ("kl", &["actor/kl"]),
            ("entropy", &["actor/entropy"]),
            (
                "response_length",
                &["response_length/max", "response_length/mean"],
            ),
            ("timings", &["time/rollout", "time/train"]),
            ("sft_timings", &["time/step"]),
        ]);
        assert_eq!(summary(&input), expected);
        let plans = plan_charts(&input);
        assert_eq!(plans[0].title, "reward (rl)");
        assert_eq!(plans[3].title, "loss (sft)");
    }

    #[test]
    fn held_out_and_agentic_metrics_get_their_charts() {
        let input = vec![
            series("rl", "val/add/pass@4", &[0.5]),
            series("rl", "val/add/mean@4", &[0.3]),
            series("rl", "val/add/prompts", &[20.0]),
            series("rl", "env/lake/success", &[0.2]),
            series("rl", "val/env/lake/success", &[0.4]),
            series("rl", "env/lake/steps", &[6.0]),
            series("rl", "env/lake/invalid_action_frac", &[0.1]),
            series("rl", "env/lake/discarded", &[0.0]),
        ];
        let by_chart = summary(&input);
        let names: Vec<&str> = by_chart.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["validation", "success", "turns", "invalid_actions"]);
        assert_eq!(by_chart[0].1, ["val/add/pass@4", "val/add/mean@4"]);
        assert_eq!(by_chart[1].1, ["env/lake/success", "val/env/lake/success"]);
    }

    /// Staleness is charted for an asynchronous run, not for a synchronous one (always 0).
    #[test]
    fn a_synchronous_runs_staleness_is_not_charted() {
        let of = |values: &[f64]| {
            vec![
                series("rl", "async/staleness_mean", values),
                series("rl", "async/staleness_max", values),
            ]
        };
        assert!(summary(&of(&[0.0, 0.0, 0.0])).is_empty());
        assert_eq!(
            summary(&of(&[0.0, 1.0, 0.5])),
            owned(&[(
                "staleness",
                &["async/staleness_mean", "async/staleness_max"]
            )])
        );
    }

    #[test]
    fn dpo_metrics_get_their_charts() {
        let input = vec![
            series("dpo", "loss", &[0.7]),
            series("dpo", "eval/loss", &[0.6]),
            series("dpo", "rewards/accuracies", &[0.5]),
            series("dpo", "eval/rewards/accuracies", &[0.5]),
            series("dpo", "rewards/add/accuracies", &[0.5]),
            series("dpo", "eval/rewards/add/accuracies", &[0.5]),
            series("dpo", "rewards/add/margins", &[0.5]),
            series("dpo", "rewards/chosen", &[0.1]),
            series("dpo", "rewards/rejected", &[-0.1]),
            series("dpo", "rewards/margins", &[0.2]),
            series("dpo", "logps/chosen", &[-3.0]),
            series("dpo", "logps/rejected", &[-4.0]),
        ];
        assert_eq!(
            summary(&input),
            owned(&[
                ("loss", &["loss", "eval/loss"]),
                (
                    "preference_accuracy",
                    &[
                        "rewards/accuracies",
                        "eval/rewards/accuracies",
                        "rewards/add/accuracies",
                        "eval/rewards/add/accuracies",
                    ]
                ),
                (
                    "implicit_reward",
                    &["rewards/chosen", "rewards/rejected", "rewards/margins"]
                ),
                ("logps", &["logps/chosen", "logps/rejected"]),
            ])
        );
        // Before an RL stage, DPO's charts are prefixed: the run's result is RL's; after SFT,
        // SFT's are.
        let input = vec![
            series("sft", "sft/loss", &[1.0]),
            series("dpo", "loss", &[0.7]),
            series("rl", "actor/pg_loss", &[0.1]),
        ];
        assert_eq!(
            summary(&input),
            owned(&[
                ("loss", &["actor/pg_loss"]),
                ("sft_loss", &["sft/loss"]),
                ("dpo_loss", &["loss"]),
            ])
        );
        let input = vec![
            series("sft", "sft/loss", &[1.0]),
            series("dpo", "loss", &[0.7]),
        ];
        assert_eq!(
            summary(&input),
            owned(&[("loss", &["loss"]), ("sft_loss", &["sft/loss"])])
        );
    }

    #[test]
    fn series_without_finite_values_and_odd_stages_are_handled() {
        let input = vec![
            series("rl", "actor/kl", &[f64::NAN, f64::INFINITY]),
            series("rl", "actor/entropy", &[]),
            series("pre train", "actor/kl", &[f64::NAN, 0.5]),
        ];
        assert_eq!(summary(&input), owned(&[("pre_train_kl", &["actor/kl"])]));
        assert!(plan_charts(&[]).is_empty());
    }
}
