//! Exports a run's metric series as chart images (PNG, SVG), a long-format CSV and a TensorBoard
//! event file.
//!
//! This module owns the export API, the output formats and their errors. Which series go into which
//! chart lives in `plot/select.rs`, the drawing in `plot/chart.rs` (colours in `plot/palette.rs`,
//! data preparation in `plot/points.rs`), the CSV format in `plot/csv_io.rs` and TensorBoard's in
//! `plot/tensorboard.rs`. It only reads
//! [`Series`] values: it never opens the store or knows how a run produced its numbers.
//!
//! Output of [`export_run`] in `out/`:
//! - one file per chart and image format, named after the chart (`reward.png`, `reward.svg`, ...).
//!   Charts: `reward` (`reward/<domain>/mean`), `accuracy` (`score/<domain>/accuracy`), `loss`
//!   (`actor/pg_loss`, `critic/value_loss`, `sft/loss`), `kl`, `entropy`, `response_length` (mean,
//!   max) and `timings` (`time/*`). A chart never mixes stages: rl series get the plain name, every
//!   other stage's get a prefixed one (`sft_loss`, `sft_timings`); see `plot/select.rs`;
//! - `metrics.csv` with every series when [`ExportFormat::Csv`] is requested;
//! - `events.out.tfevents.<start>.roll-tui` with every series when [`ExportFormat::Tensorboard`] is
//!   requested (`tensorboard --logdir` on `out/` or a folder above it shows the run).
//!
//! With no series at all no chart is drawn; `metrics.csv` is still written (header only) when CSV is
//! requested, so scripts reading it always find the file.

pub mod axis;
mod chart;
mod csv_io;
mod glyphs;
mod palette;
pub use palette::curve_rgb;
mod points;
pub(crate) mod select;
pub mod tensorboard;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::metrics::Series;

pub use csv_io::{read_csv, write_csv, write_csv_to};

/// The file name of the all-series CSV written by [`export_run`].
pub const CSV_FILE_NAME: &str = "metrics.csv";

/// Charts smaller than this (in pixels, either side) have no room for axes and legend.
const MIN_SIDE: u32 = 160;
/// Largest side: plotters indexes its bitmap with `u32` arithmetic and panics far below
/// 100,000 x 100,000 (40 GB of pixels); 8,000 pixels is a 256 MB bitmap.
const MAX_SIDE: u32 = 8_000;

/// An output format of [`export_run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExportFormat {
    Png,
    Svg,
    Csv,
    Tensorboard,
}

impl ExportFormat {
    pub const ALL: [ExportFormat; 4] = [
        ExportFormat::Png,
        ExportFormat::Svg,
        ExportFormat::Csv,
        ExportFormat::Tensorboard,
    ];

    /// The name used on the command line (and as the file extension of the charts).
    pub fn name(self) -> &'static str {
        match self {
            ExportFormat::Png => "png",
            ExportFormat::Svg => "svg",
            ExportFormat::Csv => "csv",
            ExportFormat::Tensorboard => "tensorboard",
        }
    }

    /// Every format's name, comma-separated, for help and errors.
    pub fn names() -> String {
        let names: Vec<&str> = ExportFormat::ALL.iter().map(|f| f.name()).collect();
        names.join(", ")
    }
}

impl fmt::Display for ExportFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ExportFormat {
    type Err = PlotError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        ExportFormat::ALL
            .into_iter()
            .find(|f| f.name() == lower)
            .ok_or_else(|| PlotError::UnknownFormat(s.to_string(), ExportFormat::names()))
    }
}

/// What [`export_run`] writes and how large the images are.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportOptions {
    pub formats: Vec<ExportFormat>,
    /// Image width in pixels (SVG: user units).
    pub width: u32,
    /// Image height in pixels (SVG: user units).
    pub height: u32,
    /// When the run started, in seconds since the epoch: the series' wall times count from it
    /// (TensorBoard's wall-clock axis).
    pub started_at: f64,
}

impl Default for ExportOptions {
    fn default() -> Self {
        Self {
            formats: ExportFormat::ALL.to_vec(),
            width: 1200,
            height: 700,
            started_at: 0.0,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("unknown export format '{0}' (valid: {1})")]
    UnknownFormat(String, String),
    #[error(
        "plot size {width}x{height} is out of range (each side must be {MIN_SIDE} to {MAX_SIDE} pixels)"
    )]
    InvalidSize { width: u32, height: u32 },
    #[error("the embedded plot font 'DejaVuSansMono.ttf' could not be loaded")]
    Font,
    #[error(
        "series '{stage}' '{key}' is ragged: {steps} steps, {wall_times} wall times and {values} values"
    )]
    RaggedSeries {
        stage: String,
        key: String,
        steps: usize,
        wall_times: usize,
        values: usize,
    },
    #[error("plot '{}': {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("plot '{}': drawing failed: {message}", path.display())]
    Draw { path: PathBuf, message: String },
    #[error("csv '{}': {source}", path.display())]
    Csv { path: PathBuf, source: csv::Error },
    #[error("csv output: {source}")]
    CsvOutput { source: csv::Error },
    #[error("csv '{}' line {line}: {message}", path.display())]
    BadCsv {
        path: PathBuf,
        line: u64,
        message: String,
    },
}

/// Writes the charts and CSV files into `out` (created if missing) and returns the paths written:
/// charts first (in the order of the chart table in `plot/select.rs`, each chart in the order of
/// `opts.formats`), then `metrics.csv`, then the TensorBoard event file. A chart none of whose series exist (or have a finite point)
/// is skipped.
pub fn export_run(
    run_name: &str,
    series: &[Series],
    out: &Path,
    opts: &ExportOptions,
) -> Result<Vec<PathBuf>, PlotError> {
    let side = MIN_SIDE..=MAX_SIDE;
    if !side.contains(&opts.width) || !side.contains(&opts.height) {
        return Err(PlotError::InvalidSize {
            width: opts.width,
            height: opts.height,
        });
    }
    check_lengths(series)?;
    std::fs::create_dir_all(out).map_err(|source| PlotError::Io {
        path: out.to_path_buf(),
        source,
    })?;

    let mut formats = Vec::new();
    for f in &opts.formats {
        if !formats.contains(f) {
            formats.push(*f);
        }
    }

    let mut written = Vec::new();
    let charts = select::plan_charts(series);
    for plan in &charts {
        for format in &formats {
            let path = out.join(format!("{}.{}", plan.file_stem, format.name()));
            let size = (opts.width, opts.height);
            match format {
                ExportFormat::Png => chart::draw_png(run_name, plan, &path, size)?,
                ExportFormat::Svg => chart::draw_svg(run_name, plan, &path, size)?,
                ExportFormat::Csv | ExportFormat::Tensorboard => continue,
            }
            written.push(path);
        }
    }
    if formats.contains(&ExportFormat::Csv) {
        let path = out.join(CSV_FILE_NAME);
        write_csv(series, &path)?;
        written.push(path);
    }
    if formats.contains(&ExportFormat::Tensorboard) {
        written.push(tensorboard::write_events(series, out, opts.started_at)?);
    }
    Ok(written)
}

/// Rejects series whose parallel vectors disagree in length, before anything is written.
fn check_lengths(series: &[Series]) -> Result<(), PlotError> {
    for s in series {
        let (steps, wall_times, values) = (s.steps.len(), s.wall_time.len(), s.values.len());
        if steps != wall_times || steps != values {
            return Err(PlotError::RaggedSeries {
                stage: s.stage.clone(),
                key: s.key.clone(),
                steps,
                wall_times,
                values,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A series with `values` at steps 1, 2, ... and wall time 10 s per step.
    pub(crate) fn series(stage: &str, key: &str, values: &[f64]) -> Series {
        let steps: Vec<u64> = (1..=values.len() as u64).collect();
        Series {
            stage: stage.to_string(),
            key: key.to_string(),
            wall_time: steps.iter().map(|s| *s as f64 * 10.0).collect(),
            steps,
            values: values.to_vec(),
        }
    }

    #[test]
    fn formats_parse_and_name_the_valid_ones() {
        assert_eq!("png".parse::<ExportFormat>().unwrap(), ExportFormat::Png);
        assert_eq!(" SVG ".parse::<ExportFormat>().unwrap(), ExportFormat::Svg);
        assert_eq!("csv".parse::<ExportFormat>().unwrap(), ExportFormat::Csv);
        let err = "jpeg".parse::<ExportFormat>().unwrap_err().to_string();
        assert_eq!(
            err,
            "unknown export format 'jpeg' (valid: png, svg, csv, tensorboard)"
        );
    }

    #[test]
    fn typical_rl_run_writes_charts_then_csv() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("nested/out");
        let input = vec![
            series("sft", "sft/loss", &[2.0, 1.5, 1.2]),
            series("rl", "reward/math/mean", &[0.1, 0.3, 0.5]),
            series("rl", "reward/code/mean", &[0.0, 0.2, 0.2]),
            series("rl", "actor/kl", &[0.0, 0.01, 0.02]),
            series("rl", "time/rollout", &[3.0, 3.1, 2.9]),
            series("rl", "time/train", &[1.0, 1.1, 0.9]),
        ];
        let opts = ExportOptions {
            width: 400,
            height: 300,
            ..ExportOptions::default()
        };
        let written = export_run("demo", &input, &out, &opts).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        let expected = [
            "reward.png",
            "reward.svg",
            "sft_loss.png",
            "sft_loss.svg",
            "kl.png",
            "kl.svg",
            "timings.png",
            "timings.svg",
            "metrics.csv",
            "events.out.tfevents.0.roll-tui",
        ];
        assert_eq!(names, expected);
        for path in &written {
            assert!(
                std::fs::metadata(path).unwrap().len() > 0,
                "{}",
                path.display()
            );
        }
        assert_eq!(read_csv(&out.join(CSV_FILE_NAME)).unwrap(), input);
    }

    #[test]
    fn empty_input_writes_only_a_csv_header_and_a_versioned_event_file() {
        let dir = tempfile::tempdir().unwrap();
        let written = export_run("empty", &[], dir.path(), &ExportOptions::default()).unwrap();
        let events = dir.path().join("events.out.tfevents.0.roll-tui");
        assert_eq!(written, vec![dir.path().join(CSV_FILE_NAME), events]);
        let text = std::fs::read_to_string(&written[0]).unwrap();
        assert_eq!(text, "stage,key,step,wall_time,value\n");

        let png_only = ExportOptions {
            formats: vec![ExportFormat::Png],
            ..ExportOptions::default()
        };
        assert!(
            export_run("empty", &[], dir.path(), &png_only)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn bad_size_and_ragged_series_are_errors_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        let tiny = ExportOptions {
            width: 0,
            ..ExportOptions::default()
        };
        let err = export_run("r", &[], dir.path(), &tiny)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "plot size 0x700 is out of range (each side must be 160 to 8000 pixels)"
        );
        // 100000 x 100000 used to panic inside plotters.
        let huge = ExportOptions {
            width: 100_000,
            height: 100_000,
            ..ExportOptions::default()
        };
        let err = export_run("r", &[series("rl", "k", &[1.0])], dir.path(), &huge).unwrap_err();
        assert_eq!(
            err.to_string(),
            "plot size 100000x100000 is out of range (each side must be 160 to 8000 pixels)"
        );

        let mut ragged = series("rl", "actor/kl", &[1.0, 2.0]);
        ragged.wall_time.pop();
        let out = dir.path().join("never");
        let err = export_run("r", &[ragged], &out, &ExportOptions::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "series 'rl' 'actor/kl' is ragged: 2 steps, 1 wall times and 2 values"
        );
        assert!(!out.exists());
    }
}
