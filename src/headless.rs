//! The headless front-end of `roll-tui run`: a progress bar per stage, one summary line per step,
//! and a warning line when a run-health rule fires (the core's `health` rules, fed as the run goes).
//!
//! It only subscribes to pipeline events; it owns no training logic. When stdout is not a terminal
//! (CI, pipes) the bar is hidden and the summary lines are printed plainly.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use indicatif::{ProgressBar, ProgressStyle};

use std::path::Path;

use crate::health::monitor::HealthMonitor;
use crate::launch::{self, LaunchError, Recorded, Start};
use crate::metrics::Metrics;
use crate::pipeline::{Observer, PipelineEvent, RunStatus};
use crate::store::now_ms;
use crate::text::clean;

pub struct HeadlessObserver {
    bar: Option<ProgressBar>,
    quiet: bool,
    health: HealthMonitor,
}

impl HeadlessObserver {
    pub fn new(quiet: bool) -> Self {
        HeadlessObserver {
            bar: None,
            quiet,
            health: HealthMonitor::new(now_ms()),
        }
    }

    /// A warning is printed even when quiet (a run started from the workbench logs it), on stderr.
    fn warn(&self, line: &str) {
        match &self.bar {
            Some(bar) if !bar.is_hidden() => bar.println(line),
            _ => print_line(&mut std::io::stderr(), line),
        }
    }

    fn say(&self, line: &str) {
        if self.quiet {
            return;
        }
        match &self.bar {
            Some(bar) if !bar.is_hidden() => bar.println(line),
            _ => print_line(&mut std::io::stdout(), line),
        }
    }
}

/// `line` on `out`, whose reader may have gone away (`roll-tui run … | head`): a run that can
/// no longer print goes on to its end and its checkpoints, unprinted, instead of dying with
/// them unwritten.
fn print_line(out: &mut impl std::io::Write, line: &str) {
    let _ = writeln!(out, "{line}");
}

impl Observer for HeadlessObserver {
    fn on_event(&mut self, event: &PipelineEvent) {
        match event {
            PipelineEvent::Started {
                model_type,
                source,
                parameters,
                trainable,
                device,
                stages,
                output_dir,
            } => {
                let trained = match trainable {
                    Some(n) => format!("; a LoRA adapter of {} trains", thousands(*n)),
                    None => String::new(),
                };
                let plan: Vec<String> = stages
                    .iter()
                    .map(|(stage, steps)| {
                        format!("{stage} {steps} step{}", crate::text::plural_s(*steps))
                    })
                    .collect();
                self.say(&format!(
                    "{model_type} of {} parameters ({source}{trained}) on {device} · {} · output '{}'",
                    thousands(*parameters),
                    plan.join(", then "),
                    output_dir.display()
                ));
            }
            PipelineEvent::StageStarted {
                stage,
                total_steps,
                done_steps,
            } => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
                let bar = if self.quiet {
                    ProgressBar::hidden()
                } else {
                    ProgressBar::new(*total_steps as u64)
                };
                let style = ProgressStyle::with_template(
                    "{prefix:>4} [{bar:30}] {pos}/{len} {elapsed_precise} eta {eta} {msg}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> ");
                bar.set_style(style);
                bar.set_prefix(stage.as_str());
                bar.set_position(*done_steps as u64);
                self.bar = Some(bar);
            }
            PipelineEvent::StepFinished {
                stage,
                step,
                total_steps,
                metrics,
            } => {
                let line = summary_line(stage.as_str(), *step, *total_steps, metrics);
                if let Some(bar) = &self.bar {
                    bar.set_position(*step as u64);
                }
                self.say(&line);
                for alarm in self.health.step(*stage, *step, metrics, now_ms()) {
                    self.warn(&format!(
                        "warning: {}",
                        clean(&alarm.to_string(), 300, false)
                    ));
                }
            }
            PipelineEvent::Worker(note) => self.health.worker(note, now_ms()),
            PipelineEvent::Transfer(t) => self.health.transfer(t, now_ms()),
            PipelineEvent::CheckpointSaved { path, step, bytes } => {
                self.say(&format!(
                    "checkpoint step {step}: '{}' ({:.1} MB)",
                    path.display(),
                    *bytes as f64 / 1e6
                ));
            }
            PipelineEvent::Message(text) => self.say(text),
            // First, quiet or not: what the lines after it continue.
            PipelineEvent::Resumed {
                run,
                stage,
                step,
                recomputed,
            } => print_line(
                &mut std::io::stdout(),
                &format!(
                    "resumed run '{run}' from {stage} step {step} ({recomputed} metric points \
                     recorded after that checkpoint are recomputed)"
                ),
            ),
        }
    }
}

/// `988288` as `988,288`.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `rl   12/60  acc add=0.41 rev=0.30  reward add=0.41 rev=0.30  pg_loss -0.012  kl 0.003  len 4.1  0.21s`
pub fn summary_line(stage: &str, step: usize, total: usize, m: &Metrics) -> String {
    let mut parts = vec![format!("{stage:<4}{step:>5}/{total}")];
    let per_domain = |prefix: &str, suffix: &str| -> Option<String> {
        let vals: Vec<String> = m
            .iter()
            .filter_map(|(k, v)| {
                let domain = k.strip_prefix(prefix)?.strip_suffix(suffix)?;
                Some(format!("{domain}={v:.2}"))
            })
            .collect();
        (!vals.is_empty()).then(|| vals.join(" "))
    };
    if let Some(acc) = per_domain("score/", "/accuracy") {
        parts.push(format!("acc {acc}"));
    }
    // An agentic run's headline: each environment's success rate (not its evaluation's).
    let success: Vec<String> = m
        .iter()
        .filter_map(|(k, v)| {
            let env = k.strip_prefix("env/")?.strip_suffix("/success")?;
            (!env.starts_with("val/")).then(|| format!("{env}={v:.2}"))
        })
        .collect();
    if !success.is_empty() {
        parts.push(format!("success {}", success.join(" ")));
    }
    if let Some(r) = per_domain("reward/", "/mean") {
        parts.push(format!("reward {r}"));
    }
    // `rl.eval`'s held-out pass@k, on the steps it ran.
    let held_out: Vec<(&str, String)> = m
        .iter()
        .filter_map(|(k, v)| {
            let (domain, pass) = k.strip_prefix("val/")?.split_once("/pass@")?;
            (domain != "env").then(|| (pass, format!("{domain}={v:.2}")))
        })
        .collect();
    if let Some((k, _)) = held_out.first() {
        let scores: Vec<&str> = held_out.iter().map(|(_, s)| s.as_str()).collect();
        parts.push(format!("val pass@{k} {}", scores.join(" ")));
    }
    // On-policy distillation learns from each teacher's KL: what falls as it learns.
    let opd: Vec<String> = m
        .iter()
        .filter_map(|(k, v)| Some(format!("{}={v:.4}", k.strip_prefix("opd/kl/")?)))
        .collect();
    if !opd.is_empty() {
        parts.push(format!("teacher_kl {}", opd.join(" ")));
    }
    for (key, label) in [
        ("sft/loss", "loss"),
        ("distill/loss", "loss"),
        ("distill/kd", "kd"),
        ("distill/top1_agreement", "top1"),
        ("loss", "loss"),
        ("rewards/accuracies", "acc"),
        ("rewards/margins", "margin"),
        ("eval/rewards/accuracies", "eval_acc"),
        ("actor/pg_loss", "pg_loss"),
        ("actor/kl", "kl"),
        ("actor/entropy", "entropy"),
        ("critic/value_loss", "vf_loss"),
        ("response_length/mean", "len"),
        ("actor/grad_norm", "gnorm"),
    ] {
        if let Some(v) = m.get(key) {
            parts.push(format!("{label} {v:.4}"));
        }
    }
    if let Some(v) = m.get("time/step") {
        parts.push(format!("{v:.2}s"));
    }
    parts.join("  ")
}

/// Run (or resume) with progress output, recording into the store at `store`; prints where the
/// results went.
pub fn run(
    store: &Path,
    start: Start,
    stop: Arc<AtomicBool>,
    quiet: bool,
) -> Result<Recorded, LaunchError> {
    let mut observer = HeadlessObserver::new(quiet);
    let result = launch::run_recorded(store, start, &mut observer, stop);
    if let Some(bar) = observer.bar.take() {
        bar.finish_and_clear();
    }
    let rec = result?;
    let verb = match rec.outcome.status {
        RunStatus::Finished => "finished",
        RunStatus::Interrupted => "interrupted",
    };
    let mut out = std::io::stdout();
    print_line(
        &mut out,
        &format!(
            "run '{}' (id {}) {verb}; metrics and samples in store '{}', checkpoints in '{}'",
            rec.name,
            rec.run,
            store.display(),
            rec.outcome.output_dir.display()
        ),
    );
    // Without --quiet the checkpoint's own line was the last one printed before this.
    if let Some(ckpt) = &rec.outcome.last_checkpoint
        && quiet
    {
        print_line(&mut out, &format!("last checkpoint: '{}'", ckpt.display()));
    }
    if rec.outcome.status == RunStatus::Interrupted {
        let resume = resume_command(store, &rec.name);
        print_line(&mut out, &format!("continue it with: {resume}"));
    }
    Ok(rec)
}

/// The command that resumes run `name` of the store at `store`, as a user can paste it: with
/// `--store` unless the store is the one a bare command opens (`$ROLL_STORE`, else `roll.db`),
/// every word quoted for the shell as needed.
pub fn resume_command(store: &Path, name: &str) -> String {
    crate::store::command_line(store, &["resume", name])
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_opd_step_line_shows_each_teachers_kl() {
        let m: crate::metrics::Metrics = [
            ("opd/kl/big".to_string(), 1.25),
            ("opd/kl/small".to_string(), 0.5),
            ("time/step".to_string(), 0.2),
        ]
        .into();
        let line = super::summary_line("rl", 3, 10, &m);
        assert_eq!(
            line,
            "rl      3/10  teacher_kl big=1.2500 small=0.5000  0.20s"
        );
    }

    #[test]
    fn a_step_with_an_evaluation_shows_its_pass_at_k() {
        let m: crate::metrics::Metrics = [
            ("val/add/pass@4".to_string(), 0.25),
            ("val/add/mean@4".to_string(), 0.1),
            ("val/rev/pass@4".to_string(), 0.5),
            ("val/env/lake/success".to_string(), 1.0),
        ]
        .into();
        let line = super::summary_line("rl", 10, 20, &m);
        assert_eq!(line, "rl     10/20  val pass@4 add=0.25 rev=0.50");
    }

    #[test]
    fn thousands_are_grouped() {
        let cases = [
            (0, "0"),
            (999, "999"),
            (1000, "1,000"),
            (988_288, "988,288"),
        ];
        for (n, text) in cases {
            assert_eq!(super::thousands(n), text);
        }
        assert_eq!(super::thousands(1_234_567_890), "1,234,567,890");
    }

    use super::*;

    #[test]
    fn the_resume_hint_names_a_store_that_is_not_the_default_and_quotes_it() {
        // (The default is `$ROLL_STORE` when set: this test's processes do not set it.)
        if std::env::var_os("ROLL_STORE").is_none() {
            assert_eq!(
                resume_command(Path::new("roll.db"), "qs"),
                "roll-tui resume qs"
            );
        }
        assert_eq!(
            resume_command(Path::new("/tmp/my runs/x.db"), "it's"),
            "roll-tui --store '/tmp/my runs/x.db' resume \"it's\""
        );
    }

    #[test]
    fn summary_line_lists_domains_and_losses() {
        let m: Metrics = [
            ("score/add/accuracy", 0.5),
            ("score/rev/accuracy", 0.25),
            ("reward/add/mean", 0.5),
            ("actor/pg_loss", -0.01),
            ("time/step", 0.2),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(
            summary_line("rl", 3, 10, &m),
            "rl      3/10  acc add=0.50 rev=0.25  reward add=0.50  pg_loss -0.0100  0.20s"
        );
        // An agentic step leads with its success rate.
        let m: Metrics = [
            ("env/lake/success", 0.75),
            ("env/val/lake/success", 0.5),
            ("env/lake/return", 0.6),
            ("reward/lake/mean", 0.6),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(
            summary_line("rl", 4, 10, &m),
            "rl      4/10  success lake=0.75  reward lake=0.60"
        );
    }
}
