//! Run rows: create (refusing to clobber), find by name or id, list, tag, annotate, delete, and
//! prepare a resume (drop what was recorded after the checkpoint it continues from).

use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::inserts::insert_event;
use super::liveness::{ProcessIdentity, STALE_AFTER_MS};
use super::records::{EventKind, EventRecord};
use super::{RunId, RunStatus, Store, StoreError, now_ms};

/// What a new run records about itself.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub name: String,
    pub config_json: String,
    pub config_hash: String,
    pub git_revision: Option<String>,
    pub seed: u64,
    pub output_dir: String,
}

/// A run as stored. It also reads back from its JSON (`roll-tui runs --json`), without the config
/// and the process token, which that leaves out.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunInfo {
    pub id: RunId,
    pub name: String,
    pub status: RunStatus,
    pub created_at: i64,
    pub updated_at: i64,
    pub heartbeat_at: i64,
    #[serde(skip)]
    pub config_json: String,
    pub config_hash: String,
    pub git_revision: Option<String>,
    pub seed: u64,
    pub output_dir: String,
    pub notes: String,
    pub tags: Vec<String>,
    pub last_stage: Option<String>,
    pub last_step: u64,
    pub error: Option<String>,
    pub host: Option<String>,
    pub pid: Option<u32>,
    #[serde(skip)]
    pub(crate) process_token: Option<String>,
}

impl RunInfo {
    /// Steps of the stage the run is in (its last stage), from its config.
    pub fn stage_steps(&self) -> Option<u64> {
        let stage = self.last_stage.as_deref()?;
        let config: serde_json::Value = serde_json::from_str(&self.config_json).ok()?;
        config.get(stage)?.get("steps")?.as_u64()
    }

    fn from_row(r: &SqliteRow) -> Self {
        let tags: Option<String> = r.get("tags");
        RunInfo {
            id: RunId(r.get("id")),
            name: r.get("name"),
            status: RunStatus::parse(r.get("status")).unwrap_or(RunStatus::Failed),
            created_at: r.get("created_at"),
            updated_at: r.get("updated_at"),
            heartbeat_at: r.get("heartbeat_at"),
            config_json: r.get("config_json"),
            config_hash: r.get("config_hash"),
            git_revision: r.get("git_revision"),
            seed: r.get::<i64, _>("seed") as u64,
            output_dir: r.get("output_dir"),
            notes: r.get("notes"),
            tags: tags
                .map(|t| t.split('\u{1f}').map(String::from).collect())
                .unwrap_or_default(),
            last_stage: r.get("last_stage"),
            last_step: r.get::<i64, _>("last_step") as u64,
            error: r.get("error"),
            host: r.get("host"),
            pid: r.get::<Option<i64>, _>("pid").map(|p| p as u32),
            process_token: r.get("process_token"),
        }
    }

    /// A running run whose process still lives (or whose heartbeat is fresh, when that cannot be told).
    pub fn is_active(&self) -> bool {
        if self.status != RunStatus::Running {
            return false;
        }
        self.owner_alive()
            .unwrap_or(now_ms() - self.heartbeat_at <= STALE_AFTER_MS)
    }

    fn owner(&self) -> Option<ProcessIdentity> {
        Some(ProcessIdentity {
            host: self.host.clone()?,
            pid: self.pid?,
            token: self.process_token.clone(),
        })
    }

    fn owner_alive(&self) -> Option<bool> {
        self.owner()?.is_alive()
    }

    /// This running run's process when it is on this machine and provably the run's own (the same
    /// process start time), so a signal can never reach a process that reused the pid.
    pub fn local_process(&self) -> Option<ProcessIdentity> {
        let owner = self.owner()?;
        (self.status == RunStatus::Running && owner.is_alive() == Some(true)).then_some(owner)
    }
}

const RUN_COLUMNS: &str = "r.id, r.name, r.status, r.created_at, r.updated_at, r.heartbeat_at, \
    r.config_json, r.config_hash, r.git_revision, r.seed, r.output_dir, r.notes, r.last_stage, \
    r.last_step, r.error, r.host, r.pid, r.process_token, \
    (SELECT group_concat(tag, char(31)) FROM (SELECT tag FROM run_tags t WHERE t.run_id = r.id ORDER BY tag)) AS tags";

impl Store {
    /// All runs, newest first.
    pub async fn list_runs(&self) -> Result<Vec<RunInfo>, StoreError> {
        let sql = format!("SELECT {RUN_COLUMNS} FROM runs r ORDER BY r.created_at DESC, r.id DESC");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(self.pool())
            .await
            .map_err(self.err("listing runs"))?;
        Ok(rows.iter().map(RunInfo::from_row).collect())
    }

    pub async fn run(&self, id: RunId) -> Result<RunInfo, StoreError> {
        let sql = format!("SELECT {RUN_COLUMNS} FROM runs r WHERE r.id = ?");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(id.0)
            .fetch_optional(self.pool())
            .await
            .map_err(self.err("reading a run"))?;
        row.map(|r| RunInfo::from_row(&r)).ok_or_else(|| {
            StoreError::Run(format!(
                "run {id} does not exist in '{}'",
                self.path().display()
            ))
        })
    }

    /// Find a run by exact name, or by id (`12` or `#12`); an unknown name suggests the closest one.
    pub async fn find_run(&self, reference: &str) -> Result<RunInfo, StoreError> {
        let runs = self.list_runs().await?;
        if let Some(r) = runs.iter().find(|r| r.name == reference) {
            return Ok(r.clone());
        }
        if let Ok(id) = reference.trim_start_matches('#').parse::<i64>()
            && let Some(r) = runs.iter().find(|r| r.id.0 == id)
        {
            return Ok(r.clone());
        }
        let near = runs
            .iter()
            .map(|r| (strsim::jaro_winkler(&r.name, reference), &r.name))
            .filter(|(s, _)| *s > 0.8)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, n)| format!(" (did you mean '{n}'?)"))
            .unwrap_or_default();
        Err(StoreError::Run(format!(
            "no run '{reference}' in store '{}'{near}; 'roll-tui runs' lists them",
            self.path().display()
        )))
    }

    /// Insert a new `running` run. An existing run of that name is refused unless `overwrite`, and
    /// never replaced while its process is alive.
    pub async fn create_run(
        &self,
        new: &NewRun,
        overwrite: bool,
        owner: &ProcessIdentity,
    ) -> Result<RunId, StoreError> {
        if let Some(old) = self.check_name_free(&new.name, overwrite).await? {
            self.delete_run(old).await?;
        }
        self.insert_run(new, owner).await
    }

    /// A run called `name` that failed before its first step (at set-up: a bad dataset, tokenizer or
    /// reward) and left no checkpoint. There is nothing to resume or keep, so a new run of the same
    /// name replaces it without `--overwrite`.
    pub async fn unstarted_failed_run(&self, name: &str) -> Result<Option<RunInfo>, StoreError> {
        let Ok(old) = self.find_run(name).await else {
            return Ok(None);
        };
        if old.name != name || old.status != RunStatus::Failed || old.last_step != 0 {
            return Ok(None);
        }
        let checkpoints: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM checkpoints WHERE run_id = ?")
                .bind(old.id.0)
                .fetch_one(self.pool())
                .await
                .map_err(self.err("counting a run's checkpoints"))?;
        Ok((checkpoints == 0).then_some(old))
    }

    /// Whether a run called `name` may be created: `Ok(Some(id))` names a finished (or dead) run that
    /// `overwrite` will replace; an active run, or an existing one without `overwrite`, is an error.
    pub async fn check_name_free(
        &self,
        name: &str,
        overwrite: bool,
    ) -> Result<Option<RunId>, StoreError> {
        if let Ok(old) = self.find_run(name).await
            && old.name == name
        {
            if old.is_active() {
                return Err(StoreError::Run(format!(
                    "run '{}' is running (pid {} on {}); stop it before starting it again",
                    old.name,
                    old.pid.unwrap_or_default(),
                    old.host.as_deref().unwrap_or("?")
                )));
            }
            if !overwrite {
                let at = match (&old.last_stage, old.stage_steps()) {
                    (Some(stage), Some(total)) => format!(" at {stage} {}/{total}", old.last_step),
                    (Some(stage), None) => format!(" at {stage} step {}", old.last_step),
                    (None, _) => String::new(),
                };
                // Only a run that stopped part-way can be continued.
                let resume = match old.status {
                    RunStatus::Finished => String::new(),
                    _ => format!(
                        ", `{}` to continue it",
                        super::command_line(self.path(), &["resume", &old.name])
                    ),
                };
                return Err(StoreError::Run(format!(
                    "run '{}' already exists in store '{}' ({}{at}); pass --overwrite to replace \
                     it{resume}, or set another 'name'",
                    old.name,
                    self.path().display(),
                    old.status.as_str(),
                )));
            }
            return Ok(Some(old.id));
        }
        Ok(None)
    }

    async fn insert_run(&self, new: &NewRun, owner: &ProcessIdentity) -> Result<RunId, StoreError> {
        let now = now_ms();
        let mut tx = self
            .pool()
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(self.err("creating a run"))?;
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO runs (name, status, created_at, updated_at, heartbeat_at, config_json, \
             config_hash, git_revision, seed, output_dir, host, pid, process_token) \
             VALUES (?, 'running', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(&new.name)
        .bind(now)
        .bind(now)
        .bind(now)
        .bind(&new.config_json)
        .bind(&new.config_hash)
        .bind(&new.git_revision)
        .bind(new.seed as i64)
        .bind(&new.output_dir)
        .bind(&owner.host)
        .bind(owner.pid as i64)
        .bind(&owner.token)
        .fetch_one(&mut *tx)
        .await
        .map_err(self.err("creating a run"))?;
        let event =
            EventRecord::message(EventKind::RunStarted, format!("run '{}' started", new.name));
        insert_event(self, &mut tx, Some(RunId(id)), &event, now).await?;
        tx.commit().await.map_err(self.err("creating a run"))?;
        Ok(RunId(id))
    }

    /// Delete a run and everything recorded for it (checkpoint directories stay on disk).
    pub async fn delete_run(&self, id: RunId) -> Result<(), StoreError> {
        let run = self.run(id).await?;
        if run.is_active() {
            return Err(StoreError::Run(format!(
                "run '{}' is running (pid {}); refusing to delete it",
                run.name,
                run.pid.unwrap_or_default()
            )));
        }
        sqlx::query("DELETE FROM runs WHERE id = ?")
            .bind(id.0)
            .execute(self.pool())
            .await
            .map_err(self.err("deleting a run"))?;
        Ok(())
    }

    pub async fn set_notes(&self, id: RunId, notes: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE runs SET notes = ?, updated_at = ? WHERE id = ?")
            .bind(notes)
            .bind(now_ms())
            .bind(id.0)
            .execute(self.pool())
            .await
            .map_err(self.err("writing notes"))?;
        Ok(())
    }

    pub async fn add_tags(&self, id: RunId, tags: &[String]) -> Result<(), StoreError> {
        for tag in tags {
            sqlx::query("INSERT OR IGNORE INTO run_tags (run_id, tag) VALUES (?, ?)")
                .bind(id.0)
                .bind(tag)
                .execute(self.pool())
                .await
                .map_err(self.err("adding a tag"))?;
        }
        Ok(())
    }

    pub async fn remove_tags(&self, id: RunId, tags: &[String]) -> Result<(), StoreError> {
        for tag in tags {
            sqlx::query("DELETE FROM run_tags WHERE run_id = ? AND tag = ?")
                .bind(id.0)
                .bind(tag)
                .execute(self.pool())
                .await
                .map_err(self.err("removing a tag"))?;
        }
        Ok(())
    }
}
