//! The runtime side of the debugger's work ([`DebugJob`]): model loading and drawing on blocking
//! threads (never on the runtime's workers, which serve the screen's reads), saving and reading
//! the store, writing exports.

use crate::debugger::open::{ModelSpec, model_policy, session_at, stored_episode};
use crate::debugger::record::save;
use crate::store::{OpenMode, Store};
use crate::tui::debugger::jobs::OpenedEpisode;
use crate::tui::debugger::{DebugJob, DebugMsg};
use crate::tui::loader::Loader;

/// Run `f` on a blocking thread; a panic in it is an error, not a lost answer.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(format!("the work failed: {e}")))
}

/// `path`, or `path` numbered (`x-2.jsonl`, `x-3.jsonl`, …) when it exists: an export never
/// overwrites an earlier one.
fn free_name(path: &std::path::Path) -> std::path::PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    let mut candidate = path.to_path_buf();
    let mut n = 1;
    while candidate.exists() {
        n += 1;
        candidate = path.with_file_name(format!("{stem}-{n}{ext}"));
    }
    candidate
}

impl Loader {
    pub(in crate::tui) async fn debug(&self, job: DebugJob) -> DebugMsg {
        // Drawing, resampling, env steps and starts: on a blocking thread, never on the
        // runtime's workers, which serve the screen's reads.
        let fallback = job.clone();
        let job = match tokio::task::spawn_blocking(move || job.compute()).await {
            Ok(Ok(answer)) => return answer,
            Ok(Err(job)) => *job,
            Err(e) => return fallback.failed(format!("the work failed: {e}")),
        };
        match job {
            DebugJob::LoadModel { job, spec, env } => {
                let parsed = ModelSpec::parse(&spec);
                let store = match &parsed {
                    ModelSpec::Dir(_) => None,
                    ModelSpec::Run { .. } => match self.store().await {
                        Ok(s) => Some(s.clone()),
                        Err(e) => {
                            return DebugMsg::ModelLoaded {
                                job,
                                result: Err(format!(
                                    "'{spec}' is not a model directory, and runs cannot be read: {e}"
                                )),
                            };
                        }
                    },
                };
                let handle = tokio::runtime::Handle::current();
                let result = blocking(move || {
                    handle
                        .block_on(model_policy(store.as_ref(), &parsed, &env))
                        .map(Box::new)
                })
                .await;
                DebugMsg::ModelLoaded { job, result }
            }
            DebugJob::Save {
                job,
                request,
                mut target,
            } => {
                // Saving is the one debugger write; a workbench opened before any run has no
                // store file yet, and saving creates it.
                let store = match self.path.exists() {
                    true => self.store().await.cloned(),
                    false => Store::open(&self.path, OpenMode::Create)
                        .await
                        .map_err(|e| e.to_string()),
                };
                let result = match store {
                    Ok(store) => save(&store, &request, &mut target)
                        .await
                        .map(|saved| (saved, target))
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                };
                DebugMsg::Saved { job, result }
            }
            DebugJob::Export { job, path, text } => {
                let result = blocking(move || {
                    if let Some(dir) = path.parent() {
                        std::fs::create_dir_all(dir)
                            .map_err(|e| format!("creating '{}': {e}", dir.display()))?;
                    }
                    let path = free_name(&path);
                    std::fs::write(&path, text)
                        .map_err(|e| format!("writing '{}': {e}", path.display()))?;
                    Ok(format!("wrote {}", path.display()))
                })
                .await;
                DebugMsg::Exported { job, result }
            }
            DebugJob::ListCheckpoints { job } => {
                let mut specs = vec![];
                if self.path.exists()
                    && let Ok(store) = self.store().await
                    && let Ok(runs) = store.list_runs().await
                {
                    for run in runs {
                        let Ok(checkpoints) = store.checkpoints(run.id).await else {
                            continue;
                        };
                        // A checkpoint a later timed save replaced is gone from disk: only
                        // what can be loaded is offered.
                        for c in checkpoints.iter().rev().filter(|c| c.path.is_dir()) {
                            let spec = ModelSpec::of_checkpoint(&run.name, &c.stage, c.step);
                            if !specs.contains(&spec) {
                                specs.push(spec);
                            }
                        }
                    }
                }
                DebugMsg::Checkpoints { job, specs }
            }
            DebugJob::Open {
                job,
                run,
                step,
                group,
                episode,
                env,
                at,
            } => {
                let stored = match self.store().await {
                    Ok(store) => {
                        stored_episode(store, &run, step, group, episode, env.as_deref()).await
                    }
                    Err(e) => Err(e),
                };
                // Rebuilding replays the episode through its env: off the runtime's workers.
                let result = match stored {
                    Ok(stored) => {
                        blocking(move || {
                            let session = session_at(&stored, at)?;
                            Ok(Box::new(OpenedEpisode { stored, session }))
                        })
                        .await
                    }
                    Err(e) => Err(e),
                };
                DebugMsg::Opened { job, result }
            }
            // Computed above.
            computed => {
                computed.failed("internal: computation not run on a blocking thread".into())
            }
        }
    }
}
