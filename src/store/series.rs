//! Metric series on disk: points are packed into chunks (see `migrations/0001_store.sql`), so a
//! 100k-step run loads in a few thousand rows instead of millions.

use globset::GlobMatcher;
use sqlx::Row;

use super::{RunId, Store, StoreError};
use crate::metrics::Series;

/// Bytes per packed point: step u64, wall_time f64, value f64, little-endian.
pub const POINT_BYTES: usize = 24;
/// Points per chunk before the writer starts a new one.
pub const CHUNK_POINTS: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub step: u64,
    pub wall_time: f64,
    pub value: f64,
}

pub fn encode(points: &[Point]) -> Vec<u8> {
    let mut out = Vec::with_capacity(points.len() * POINT_BYTES);
    for p in points {
        out.extend_from_slice(&p.step.to_le_bytes());
        out.extend_from_slice(&p.wall_time.to_le_bytes());
        out.extend_from_slice(&p.value.to_le_bytes());
    }
    out
}

/// Appends the points of `data` to `series`; `None` when the blob is not a whole number of points.
pub fn decode_into(data: &[u8], series: &mut Series) -> Option<()> {
    if !data.len().is_multiple_of(POINT_BYTES) {
        return None;
    }
    for rec in data.chunks_exact(POINT_BYTES) {
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&rec[i * 8..i * 8 + 8]);
            b
        };
        series.steps.push(u64::from_le_bytes(word(0)));
        series.wall_time.push(f64::from_le_bytes(word(1)));
        series.values.push(f64::from_le_bytes(word(2)));
    }
    Some(())
}

/// Sort by step and keep the last point written for a step (a resumed run rewrites its steps).
fn normalise(series: &mut Series) {
    let sorted = series.steps.windows(2).all(|w| w[0] < w[1]);
    if sorted {
        return;
    }
    let mut idx: Vec<usize> = (0..series.steps.len()).collect();
    idx.sort_by_key(|&i| series.steps[i]); // stable: later writes stay later
    let mut keep: Vec<usize> = Vec::with_capacity(idx.len());
    for i in idx {
        match keep.last_mut() {
            Some(last) if series.steps[*last] == series.steps[i] => *last = i,
            _ => keep.push(i),
        }
    }
    *series = Series {
        stage: std::mem::take(&mut series.stage),
        key: std::mem::take(&mut series.key),
        steps: keep.iter().map(|&i| series.steps[i]).collect(),
        wall_time: keep.iter().map(|&i| series.wall_time[i]).collect(),
        values: keep.iter().map(|&i| series.values[i]).collect(),
    };
}

/// One series of a run as listed (without its points).
#[derive(Debug, Clone, PartialEq)]
pub struct SeriesInfo {
    pub stage: String,
    pub key: String,
    pub points: u64,
    pub last_step: Option<u64>,
    pub last_value: Option<f64>,
}

impl Store {
    /// The series of a run with their latest values, ordered by stage then key.
    pub async fn list_series(&self, run: RunId) -> Result<Vec<SeriesInfo>, StoreError> {
        let rows = sqlx::query(
            "SELECT stage, key, points, last_step, last_value FROM metric_series WHERE run_id = ? \
             ORDER BY CASE stage WHEN 'sft' THEN 0 WHEN 'rl' THEN 1 ELSE 2 END, stage, key",
        )
        .bind(run.0)
        .fetch_all(self.pool())
        .await
        .map_err(self.err("listing metric series"))?;
        Ok(rows
            .into_iter()
            .map(|r| SeriesInfo {
                stage: r.get("stage"),
                key: r.get("key"),
                points: r.get::<i64, _>("points") as u64,
                last_step: r.get::<Option<i64>, _>("last_step").map(|s| s as u64),
                last_value: r.get("last_value"),
            })
            .collect())
    }

    /// Every point of the run's series whose key matches `filter` (all when `None`).
    pub async fn load_series(
        &self,
        run: RunId,
        filter: Option<&GlobMatcher>,
    ) -> Result<Vec<Series>, StoreError> {
        // One read transaction: every series comes from the same snapshot, even while the writer commits.
        let mut tx = self
            .pool()
            .begin()
            .await
            .map_err(self.err("loading metric series"))?;
        let mut out = vec![];
        for listed in self.series_rows(&mut tx, run).await? {
            if filter.is_some_and(|g| !g.is_match(&listed.key)) {
                continue;
            }
            out.push(self.read_points(&mut tx, &listed, None).await?);
        }
        tx.rollback()
            .await
            .map_err(self.err("loading metric series"))?;
        Ok(out)
    }

    /// The run's series rows, in the order readers show them (see [`display_order`]).
    pub(super) async fn series_rows(
        &self,
        tx: &mut sqlx::SqliteConnection,
        run: RunId,
    ) -> Result<Vec<SeriesRow>, StoreError> {
        let rows = sqlx::query(
            "SELECT id, stage, key, points FROM metric_series WHERE run_id = ? \
             ORDER BY CASE stage WHEN 'sft' THEN 0 WHEN 'rl' THEN 1 ELSE 2 END, stage, key",
        )
        .bind(run.0)
        .fetch_all(&mut *tx)
        .await
        .map_err(self.err("loading metric series"))?;
        Ok(rows
            .into_iter()
            .map(|r| SeriesRow {
                id: r.get(0),
                stage: r.get(1),
                key: r.get(2),
                points: r.get::<i64, _>(3).max(0) as usize,
            })
            .collect())
    }

    /// The points of `row` after step `after` (all when `None`), sorted by step, one per step.
    pub(super) async fn read_points(
        &self,
        tx: &mut sqlx::SqliteConnection,
        row: &SeriesRow,
        after: Option<u64>,
    ) -> Result<Series, StoreError> {
        let mut series = Series {
            stage: row.stage.clone(),
            key: row.key.clone(),
            ..Default::default()
        };
        if after.is_none() {
            series.steps.reserve(row.points);
            series.wall_time.reserve(row.points);
            series.values.reserve(row.points);
        }
        // Walks the (series_id, first_step) index: SQLite streams the blobs without sorting them.
        // Only chunks reaching past `after` can hold newer points (a chunk's steps only grow).
        let query = match after {
            None => sqlx::query(
                "SELECT data FROM metric_chunks WHERE series_id = ? ORDER BY first_step, id",
            )
            .bind(row.id),
            Some(step) => sqlx::query(
                "SELECT data FROM metric_chunks WHERE series_id = ? AND last_step > ? \
                 ORDER BY first_step, id",
            )
            .bind(row.id)
            .bind(step as i64),
        };
        let chunks = query
            .fetch_all(&mut *tx)
            .await
            .map_err(self.err("loading metric series"))?;
        for chunk in chunks {
            let data: &[u8] = chunk.get(0);
            decode_into(data, &mut series).ok_or_else(|| StoreError::Corrupt {
                path: self.path().into(),
                detail: format!(
                    "metric chunk of '{}' has {} bytes, not a multiple of {POINT_BYTES}",
                    series.key,
                    data.len()
                ),
            })?;
        }
        normalise(&mut series);
        if let Some(after) = after {
            let keep = series.steps.partition_point(|&s| s <= after);
            series.steps.drain(..keep);
            series.wall_time.drain(..keep);
            series.values.drain(..keep);
        }
        Ok(series)
    }
}

/// A series as listed in the store, before its points are read.
pub(super) struct SeriesRow {
    id: i64,
    pub stage: String,
    pub key: String,
    points: usize,
}

/// The order readers get a run's series in: the stages in the order a run goes through them,
/// then other stages by name; by key within a stage.
pub fn display_order<'a>(stage: &'a str, key: &'a str) -> (usize, &'a str, &'a str) {
    (crate::names::Stage::rank_of(stage), stage, key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn points_round_trip_bit_exactly() {
        let pts = vec![
            Point {
                step: 1,
                wall_time: 0.1 + 0.2,
                value: -0.0,
            },
            Point {
                step: u64::MAX,
                wall_time: 1e-300,
                value: f64::NAN,
            },
        ];
        let bytes = encode(&pts);
        assert_eq!(bytes.len(), 48);
        let mut s = Series::default();
        decode_into(&bytes, &mut s).unwrap();
        assert_eq!(s.steps, vec![1, u64::MAX]);
        assert_eq!(s.wall_time[0].to_bits(), (0.1f64 + 0.2).to_bits());
        assert_eq!(s.values[0].to_bits(), (-0.0f64).to_bits());
        assert!(s.values[1].is_nan());
        assert!(decode_into(&bytes[..47], &mut s).is_none());
    }

    #[test]
    fn rewritten_steps_keep_the_last_write() {
        let mut s = Series {
            steps: vec![1, 2, 3, 2, 3, 4],
            wall_time: vec![0.0; 6],
            values: vec![1.0, 2.0, 3.0, 20.0, 30.0, 40.0],
            ..Default::default()
        };
        normalise(&mut s);
        assert_eq!(s.steps, vec![1, 2, 3, 4]);
        assert_eq!(s.values, vec![1.0, 20.0, 30.0, 40.0]);
    }
}
