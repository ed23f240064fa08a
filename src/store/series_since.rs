//! Reading a live run's series a little at a time: a reader keeps a [`SeriesMark`] of how far it
//! has read, and [`Store::series_since`] answers with only the points after it. A run that is
//! followed for hours is then read in a few rows per poll instead of all of its chunks.
//!
//! Appending is the only change a run makes to its points while one process owns it. A resume is
//! the exception (it deletes what came after its checkpoint and writes those steps again), and it
//! always makes a new process the owner: so a mark remembers the owner, and a reader whose mark
//! names another owner gets every series whole again.

use std::collections::BTreeMap;

use sqlx::Row;

use super::{RunId, Store, StoreError};
use crate::metrics::Series;

/// How far a reader has read a run's series.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeriesMark {
    /// The process that owned the run (host, pid and start token) when it was read.
    owner: String,
    /// By (stage, key): the last step read, or `None` for a series that had no point yet.
    last: BTreeMap<(String, String), Option<u64>>,
}

impl SeriesMark {
    /// How many series the mark knows.
    pub fn len(&self) -> usize {
        self.last.len()
    }

    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }
}

/// What changed in a run's series since a mark.
#[derive(Debug, Clone, PartialEq)]
pub enum SeriesUpdate {
    /// Every series, whole: there was no mark, or it no longer applies (the run was resumed).
    Whole(Vec<Series>),
    /// For each series with points after the mark, only those points; a series the mark does
    /// not know comes whole (possibly empty). Series without news are left out.
    Appended(Vec<Series>),
}

/// The answer of [`Store::series_since`]: the update and the mark to ask with next time.
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesRead {
    pub update: SeriesUpdate,
    pub mark: SeriesMark,
}

impl SeriesRead {
    /// Every series, whole, with no mark to go on from (the next read is whole again).
    pub fn whole(series: Vec<Series>) -> SeriesRead {
        SeriesRead {
            update: SeriesUpdate::Whole(series),
            mark: SeriesMark::default(),
        }
    }
}

impl Store {
    /// The run's series since `mark` (every series whole without one), from one snapshot.
    pub async fn series_since(
        &self,
        run: RunId,
        mark: Option<&SeriesMark>,
    ) -> Result<SeriesRead, StoreError> {
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(self.err("loading metric series"))?;
        let owner =
            sqlx::query("SELECT created_at, host, pid, process_token FROM runs WHERE id = ?")
                .bind(run.0)
                .fetch_optional(&mut *tx)
                .await
                .map_err(self.err("loading metric series"))?
                .ok_or_else(|| StoreError::Run(format!("run {} is not in the store", run.0)))?;
        let owner = format!(
            "{}|{}|{}|{}",
            owner.get::<i64, _>(0),
            owner.get::<Option<String>, _>(1).unwrap_or_default(),
            owner.get::<Option<i64>, _>(2).unwrap_or_default(),
            owner.get::<Option<String>, _>(3).unwrap_or_default(),
        );
        let mark = mark.filter(|m| m.owner == owner);
        let mut next = SeriesMark {
            owner,
            last: BTreeMap::new(),
        };
        let mut series = vec![];
        for row in self.series_rows(&mut tx, run).await? {
            let id = (row.stage.clone(), row.key.clone());
            let known = mark.and_then(|m| m.last.get(&id).copied());
            let read = self.read_points(&mut tx, &row, known.flatten()).await?;
            let last = read.steps.last().copied().or(known.flatten());
            next.last.insert(id, last);
            // A known series without news is left out; a new one is sent even while empty.
            if known.is_none() || !read.is_empty() {
                series.push(read);
            }
        }
        tx.rollback()
            .await
            .map_err(self.err("loading metric series"))?;
        let update = match mark {
            Some(_) => SeriesUpdate::Appended(series),
            None => SeriesUpdate::Whole(series),
        };
        Ok(SeriesRead { update, mark: next })
    }
}
