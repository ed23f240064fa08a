//! Direct writes for saved debug sessions: a finished run that holds them, and one trajectory at a
//! time. Training runs write through the writer task; a debug session writes once, when saved.

use super::inserts::insert_trajectory;
use super::liveness::ProcessIdentity;
use super::records::TrajectoryRecord;
use super::runs::NewRun;
use super::{RunId, Store, StoreError, now_ms};

impl Store {
    /// Create `new` as a finished run tagged `debug` (it records debug sessions; nothing trains
    /// in it). The name must be free.
    pub async fn create_debug_run(&self, new: &NewRun) -> Result<RunId, StoreError> {
        let id = self
            .create_run(new, false, &ProcessIdentity::current())
            .await?;
        sqlx::query(
            "UPDATE runs SET status = 'finished', updated_at = ?, host = NULL, pid = NULL, \
             process_token = NULL WHERE id = ?",
        )
        .bind(now_ms())
        .bind(id.0)
        .execute(self.pool())
        .await
        .map_err(self.err("creating a debug run"))?;
        self.add_tags(id, &["debug".to_string()]).await?;
        Ok(id)
    }

    /// Store one trajectory of `run` now.
    pub async fn add_trajectory(&self, run: RunId, t: &TrajectoryRecord) -> Result<(), StoreError> {
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(self.err("saving a trajectory"))?;
        insert_trajectory(self, &mut tx, run, t).await?;
        tx.commit().await.map_err(self.err("saving a trajectory"))?;
        Ok(())
    }
}
