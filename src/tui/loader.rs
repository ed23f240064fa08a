//! The workbench's side effects, run on the async runtime so the screen never waits: store reads,
//! starting `roll-tui run`/`resume` detached, signalling runs, exports. Each answers with the
//! [`Msg`]s that carry its outcome (an error as text, for the status line).

use std::path::{Path, PathBuf};

use tokio::sync::mpsc::UnboundedSender;

use super::app::{Effect, Msg};
use super::commands::{self, Started};
use super::launch::{CONFIG_DIRS, find_configs};
use super::runs::RunRow;
use super::samples::SampleSteps;
use crate::store::liveness::{ProcessIdentity, is_stopped};
use crate::store::reads::SampleFilter;
use crate::store::{OpenMode, RunId, Store, StoreError};

/// Send `signal` to `process` now; the outcome for the status line.
pub fn signalled(process: &ProcessIdentity, signal: commands::RunSignal) -> Msg {
    Msg::Done(
        commands::signal_process(process, signal)
            .map(|_| format!("sent {signal:?} to pid {}", process.pid)),
    )
}

/// The store, opened on first use: a workbench started before any run has no file to open yet.
pub struct Loader {
    pub(super) path: PathBuf,
    store: tokio::sync::OnceCell<Store>,
}

impl Loader {
    pub fn new(path: &Path) -> Loader {
        Loader {
            path: path.to_path_buf(),
            store: tokio::sync::OnceCell::new(),
        }
    }

    pub(super) async fn store(&self) -> Result<&Store, String> {
        if !self.path.exists() {
            return Err(format!(
                "no store at '{}' yet: start a run (n) to create it",
                self.path.display()
            ));
        }
        self.store
            .get_or_try_init(|| Store::open(&self.path, OpenMode::Read))
            .await
            .map_err(|e| e.to_string())
    }

    /// Carry out `effect`, sending its answers to `tx`.
    pub async fn carry_out(&self, effect: Effect, tx: &UnboundedSender<Msg>) {
        match effect {
            Effect::Launch {
                config,
                overrides,
                name,
            } => {
                let mut args = vec!["run".to_string(), config.display().to_string()];
                args.extend(overrides);
                args.push("--quiet".into());
                // The log is named after the run (what the user named it in the form), not the
                // config, which several runs may share.
                let stem = name.clone();
                self.start(&args, &name, &stem, tx);
            }
            Effect::Resume { run } => {
                let args = vec!["resume".to_string(), run.clone(), "--quiet".into()];
                self.start(&args, &run, &format!("resume-{run}"), tx);
            }
            other => {
                let _ = tx.send(self.load(other).await);
            }
        }
    }

    /// Start a detached `roll-tui` command; report its start now and its end when it comes.
    fn start(&self, args: &[String], run: &str, log_stem: &str, tx: &UnboundedSender<Msg>) {
        let stem: String = log_stem
            .chars()
            .map(|c| {
                if c.is_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        match commands::spawn_detached(&self.path, args, run, &stem) {
            Err(e) => {
                let _ = tx.send(Msg::Started {
                    run: run.to_string(),
                    result: Err(e),
                });
            }
            Ok((started, mut child)) => {
                let Started { process, log, .. } = started.clone();
                let pid = process.pid;
                let _ = tx.send(Msg::Started {
                    run: run.to_string(),
                    result: Ok(started),
                });
                let tx = tx.clone();
                tokio::spawn(async move {
                    let code = child.wait().await.ok().and_then(|s| s.code());
                    let tail = commands::log_tail(&log, 3);
                    let _ = tx.send(Msg::Exited { pid, code, tail });
                });
            }
        }
    }

    /// Carry out a read (or a signal or export); the answer as a message for the app.
    pub async fn load(&self, effect: Effect) -> Msg {
        match effect {
            Effect::LoadRuns => Msg::RunsLoaded(self.runs().await),
            Effect::LoadSeries { run, since } => {
                let mark = since.clone();
                Msg::SeriesLoaded {
                    run,
                    result: self
                        .read(|s| async move { s.series_since(run, mark.as_ref()).await })
                        .await,
                    since,
                }
            }
            Effect::LoadSampleSteps(run) => Msg::SampleStepsLoaded {
                run,
                result: self
                    .read(|s| async move {
                        let Some(stage) = s.latest_sample_stage(run).await? else {
                            return Ok(SampleSteps::default());
                        };
                        let steps = s.sample_steps(run, &stage).await?;
                        Ok(SampleSteps {
                            stage: Some(stage),
                            steps,
                        })
                    })
                    .await,
            },
            Effect::LoadSamples { run, stage, step } => Msg::SamplesLoaded {
                run,
                step,
                result: self
                    .samples(
                        run,
                        SampleFilter {
                            stage: Some(stage.clone()),
                            step: Some(step),
                            ..Default::default()
                        },
                    )
                    .await,
                stage,
            },
            Effect::LoadEpisodeSteps(run) => Msg::EpisodeStepsLoaded {
                run,
                result: self
                    .read(|s| async move { s.trajectory_steps(run).await })
                    .await,
            },
            Effect::LoadEpisodes { run, step } => Msg::EpisodesLoaded {
                run,
                step,
                result: self
                    .read(|s| async move { s.trajectories(run, Some(step)).await })
                    .await,
            },
            Effect::LoadPrompt { run, stage, prompt } => Msg::PromptLoaded {
                run,
                result: self
                    .samples(
                        run,
                        SampleFilter {
                            stage: Some(stage.clone()),
                            prompt: Some(prompt.clone()),
                            ..Default::default()
                        },
                    )
                    .await,
                stage,
                prompt,
            },
            Effect::LoadEvents { run, after } => Msg::EventsLoaded {
                run,
                after,
                result: self
                    .read(|s| async move {
                        Ok((
                            Box::new(s.run(run).await?),
                            s.events_after(run, after).await?,
                        ))
                    })
                    .await,
            },
            Effect::FindConfigs => {
                let dirs: Vec<PathBuf> = CONFIG_DIRS.iter().map(PathBuf::from).collect();
                Msg::ConfigsFound(find_configs(&dirs))
            }
            Effect::Signal { process, signal } => signalled(&process, signal),
            Effect::DeleteRun { run, name } => Msg::RunDeleted {
                run,
                name,
                result: self.read(|s| async move { s.delete_run(run).await }).await,
            },
            Effect::Export {
                run,
                name,
                keys,
                out,
            } => Msg::Done(self.export(run, name, keys, out).await),
            Effect::Debug(job) => Msg::Debug(Box::new(self.debug(*job).await)),
            Effect::Launch { .. } | Effect::Resume { .. } => {
                Msg::Done(Err("internal: a start is not a read".into()))
            }
        }
    }

    async fn read<'a, T, F, Fut>(&'a self, f: F) -> Result<T, String>
    where
        F: FnOnce(&'a Store) -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        let store = self.store().await?;
        f(store).await.map_err(|e| e.to_string())
    }

    async fn samples(
        &self,
        run: RunId,
        filter: SampleFilter,
    ) -> Result<Vec<crate::metrics::SampleRecord>, String> {
        self.read(|s| async move { s.samples(run, &filter).await })
            .await
    }

    async fn runs(&self) -> Result<Vec<RunRow>, String> {
        self.read(|store| async move {
            let mut rows = vec![];
            for info in store.list_runs().await? {
                let series = store.list_series(info.id).await?;
                let live = info.is_active();
                let process = info.local_process();
                let mut row = RunRow::new(info, live, &series);
                row.paused = process.as_ref().and_then(|p| is_stopped(p.pid)) == Some(true);
                row.process = process;
                rows.push(row);
            }
            Ok(rows)
        })
        .await
    }

    async fn export(
        &self,
        run: RunId,
        name: String,
        keys: Option<Vec<(String, String)>>,
        out: PathBuf,
    ) -> Result<String, String> {
        let (info, mut series) = self
            .read(|s| async move { Ok((s.run(run).await?, s.load_series(run, None).await?)) })
            .await?;
        if let Some(keys) = &keys {
            series.retain(|s| keys.iter().any(|(st, k)| *st == s.stage && *k == s.key));
        }
        if series.is_empty() {
            return Err(format!("'{name}' has no metrics to export"));
        }
        let dir = out.clone();
        let written = tokio::task::spawn_blocking(move || {
            let opts = crate::plot::ExportOptions {
                started_at: info.created_at as f64 / 1000.0,
                ..Default::default()
            };
            crate::plot::export_run(&name, &series, &dir, &opts)
        })
        .await
        .map_err(|e| format!("export: {e}"))?
        .map_err(|e| e.to_string())?;
        Ok(wrote(written.len(), &out))
    }

    pub async fn close(&self) {
        if let Some(store) = self.store.get() {
            store.close().await;
        }
    }
}

/// What an export says it did.
fn wrote(files: usize, out: &std::path::Path) -> String {
    let plural = crate::text::plural_s(files);
    format!("wrote {files} file{plural} to '{}'", out.display())
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_export_counts_its_files_in_words() {
        let out = std::path::Path::new("exports/qs");
        assert_eq!(super::wrote(1, out), "wrote 1 file to 'exports/qs'");
        assert_eq!(super::wrote(3, out), "wrote 3 files to 'exports/qs'");
    }
}
