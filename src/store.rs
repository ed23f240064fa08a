//! The experiment store: one SQLite file (default `./roll.db`) holding every run's resolved config,
//! metric points, samples, agentic trajectories, checkpoints and events.
//!
//! Writes go through one batching writer task ([`writer`]), reached by a cheap [`WriterHandle`] with
//! a bounded queue; reads use the connection pool directly, any number at a time (WAL mode). Opening a
//! store checks the file before SQLite touches it, so a foreign or corrupt file is refused unmodified,
//! and marks runs whose process died as interrupted ([`liveness`]). This module knows nothing about
//! front-ends or the pipeline's internals: it stores the shapes defined in [`crate::metrics`].

mod debug_runs;
#[cfg(test)]
pub(crate) mod fixtures;
mod inserts;
pub mod liveness;
pub mod migrations;
pub mod open;
pub mod reads;
pub mod records;
mod resume;
pub mod runs;
pub mod series;
pub mod series_since;
pub mod sink;
pub mod writer;

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;

pub use open::OpenMode;
pub use records::{EventKind, EventRecord, TrajectoryRecord, TurnRecord};
pub use runs::{NewRun, RunInfo};
pub use sink::StoreSink;
pub use writer::WriterHandle;

/// `roll-tui [--store STORE] WORDS…` as a shell takes it: the store named when it is not the one
/// a bare command opens (`$ROLL_STORE`, else [`DEFAULT_STORE`]), every word quoted as needed, so
/// a printed hint runs as printed.
pub fn command_line(store: &std::path::Path, words: &[&str]) -> String {
    let quote = |w: &str| shlex::try_quote(w).map_or_else(|_| w.to_string(), |q| q.into_owned());
    let default = std::env::var_os(STORE_ENV)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| DEFAULT_STORE.into());
    let mut line = vec!["roll-tui".to_string()];
    if store != default {
        line.extend(["--store".into(), quote(&store.display().to_string())]);
    }
    line.extend(words.iter().map(|w| quote(w)));
    line.join(" ")
}

/// The file used when neither `--store` nor [`STORE_ENV`] says otherwise.
pub const DEFAULT_STORE: &str = "roll.db";
/// Environment variable naming the store file.
pub const STORE_ENV: &str = "ROLL_STORE";
/// `PRAGMA application_id` of our files ("ROLL"), so a foreign SQLite file is recognised.
pub const APPLICATION_ID: u32 = 0x524f_4c4c;

/// A run's row id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RunId(pub i64);

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Running,
    Finished,
    Failed,
    /// Stopped by the user, or its process died (see [`liveness`]).
    Interrupted,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Finished => "finished",
            RunStatus::Failed => "failed",
            RunStatus::Interrupted => "interrupted",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => RunStatus::Running,
            "finished" => RunStatus::Finished,
            "failed" => RunStatus::Failed,
            "interrupted" => RunStatus::Interrupted,
            _ => return None,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store '{}': not an SQLite database ({reason}); refusing to use or change it", path.display())]
    NotSqlite { path: PathBuf, reason: String },
    #[error(
        "store '{}': an SQLite database of another application ({reason}); refusing to use or change it",
        path.display()
    )]
    Foreign { path: PathBuf, reason: String },
    #[error("store '{}' is corrupt ({detail}); it was not modified", path.display())]
    Corrupt { path: PathBuf, detail: String },
    #[error("store '{}' does not exist (runs are recorded there by 'roll-tui run'; choose another file with --store or {STORE_ENV})", path.display())]
    Missing { path: PathBuf },
    #[error("store '{}': {detail}", path.display())]
    Schema { path: PathBuf, detail: String },
    #[error("store '{}': {context}: {source}", path.display())]
    Sql {
        path: PathBuf,
        context: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("store '{}' is busy: another process held its write lock too long while {context}", path.display())]
    Busy { path: PathBuf, context: String },
    #[error(
        "store '{}' is read-only here ({context}): its file or its directory cannot be written by \
         this user; reading commands work, writing ones need a writable --store",
        path.display()
    )]
    ReadOnly { path: PathBuf, context: String },
    #[error("{0}")]
    Run(String),
    #[error("store writer stopped: {0}")]
    Writer(String),
}

/// An open store: a pool of connections to one file.
#[derive(Clone)]
pub struct Store {
    pool: SqlitePool,
    path: PathBuf,
}

impl Store {
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Maps an sqlx error to a [`StoreError`] that names the file and what was being done;
    /// SQLite's corruption and lock codes get their own variants.
    pub(crate) fn err(&self, context: impl Into<String>) -> impl FnOnce(sqlx::Error) -> StoreError {
        sql_error(&self.path, context)
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

pub(crate) fn sql_error(
    path: &Path,
    context: impl Into<String>,
) -> impl FnOnce(sqlx::Error) -> StoreError {
    let path = path.to_path_buf();
    let context = context.into();
    move |source| {
        let code = source
            .as_database_error()
            .and_then(|d| d.code())
            .and_then(|c| c.parse::<i64>().ok())
            .map(|c| c & 0xff);
        match code {
            // SQLITE_CORRUPT, SQLITE_NOTADB
            Some(11) | Some(26) => StoreError::Corrupt {
                path,
                detail: format!("{context}: {source}"),
            },
            // SQLITE_BUSY, SQLITE_LOCKED: only after busy_timeout has run out.
            Some(5) | Some(6) => StoreError::Busy { path, context },
            // SQLITE_READONLY and its extended codes (a read-only file, or a directory where the
            // write-ahead log cannot be made).
            Some(8) => StoreError::ReadOnly { path, context },
            _ => StoreError::Sql {
                path,
                context,
                source,
            },
        }
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
