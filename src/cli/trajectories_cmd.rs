//! `roll-tui trajectories RUN`: a run's agentic episodes, turn by turn, as the store keeps them.

use std::io::Write as _;
use std::path::Path;

use anyhow::{Result, bail};

use super::TrajectoriesArgs;
use super::store_cmd::with_store;

/// Episodes the text output shows unless `--limit` says otherwise (each is many lines).
const EPISODES_PAGE: usize = 10;

pub fn trajectories(path: &Path, args: TrajectoriesArgs) -> Result<()> {
    with_store(path, |store| async move {
        let run = store.find_run(&args.run).await?;
        let mut all = store.trajectories(run.id, args.step).await?;
        let groups = all.iter().map(|t| t.group).max();
        if let Some(g) = args.group {
            all.retain(|t| t.group == g);
            if let (true, Some(last)) = (all.is_empty(), groups) {
                bail!(
                    "run '{}' has no group {g}{}: its groups are 0 to {last}",
                    run.name,
                    args.step
                        .map(|s| format!(" at step {s}"))
                        .unwrap_or_default()
                );
            }
        }
        // Text shows a page unless asked for more (`--limit 0`: all); JSON lines, read by
        // programs, are whole unless limited.
        let page = match (args.limit, args.json) {
            (Some(0), _) | (None, true) => None,
            (Some(n), _) => Some(n),
            (None, false) => Some(EPISODES_PAGE),
        };
        let matching = all.len();
        if let Some(n) = page {
            all.truncate(n);
        }
        let mut out = std::io::stdout().lock();
        if args.json {
            for t in &all {
                writeln!(out, "{}", serde_json::to_string(t)?)?;
            }
            return Ok(());
        }
        if all.is_empty() {
            // Say which: the run records none at all, or none that match.
            let steps = store.trajectory_steps(run.id).await?;
            match (steps.first(), steps.last()) {
                (Some((first, _)), Some((last, _))) => bail!(
                    "run '{}' has no trajectories matching the filter (its episodes are at steps \
                     {first} to {last})",
                    run.name
                ),
                _ => bail!(
                    "run '{}' has no trajectories (only agentic runs, with rl.env, record them)",
                    run.name
                ),
            }
        }
        for t in &all {
            let ret: f64 = t.turns.iter().map(|u| u.reward).sum();
            writeln!(
                out,
                "[{} step {} · {} · group {} episode {} · seed {} · policy v{}] {} · return {:.3} · {} turns · {}",
                t.stage,
                t.step,
                t.env,
                t.group,
                t.episode,
                t.env_seed,
                t.policy_version,
                if t.success { "success" } else { "no success" },
                ret,
                t.turns.len(),
                t.end_reason
            )?;
            for (k, u) in t.turns.iter().enumerate() {
                // As the environment drew it (a grid stays a grid), made safe to print.
                writeln!(out, "  turn {}: observation", k + 1)?;
                for line in crate::text::clean(u.observation.trim_end(), 20_000, true).lines() {
                    writeln!(out, "      {line}")?;
                }
                let invalid =
                    u.info.get("action_is_valid") == Some(&serde_json::Value::Bool(false));
                // Why, as the env said it (`'Dop' is not an action (one of Left, …)`).
                let why = u
                    .info
                    .get("invalid_reason")
                    .and_then(|r| r.as_str())
                    .map(|r| crate::text::clean(r, 200, false));
                let action = match (&u.parsed_action, invalid, why) {
                    (Some(a), false, _) => a.clone(),
                    (Some(a), true, Some(why)) => format!("{a} (not a valid action: {why})"),
                    (Some(a), true, None) => format!("{a} (not a valid action)"),
                    (None, _, Some(why)) => format!("(no action found: {why})"),
                    (None, _, None) => "(no action found)".into(),
                };
                writeln!(
                    out,
                    "    output {:?} -> {action} · reward {:.3}{}",
                    u.action_text,
                    u.reward,
                    if u.done { " · done" } else { "" }
                )?;
            }
        }
        if all.len() < matching {
            eprintln!(
                "(the first {} of {matching} matching episodes; --limit N shows N, --limit 0 all)",
                all.len()
            );
        }
        Ok(())
    })
}
