//! `roll-tui reward score`: score responses with a reward outside a run, to debug a reward or a
//! dataset (the reward is built exactly as a config builds it).

use std::io::{BufRead, BufReader, Read, Write};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Map, Value, json};

use super::RewardScoreArgs;
use crate::config::RunConfig;
use crate::reward::{Reward, RewardKind, RewardOutcome, RewardSpec};

/// Longest input line read (a larger one is reported as an error, not buffered without bound).
const MAX_LINE_BYTES: usize = 16 << 20;

pub fn score(args: RewardScoreArgs) -> Result<i32> {
    let reward = reward_of(&args)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let Some(input) = &args.input else {
        let (Some(response), Some(truth)) = (&args.response, &args.truth) else {
            bail!("give --response and --truth, or --input FILE.jsonl");
        };
        let outcome = reward.score(args.prompt.as_deref().unwrap_or(""), response, truth);
        let text = if args.json {
            format!("{}\n", result_json(None, &reward, &outcome))
        } else {
            human(&reward, &outcome)
        };
        return finish(out.write_all(text.as_bytes()), 0);
    };
    let file =
        std::fs::File::open(input).with_context(|| format!("cannot open '{}'", input.display()))?;
    let mut reader = BufReader::new(file);
    let (mut lines, mut bad) = (0usize, 0usize);
    let mut buf = Vec::new();
    for number in 1.. {
        buf.clear();
        let read = Read::by_ref(&mut reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut buf)
            .with_context(|| format!("reading '{}' at line {number}", input.display()))?;
        if read == 0 {
            break;
        }
        let too_long = buf.len() > MAX_LINE_BYTES && !buf.ends_with(b"\n");
        if too_long {
            // Skip the rest of the line without keeping it.
            let mut sink = Vec::new();
            while reader.read_until(b'\n', &mut sink)? > 0 && !sink.ends_with(b"\n") {
                sink.clear();
            }
        }
        let line = if too_long {
            Err(format!("longer than {} MiB", MAX_LINE_BYTES >> 20))
        } else {
            std::str::from_utf8(&buf)
                .map(str::trim)
                .map_err(|e| format!("not UTF-8 ({e})"))
        };
        if line.as_ref().is_ok_and(|l| l.is_empty()) {
            continue;
        }
        lines += 1;
        let parsed = line.map_err(|e| (Value::Null, e)).and_then(parse_line);
        let value = match parsed {
            Ok(input) => {
                let outcome = reward.score(&input.prompt, &input.response, &input.truth);
                result_json(Some(input.id), &reward, &outcome)
            }
            Err((id, e)) => {
                bad += 1;
                let message = format!("{}: line {number}: {e}", input.display());
                eprintln!("error: {message}");
                json!({ "id": id, "line": number, "error": message })
            }
        };
        if let Err(e) = writeln!(out, "{value}") {
            return finish(Err(e), 0);
        }
    }
    if bad > 0 {
        eprintln!(
            "{bad} of {lines} lines could not be scored (their output lines carry \"error\")"
        );
        return finish(out.flush(), 1);
    }
    finish(out.flush(), 0)
}

/// A write's result as an exit code: a reader that went away (`| head`) ends us quietly.
fn finish(written: std::io::Result<()>, code: i32) -> Result<i32> {
    match written {
        Ok(()) => Ok(code),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(code),
        Err(e) => Err(e).context("writing the scores"),
    }
}

/// The reward of `--kind`/`--params`, or of a domain of `--config`.
fn reward_of(args: &RewardScoreArgs) -> Result<Reward> {
    let reward = configured_reward(args)?;
    if reward.runs_programs() {
        crate::sandbox::Sandbox::shared()?;
    }
    Ok(reward)
}

fn configured_reward(args: &RewardScoreArgs) -> Result<Reward> {
    if let Some(path) = &args.config {
        let domain = args
            .domain
            .as_deref()
            .ok_or_else(|| anyhow!("--config needs --domain NAME"))?;
        let cfg = RunConfig::load(path, &[])?;
        let names: Vec<&str> = cfg.data.domains.iter().map(|d| d.name.as_str()).collect();
        let (i, d) = cfg
            .data
            .domains
            .iter()
            .enumerate()
            .find(|(_, d)| d.name == domain)
            .ok_or_else(|| {
                anyhow!(
                    "'{}' has no domain '{domain}' (its domains: {})",
                    path.display(),
                    names.join(", ")
                )
            })?;
        let at = format!("{}: data.domains[{i}] ('{domain}').reward", path.display());
        return d.reward.resolve(&at).map_err(|e| anyhow!(e));
    }
    let Some(kind) = &args.kind else {
        bail!(
            "give --kind KIND (one of {}) or --config RUN.yaml --domain NAME",
            kinds()
        );
    };
    let mut spec = match &args.params {
        None => Map::new(),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => map,
            Ok(other) => bail!("--params must be a JSON object, got {other}"),
            Err(e) => bail!("--params is not JSON: {e}"),
        },
    };
    if spec.contains_key("kind") || spec.contains_key("combine") {
        bail!("--params holds a reward's parameters; give its kind with --kind");
    }
    spec.insert("kind".into(), Value::String(kind.clone()));
    let spec: RewardSpec =
        serde_json::from_value(Value::Object(spec)).map_err(|e| anyhow!("--params: {e}"))?;
    spec.resolve("--kind/--params").map_err(|e| anyhow!(e))
}

fn kinds() -> String {
    let names: Vec<&str> = RewardKind::ALL.iter().map(|k| k.as_str()).collect();
    names.join(", ")
}

/// One input line.
struct Input {
    id: Value,
    prompt: String,
    response: String,
    truth: String,
}

/// An input line, or why it cannot be scored (with its id when it has one).
fn parse_line(line: &str) -> Result<Input, (Value, String)> {
    let value: Value =
        serde_json::from_str(line).map_err(|e| (Value::Null, format!("not JSON: {e}")))?;
    let Value::Object(map) = value else {
        let e = "expected a JSON object with \"response\" and \"ground_truth\"";
        return Err((Value::Null, e.into()));
    };
    let id = map.get("id").cloned().unwrap_or(Value::Null);
    let text = |key: &str, required: bool| match map.get(key) {
        Some(Value::String(s)) => Ok(s.clone()),
        None | Some(Value::Null) if !required => Ok(String::new()),
        None => Err((id.clone(), format!("missing \"{key}\""))),
        Some(other) => Err((
            id.clone(),
            format!("\"{key}\" must be a string, got {other}"),
        )),
    };
    Ok(Input {
        prompt: text("prompt", false)?,
        response: text("response", true)?,
        truth: text("ground_truth", true)?,
        id: id.clone(),
    })
}

/// Each term's score by name; a single kind is its own one term.
fn breakdown(reward: &Reward, outcome: &RewardOutcome) -> Map<String, Value> {
    match reward {
        Reward::One(f) => Map::from_iter([(f.kind().as_str().to_string(), json!(outcome.score))]),
        Reward::Weighted(_) => outcome
            .components
            .iter()
            .map(|(name, score)| (name.clone(), json!(score)))
            .collect(),
    }
}

fn result_json(id: Option<Value>, reward: &Reward, outcome: &RewardOutcome) -> Value {
    let mut v = json!({
        "score": outcome.score,
        "correct": outcome.correct,
        "format_ok": outcome.format_ok,
        "extracted": outcome.extracted,
        "breakdown": breakdown(reward, outcome),
    });
    if let Value::Object(map) = &mut v {
        if let Some(id) = id {
            map.insert("id".into(), id);
        }
        if let Some(error) = &outcome.error {
            map.insert("error".into(), json!(error));
        }
    }
    v
}

fn human(reward: &Reward, outcome: &RewardOutcome) -> String {
    let yes = |b: bool| if b { "yes" } else { "no" };
    let mut text = format!(
        "score {}  correct {}  format ok {}  extracted {}\n",
        outcome.score,
        yes(outcome.correct),
        yes(outcome.format_ok),
        outcome
            .extracted
            .as_deref()
            .map_or("(none)".to_string(), |e| format!("{e:?}"))
    );
    if let Some(error) = &outcome.error {
        text.push_str(&format!("error: {error}\n"));
    }
    if let Reward::Weighted(_) = reward {
        let terms: Vec<String> = outcome
            .components
            .iter()
            .map(|(name, score)| format!("{name} {score}"))
            .collect();
        text.push_str(&format!("breakdown: {}\n", terms.join(", ")));
    }
    text
}
