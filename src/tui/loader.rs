//! Reads the workbench asks for, run on the async runtime so the screen never waits on the store:
//! each turns an [`Effect`] into the [`Msg`] that carries its answer (or its error as text).

use std::path::{Path, PathBuf};

use super::app::{Effect, Msg};
use super::runs::RunRow;
use crate::store::{OpenMode, Store, StoreError};

/// The store, opened on first use: a workbench started before any run has no file to open yet.
pub struct Loader {
    path: PathBuf,
    store: tokio::sync::OnceCell<Store>,
}

impl Loader {
    pub fn new(path: &Path) -> Loader {
        Loader {
            path: path.to_path_buf(),
            store: tokio::sync::OnceCell::new(),
        }
    }

    async fn store(&self) -> Result<&Store, String> {
        if !self.path.exists() {
            return Err(format!(
                "no store at '{}' yet: `roll-tui run CONFIG` creates it",
                self.path.display()
            ));
        }
        self.store
            .get_or_try_init(|| Store::open(&self.path, OpenMode::Existing))
            .await
            .map_err(|e| e.to_string())
    }

    /// Carry out `effect`; the answer as a message for the app.
    pub async fn load(&self, effect: Effect) -> Msg {
        match effect {
            Effect::LoadRuns => Msg::RunsLoaded(self.runs().await),
            Effect::LoadSeries(run) => Msg::SeriesLoaded {
                run,
                result: match self.store().await {
                    Ok(store) => store
                        .load_series(run, None)
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                },
            },
        }
    }

    async fn runs(&self) -> Result<Vec<RunRow>, String> {
        let store = self.store().await?;
        let read = async {
            let mut rows = vec![];
            for info in store.list_runs().await? {
                let series = store.list_series(info.id).await?;
                let live = info.is_active();
                rows.push(RunRow::new(info, live, &series));
            }
            Ok::<_, StoreError>(rows)
        };
        read.await.map_err(|e| e.to_string())
    }

    pub async fn close(&self) {
        if let Some(store) = self.store.get() {
            store.close().await;
        }
    }
}
