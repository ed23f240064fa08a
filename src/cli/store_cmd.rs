//! Commands that read (or annotate) the store: `runs`, `metrics`, `samples`, `export`.

use std::future::Future;
use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};

use super::{ExportArgs, MetricsArgs, RunsArgs, RunsCommand};
use crate::health;
use crate::plot::{ExportOptions, export_run};
use crate::store::reads::StoredEvent;
use crate::store::{EventKind, OpenMode, RunInfo, Store};
use crate::text::clean;

/// Run `f` with the store at `path` open (it must exist; read-only where it cannot be written) on a
/// small runtime.
pub(super) fn with_store<T, F, Fut>(path: &Path, f: F) -> Result<T>
where
    F: FnOnce(Store) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async {
        let store = Store::open(path, OpenMode::Read).await?;
        let out = f(store.clone()).await;
        store.close().await;
        out
    })
}

fn format_time(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms)
        .map(|t| {
            t.to_zoned(jiff::tz::TimeZone::system())
                .strftime("%Y-%m-%d %H:%M:%S")
                .to_string()
        })
        .unwrap_or_else(|_| ms.to_string())
}

/// `add=0.59 reverse=0.91` from the latest `reward/<domain>/mean` values (an evaluation run's
/// `val/<domain>/mean@k`).
async fn last_rewards(store: &Store, run: &RunInfo) -> Result<Vec<(String, f64)>> {
    let series = store.list_series(run.id).await?;
    let eval = run.last_stage.as_deref() == Some(crate::config::Stage::Eval.as_str());
    Ok(series
        .into_iter()
        .filter(|s| Some(&s.stage) == run.last_stage.as_ref() || run.last_stage.is_none())
        .filter_map(|s| {
            let domain = match eval {
                false => s.key.strip_prefix("reward/")?.strip_suffix("/mean")?,
                true => {
                    let (domain, name) = s.key.strip_prefix("val/")?.rsplit_once('/')?;
                    name.strip_prefix("mean@")?;
                    domain
                }
            };
            Some((domain.to_string(), s.last_value?))
        })
        .collect())
}

pub fn runs(path: &Path, args: RunsArgs) -> Result<i32> {
    match args.command {
        None => with_store(
            path,
            |store| async move { list_runs(&store, args.json).await },
        )
        .map(|_| 0),
        Some(RunsCommand::Show { run, json, events }) => with_store(path, |store| async move {
            show_run(&store, &run, json, events).await
        })
        .map(|_| 0),
        Some(RunsCommand::Rm { run, yes }) => with_store(path, |store| async move {
            let info = store.find_run(&run).await?;
            let series = store.list_series(info.id).await?;
            let points: u64 = series.iter().map(|s| s.points).sum();
            let checkpoints = store.checkpoints(info.id).await?.len();
            if !yes {
                // A dry run: it says what would go, changes nothing, and succeeds.
                println!(
                    "would delete run '{}' (id {}, {}): {points} metric points in {} series, its samples, \
                     events and {checkpoints} checkpoint records (checkpoint files in '{}' stay on disk); \
                     nothing was deleted: pass --yes to delete",
                    info.name,
                    info.id,
                    info.status.as_str(),
                    series.len(),
                    info.output_dir
                );
                return Ok(0);
            }
            store.delete_run(info.id).await?;
            println!("deleted run '{}' (id {})", info.name, info.id);
            Ok(0)
        }),
        Some(RunsCommand::Tag { run, tags, remove }) => with_store(path, |store| async move {
            let info = store.find_run(&run).await?;
            if remove {
                store.remove_tags(info.id, &tags).await?;
            } else {
                store.add_tags(info.id, &tags).await?;
            }
            let now = store.run(info.id).await?;
            println!("run '{}' tags: {}", now.name, now.tags.join(", "));
            Ok(0)
        }),
        Some(RunsCommand::Note { run, text }) => with_store(path, |store| async move {
            let info = store.find_run(&run).await?;
            store.set_notes(info.id, &text).await?;
            println!("run '{}' notes updated", info.name);
            Ok(0)
        }),
    }
}

async fn list_runs(store: &Store, json: bool) -> Result<()> {
    let runs = store.list_runs().await?;
    let mut out = std::io::stdout().lock();
    if json {
        let mut items = vec![];
        for r in &runs {
            let mut v = serde_json::to_value(r)?;
            let rewards: serde_json::Map<String, serde_json::Value> = last_rewards(store, r)
                .await?
                .into_iter()
                .map(|(d, x)| (d, x.into()))
                .collect();
            v["last_rewards"] = rewards.into();
            items.push(v);
        }
        writeln!(out, "{}", serde_json::to_string_pretty(&items)?)?;
        return Ok(());
    }
    if runs.is_empty() {
        writeln!(
            out,
            "no runs in '{}' yet; start one with 'roll-tui run CONFIG'",
            store.path().display()
        )?;
        return Ok(());
    }
    // As wide as the longest name (names are typed back: never cut), 20 at least.
    let width = runs
        .iter()
        .map(|r| r.name.chars().count())
        .max()
        .unwrap_or(0)
        .max(20);
    writeln!(
        out,
        "{:>4}  {:<width$}  {:<11}  {:>15}  {:<19}  {:<28}  TAGS",
        "ID", "NAME", "STATUS", "STEP", "UPDATED", "LAST REWARD"
    )?;
    for r in &runs {
        let step = match (&r.last_stage, r.stage_steps()) {
            (Some(stage), Some(total)) => format!("{stage} {}/{total}", r.last_step),
            (Some(stage), None) => format!("{stage} {}", r.last_step),
            (None, _) => "-".into(),
        };
        let rewards = last_rewards(store, r)
            .await?
            .iter()
            .map(|(d, v)| format!("{d}={v:.2}"))
            .collect::<Vec<_>>()
            .join(" ");
        writeln!(
            out,
            "{:>4}  {:<width$}  {:<11}  {:>15}  {:<19}  {:<28}  {}",
            r.id.0,
            r.name,
            r.status.as_str(),
            step,
            format_time(r.updated_at),
            // Cut to the column (`code=0.91 ifeval=0.88 math=0.61` pushed TAGS off); the
            // JSON listing has them all.
            if rewards.is_empty() {
                "-".into()
            } else {
                crate::text::clean(&rewards, 27, false)
            },
            r.tags.join(",")
        )?;
        // Why a failed run failed, under it (the whole text is in `runs show`).
        if r.status == crate::store::RunStatus::Failed
            && let Some(error) = &r.error
        {
            writeln!(
                out,
                "      failed: {}",
                crate::text::clean(error, 160, false)
            )?;
        }
    }
    Ok(())
}

/// The run's health alarms now: the core's rules over its events and the series they read.
async fn run_alarms(
    store: &Store,
    run: &RunInfo,
    events: &[crate::store::reads::StoredEvent],
) -> Result<Vec<health::Alarm>> {
    let mut keys = globset::GlobSetBuilder::new();
    for key in health::alarm_series_keys() {
        keys.add(globset::Glob::new(key)?);
    }
    let keys = keys.build()?;
    let mut series = vec![];
    for s in store
        .load_series(run.id, None::<&globset::GlobMatcher>)
        .await?
    {
        if keys.is_match(&s.key) {
            series.push(s);
        }
    }
    Ok(health::alarms(
        &run.into(),
        events,
        &series,
        None,
        crate::store::now_ms(),
    ))
}

async fn show_run(store: &Store, reference: &str, json: bool, tail: Option<usize>) -> Result<()> {
    let run = store.find_run(reference).await?;
    let checkpoints = store.checkpoints(run.id).await?;
    let events = store.events(run.id).await?;
    let alarms = run_alarms(store, &run, &events).await?;
    if json {
        let config: serde_json::Value = serde_json::from_str(&run.config_json)?;
        let v = serde_json::json!({
            "run": run, "config": config, "checkpoints": checkpoints, "events": events,
            "alarms": alarms,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!(
        "run '{}' (id {}): {}",
        run.name,
        run.id,
        run.status.as_str()
    );
    if let Some(e) = &run.error {
        println!("  error: {e}");
    }
    println!(
        "  created {}  updated {}",
        format_time(run.created_at),
        format_time(run.updated_at)
    );
    // An evaluation run writes no files.
    let output = match run.output_dir.as_str() {
        "" => "-".to_string(),
        dir => format!("'{dir}'"),
    };
    println!(
        "  seed {}  config {}  git {}  output {output}",
        run.seed,
        run.config_hash,
        run.git_revision.as_deref().unwrap_or("-"),
    );
    if !run.tags.is_empty() {
        println!("  tags: {}", run.tags.join(", "));
    }
    if !run.notes.is_empty() {
        println!("  notes: {}", run.notes);
    }
    if alarms.is_empty() {
        println!("health: no alarms");
    } else {
        println!("health:");
        for a in &alarms {
            println!("  ▲ {}", clean(&a.to_string(), 300, false));
        }
    }
    println!("checkpoints:");
    for c in &checkpoints {
        // Timed checkpoints are replaced by the next one (`checkpoint.every_minutes`).
        let gone = if c.path.exists() { "" } else { " (removed)" };
        println!(
            "  {:<7} step {:>6}  {:>9.1} MB  '{}'{gone}",
            c.stage,
            c.step,
            c.bytes as f64 / 1e6,
            c.path.display()
        );
    }
    let is_transfer =
        |e: &&StoredEvent| matches!(e.event.kind, EventKind::Offload | EventKind::Reload);
    let print = |e: &StoredEvent| {
        // A worker's events name it (`reward-1: started, pid 42`).
        let worker = match (e.event.kind, &e.event.worker) {
            (
                EventKind::WorkerStarted | EventKind::WorkerExited | EventKind::WorkerFailed,
                Some(w),
            ) => format!("{w}: "),
            _ => String::new(),
        };
        // The widest kind (`run_marked_interrupted`) still leaves a gap before the message.
        println!(
            "  {}  {:<22}  {worker}{}",
            format_time(e.at),
            e.event.kind.as_str(),
            e.event.message
        );
    };
    // Time-sharing moves roles around every phase: hundreds of transfers, summed up per role
    // here; `--events N` shows the raw tail.
    println!("events:");
    events.iter().filter(|e| !is_transfer(e)).for_each(print);
    let transfers = transfer_totals(events.iter().filter(is_transfer));
    if !transfers.is_empty() {
        println!("offloads and reloads (--events N shows the last N events as recorded):");
        for ((role, kind), t) in &transfers {
            println!(
                "  {role:<12} {kind:<8} {:>5} × · {:.1} MB · {:.3} s",
                t.count,
                t.bytes as f64 / 1e6,
                t.seconds
            );
        }
    }
    if let Some(n) = tail {
        println!("last {} events:", n.min(events.len()));
        events[events.len().saturating_sub(n)..]
            .iter()
            .for_each(print);
    }
    Ok(())
}

/// The offloads or reloads of one role, summed.
#[derive(Default)]
struct TransferTotal {
    count: usize,
    bytes: u64,
    seconds: f64,
}

/// (role, offload|reload) → their total, by role.
fn transfer_totals<'a>(
    transfers: impl Iterator<Item = &'a StoredEvent>,
) -> std::collections::BTreeMap<(String, &'static str), TransferTotal> {
    let mut totals = std::collections::BTreeMap::new();
    for e in transfers {
        let key = (
            e.event.worker.clone().unwrap_or_else(|| "?".into()),
            e.event.kind.as_str(),
        );
        let t: &mut TransferTotal = totals.entry(key).or_default();
        t.count += 1;
        t.bytes += e.event.bytes.unwrap_or(0);
        t.seconds += e.event.duration_s.unwrap_or(0.0);
    }
    totals
}

pub fn metrics(path: &Path, args: MetricsArgs) -> Result<()> {
    let matcher = args
        .key
        .as_deref()
        .map(|k| {
            globset::Glob::new(k)
                .map(|g| g.compile_matcher())
                .with_context(|| format!("--key '{k}' is not a valid glob"))
        })
        .transpose()?;
    with_store(path, |store| async move {
        let run = store.find_run(&args.run).await?;
        let series = store.list_series(run.id).await?;
        let shown: Vec<_> = series
            .iter()
            .filter(|s| matcher.as_ref().is_none_or(|m| m.is_match(&s.key)))
            .collect();
        if shown.is_empty() {
            let keys: Vec<&str> = series.iter().map(|s| s.key.as_str()).collect();
            bail!(
                "run '{}' has no metrics{}",
                run.name,
                match &args.key {
                    Some(k) => format!(" matching '{k}'{}", key_hint(k, &keys)),
                    None => String::new(),
                }
            );
        }
        if !args.csv && !args.json {
            println!(
                "{:<5} {:<36} {:>8} {:>9}  {:>14}",
                "STAGE", "KEY", "POINTS", "LAST STEP", "LAST VALUE"
            );
            for s in shown {
                println!(
                    "{:<5} {:<36} {:>8} {:>9}  {:>14}",
                    s.stage,
                    s.key,
                    s.points,
                    s.last_step.map(|x| x.to_string()).unwrap_or_default(),
                    s.last_value.map(|v| format!("{v:.6}")).unwrap_or_default()
                );
            }
            return Ok(());
        }
        let series = store.load_series(run.id, matcher.as_ref()).await?;
        let mut out = std::io::stdout().lock();
        if args.csv {
            crate::plot::write_csv_to(&series, &mut out)?;
        } else {
            let items: Vec<serde_json::Value> = series
                .iter()
                .map(|s| {
                    serde_json::json!({
                        "stage": s.stage, "key": s.key, "steps": s.steps,
                        "wall_time": s.wall_time, "values": s.values,
                    })
                })
                .collect();
            writeln!(out, "{}", serde_json::to_string(&items)?)?;
        }
        Ok(())
    })
}

/// `--key` matches whole keys: a plain word that matches nothing is probably meant as part of
/// one, so say so, with the keys that contain it.
fn key_hint(key: &str, keys: &[&str]) -> String {
    if key.contains(['*', '?', '[', '{']) {
        return String::new();
    }
    let mut containing: Vec<&str> = keys.iter().copied().filter(|k| k.contains(key)).collect();
    containing.dedup();
    let shown = containing
        .iter()
        .take(6)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    match containing.len() {
        0 => format!(
            " (--key is a glob over whole keys, e.g. '*{key}*'; `roll-tui metrics RUN` lists them)"
        ),
        n => format!(
            " (--key is a glob over whole keys: '*{key}*' matches {n}: {shown}{})",
            if n > 6 { ", …" } else { "" }
        ),
    }
}

pub fn export(path: &Path, args: ExportArgs) -> Result<()> {
    with_store(path, |store| async move {
        let run = store.find_run(&args.run).await?;
        let series = store.load_series(run.id, None).await?;
        if series.is_empty() {
            bail!("run '{}' has no metrics to export", run.name);
        }
        let opts = ExportOptions {
            formats: args.format.clone(),
            width: args.width,
            height: args.height,
            started_at: run.created_at as f64 / 1000.0,
        };
        let written = export_run(&run.name, &series, &args.out, &opts)?;
        for p in &written {
            println!("wrote '{}'", p.display());
        }
        Ok(())
    })
}
