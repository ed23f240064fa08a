//! `roll-tui samples`: a run's recorded samples, a page at a time as text, with the values a
//! filter could take when it matches nothing.

use std::io::Write;
use std::path::Path;

use anyhow::{Result, bail};

use super::SamplesArgs;
use super::store_cmd::with_store;
use crate::metrics::SampleRecord;
use crate::store::reads::{SampleCoverage, SampleFilter};

/// Samples printed as text when `--limit` is not given (a run can hold tens of thousands).
pub const SAMPLES_PAGE: u64 = 20;

pub fn samples(path: &Path, args: SamplesArgs) -> Result<()> {
    with_store(path, |store| async move {
        let run = store.find_run(&args.run).await?;
        // Text shows a page unless asked for more (`--limit 0`: all); JSON, read by programs, is
        // whole unless limited. One sample past the page tells whether there are more.
        let page = match (args.limit, args.json) {
            (Some(0), _) | (None, true) => None,
            (Some(n), _) => Some(n),
            (None, false) => Some(SAMPLES_PAGE),
        };
        let filter = SampleFilter {
            stage: args.stage.clone(),
            step: args.step,
            domain: args.domain.clone(),
            prompt: args.prompt.clone(),
            limit: page.map(|n| n + 1),
            // A page of text shows many prompts' answers; JSON keeps the recorded order.
            spread: !args.json,
        };
        let mut samples = store.samples(run.id, &filter).await?;
        let more = page.is_some_and(|n| samples.len() as u64 > n);
        if let Some(n) = page {
            samples.truncate(n as usize);
        }
        let mut out = std::io::stdout().lock();
        if args.json {
            writeln!(out, "{}", serde_json::to_string_pretty(&samples)?)?;
        } else {
            if samples.is_empty() {
                let coverage = store.sample_coverage(run.id).await?;
                bail!("{}", no_samples(&run.name, &args, &coverage));
            }
            for s in &samples {
                print_sample(&mut out, s)?;
            }
        }
        if more {
            let n = samples.len();
            let noun = if n == 1 { "sample" } else { "samples" };
            eprintln!(
                "(the first {n} matching {noun}, each prompt's first answer before its second; \
                 --limit N shows N, --limit 0 all; --step N, --domain D and --prompt P narrow \
                 them)"
            );
        }
        Ok(())
    })
}

fn print_sample(out: &mut impl Write, s: &SampleRecord) -> std::io::Result<()> {
    // An evaluation's answers trained nothing: no policy version, no advantage.
    let (policy, advantage) = match s.stage == crate::config::Stage::Eval.as_str() {
        true => (String::new(), String::new()),
        false => (
            format!(" · policy v{}", s.policy_version),
            format!(" adv {:+.3}", s.advantage),
        ),
    };
    writeln!(
        out,
        "[{} step {} · {}{policy}] reward {:.3}{}{advantage} · {} prompt + {} response tokens · {}",
        s.stage,
        s.step,
        s.domain,
        s.reward,
        if s.correct { " (correct)" } else { "" },
        s.prompt_tokens,
        s.response_tokens,
        s.finish_reason
    )?;
    writeln!(out, "  prompt:   {:?}", s.prompt)?;
    writeln!(out, "  response: {:?}", s.response)?;
    writeln!(out, "  expected: {:?}", s.ground_truth)
}

/// Why nothing matched, with the values each filter could take.
fn no_samples(run: &str, args: &SamplesArgs, coverage: &[SampleCoverage]) -> String {
    if coverage.is_empty() {
        return format!("run '{run}' has no samples");
    }
    let mut said = vec![];
    let stages: Vec<&str> = unique(coverage.iter().map(|c| c.stage.as_str()));
    if let Some(stage) = &args.stage
        && !stages.contains(&stage.as_str())
    {
        said.push(format!(
            "--stage {stage}: its stages are {}",
            stages.join(", ")
        ));
    }
    let domains: Vec<&str> = unique(coverage.iter().map(|c| c.domain.as_str()));
    if let Some(domain) = &args.domain
        && !domains.contains(&domain.as_str())
    {
        said.push(format!(
            "--domain {domain}: its domains are {}",
            domains.join(", ")
        ));
    }
    if args.step.is_some() {
        let ranges: Vec<String> = stages
            .iter()
            .filter(|s| args.stage.as_deref().is_none_or(|want| want == **s))
            .map(|s| {
                let of = coverage.iter().filter(|c| c.stage == *s);
                let first = of.clone().map(|c| c.first_step).min().unwrap_or(0);
                let last = of.map(|c| c.last_step).max().unwrap_or(0);
                format!("{s} {first} to {last}")
            })
            .collect();
        said.push(format!(
            "--step {}: its sampled steps are {}",
            args.step.unwrap_or(0),
            ranges.join(", ")
        ));
    }
    if said.is_empty() {
        format!("run '{run}' has no samples matching the filter")
    } else {
        format!(
            "run '{run}' has no samples matching the filter ({})",
            said.join("; ")
        )
    }
}

fn unique<'a>(items: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut out: Vec<&str> = vec![];
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}
