//! The long-format metrics CSV: one row per point, `stage,key,step,wall_time,value`.
//!
//! Numbers are written so that parsing them back gives the same bits: Rust's shortest round-trip
//! formatting, in plain notation for everyday magnitudes and in exponent notation for tiny or huge
//! ones (so `1e-300` is not 300 zeros). NaN and infinities are written as `NaN`, `inf`, `-inf`.
//! This file owns only the format; choosing what to export is [`super::export_run`]'s job.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use super::PlotError;
use crate::metrics::Series;

const HEADER: [&str; 5] = ["stage", "key", "step", "wall_time", "value"];

/// Writes `series` as long-format CSV with a header row (also when `series` is empty).
pub fn write_csv(series: &[Series], path: &Path) -> Result<(), PlotError> {
    super::check_lengths(series)?;
    let csv_err = |source| PlotError::Csv {
        path: path.to_path_buf(),
        source,
    };
    let writer = csv::Writer::from_path(path).map_err(csv_err)?;
    write_rows(series, writer).map_err(csv_err)
}

/// [`write_csv`] to any writer (e.g. standard output).
pub fn write_csv_to<W: Write>(series: &[Series], out: W) -> Result<(), PlotError> {
    super::check_lengths(series)?;
    write_rows(series, csv::Writer::from_writer(out))
        .map_err(|source| PlotError::CsvOutput { source })
}

fn write_rows<W: Write>(series: &[Series], mut writer: csv::Writer<W>) -> Result<(), csv::Error> {
    writer.write_record(HEADER)?;
    for s in series {
        for ((step, wall), value) in s.steps.iter().zip(&s.wall_time).zip(&s.values) {
            let row = [
                s.stage.clone(),
                s.key.clone(),
                step.to_string(),
                format_f64(*wall),
                format_f64(*value),
            ];
            writer.write_record(&row)?;
        }
    }
    writer.flush()?;
    Ok(())
}

/// Reads a file written by [`write_csv`]: rows are grouped into one [`Series`] per (stage, key), in
/// the order each pair first appears; points keep the file's order.
pub fn read_csv(path: &Path) -> Result<Vec<Series>, PlotError> {
    let csv_err = |source| PlotError::Csv {
        path: path.to_path_buf(),
        source,
    };
    let bad = |line: u64, message: String| PlotError::BadCsv {
        path: path.to_path_buf(),
        line,
        message,
    };
    let mut reader = csv::Reader::from_path(path).map_err(csv_err)?;
    let header = reader.headers().map_err(csv_err)?;
    if header.iter().ne(HEADER) {
        let found = header.iter().collect::<Vec<_>>().join(",");
        return Err(bad(
            1,
            format!("header is '{found}', expected '{}'", HEADER.join(",")),
        ));
    }

    let mut series: Vec<Series> = Vec::new();
    let mut index: HashMap<(String, String), usize> = HashMap::new();
    for record in reader.records() {
        let record = record.map_err(csv_err)?;
        let line = record.position().map_or(0, |p| p.line());
        let field = |i: usize| record.get(i).unwrap_or_default();
        let (stage, key) = (field(0), field(1));
        let step: u64 = field(2)
            .parse()
            .map_err(|_| bad(line, format!("step '{}' is not a whole number", field(2))))?;
        let wall_time = parse_f64(field(3))
            .ok_or_else(|| bad(line, format!("wall_time '{}' is not a number", field(3))))?;
        let value = parse_f64(field(4))
            .ok_or_else(|| bad(line, format!("value '{}' is not a number", field(4))))?;

        let slot = *index
            .entry((stage.to_string(), key.to_string()))
            .or_insert_with(|| {
                series.push(Series {
                    stage: stage.to_string(),
                    key: key.to_string(),
                    ..Series::default()
                });
                series.len() - 1
            });
        let s = &mut series[slot];
        s.steps.push(step);
        s.wall_time.push(wall_time);
        s.values.push(value);
    }
    Ok(series)
}

/// Shortest text that parses back to the same bits.
fn format_f64(v: f64) -> String {
    let magnitude = v.abs();
    if v == 0.0 || !v.is_finite() || (1e-5..1e16).contains(&magnitude) {
        // `{}` prints "-0" for -0.0, "NaN", "inf" and "-inf", all of which `str::parse` accepts.
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

fn parse_f64(text: &str) -> Option<f64> {
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::tests::series;

    fn assert_same_bits(a: &[Series], b: &[Series]) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert_eq!((&x.stage, &x.key, &x.steps), (&y.stage, &y.key, &y.steps));
            let bits = |v: &[f64]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&x.values), bits(&y.values), "{}", x.key);
            assert_eq!(bits(&x.wall_time), bits(&y.wall_time), "{}", x.key);
        }
    }

    #[test]
    fn round_trip_keeps_every_bit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        let awkward = vec![
            0.1 + 0.2,
            1e-300,
            -0.0,
            0.0,
            f64::MIN_POSITIVE,
            5e-324,
            f64::MAX,
            -f64::MAX,
            1.0 / 3.0,
            123_456_789.123_456_79,
            1e16,
            -2.5e-7,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        let mut big_steps = series("rl", "reward/math,with comma/mean", &awkward);
        big_steps.steps = (0..awkward.len() as u64)
            .map(|i| u64::MAX - 20 + i)
            .collect();
        big_steps.wall_time = awkward.iter().rev().copied().collect();
        let input = vec![
            series("sft", "sft/loss", &[2.0, 1.0]),
            big_steps,
            series("rl", "\"quoted\" key", &[0.5]),
            series("rl", "actor/kl", &[]),
        ];
        write_csv(&input, &path).unwrap();
        let back = read_csv(&path).unwrap();
        // The empty series has no rows, so it cannot come back.
        assert_same_bits(&input[..3], &back);

        let mut bytes = Vec::new();
        write_csv_to(&input, &mut bytes).unwrap();
        assert_eq!(bytes, std::fs::read(&path).unwrap());
    }

    #[test]
    fn groups_interleaved_rows_in_first_appearance_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.csv");
        let text = "stage,key,step,wall_time,value\n\
                    rl,b,1,0.5,1\nrl,a,1,0.5,2\nsft,b,1,0.1,3\nrl,b,2,1.5,4\n";
        std::fs::write(&path, text).unwrap();
        let back = read_csv(&path).unwrap();
        let summary: Vec<(&str, &str, Vec<u64>, Vec<f64>)> = back
            .iter()
            .map(|s| {
                (
                    s.stage.as_str(),
                    s.key.as_str(),
                    s.steps.clone(),
                    s.values.clone(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("rl", "b", vec![1, 2], vec![1.0, 4.0]),
                ("rl", "a", vec![1], vec![2.0]),
                ("sft", "b", vec![1], vec![3.0]),
            ]
        );
        assert_eq!(back[0].wall_time, vec![0.5, 1.5]);
    }

    #[test]
    fn bad_files_name_the_file_line_and_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.csv");
        std::fs::write(
            &path,
            "stage,key,step,wall_time,value\nrl,a,1,0,1\nrl,a,x2,0,1\n",
        )
        .unwrap();
        let err = read_csv(&path).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "csv '{}' line 3: step 'x2' is not a whole number",
                path.display()
            )
        );

        std::fs::write(&path, "step,value\n1,2\n").unwrap();
        let err = read_csv(&path).unwrap_err().to_string();
        assert!(
            err.ends_with(
                "line 1: header is 'step,value', expected 'stage,key,step,wall_time,value'"
            ),
            "{err}"
        );

        let missing = dir.path().join("missing.csv");
        let err = read_csv(&missing).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("csv '{}': ", missing.display())),
            "{err}"
        );
    }
}
