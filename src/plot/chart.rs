//! Draws one planned chart as a PNG or SVG line chart: value against step, one coloured line per
//! series, a legend, the run name in the title.
//!
//! Owns the embedded font and the layout. A run of a single finite point (a one-point series, or a
//! point between NaNs) is drawn as a dot, since a line needs two. It never decides which series
//! belong together ([`super::select`]), which colours to use ([`super::palette`]) or how to treat
//! awkward values ([`super::points`]).

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use super::PlotError;
use super::palette::{BACKGROUND, curve_color};
use super::points::{finite_runs, ranges};
use super::select::ChartPlan;

/// DejaVu Sans Mono (license in `fonts/DejaVu-LICENSE`). CI machines have no system fonts, so every
/// text draw needs this one registered.
pub(super) const FONT_BYTES: &[u8] = include_bytes!("fonts/DejaVuSansMono.ttf");
/// Registered as "sans-serif" because that is the family plotters uses for its own default text.
const FONT: &str = "sans-serif";

/// Registers the embedded font once per process.
fn ensure_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| register_font(FONT, FontStyle::Normal, FONT_BYTES).is_ok());
    if ok { Ok(()) } else { Err(PlotError::Font) }
}

/// The corner of the plot with the fewest data points (upper right first among equals), where
/// the legend covers the least.
fn legend_corner(plan: &ChartPlan<'_>) -> SeriesLabelPosition {
    let (x, y) = ranges(plan);
    let (x0, xw) = (
        x.start as f64,
        (x.end.saturating_sub(x.start)).max(1) as f64,
    );
    let (y0, yh) = (y.start, (y.end - y.start).max(f64::MIN_POSITIVE));
    // Counts in the upper-right, upper-left, lower-right and lower-left quarters.
    let mut counts = [0usize; 4];
    for s in &plan.lines {
        for (step, v) in s.steps.iter().zip(&s.values).filter(|(_, v)| v.is_finite()) {
            let right = (*step as f64 - x0) / xw >= 0.5;
            let upper = (v - y0) / yh >= 0.5;
            counts[usize::from(!upper) * 2 + usize::from(!right)] += 1;
        }
    }
    let corners = [
        SeriesLabelPosition::UpperRight,
        SeriesLabelPosition::UpperLeft,
        SeriesLabelPosition::LowerRight,
        SeriesLabelPosition::LowerLeft,
    ];
    let best = (0..4).min_by_key(|&i| counts[i]).unwrap_or(0);
    corners[best].clone()
}

pub(crate) fn draw_png(
    run_name: &str,
    plan: &ChartPlan<'_>,
    path: &Path,
    size: (u32, u32),
) -> Result<(), PlotError> {
    ensure_font()?;
    let font = ab_glyph::FontRef::try_from_slice(FONT_BYTES).map_err(|_| PlotError::Font)?;
    let backend = super::glyphs::TextFix {
        inner: BitMapBackend::new(path, size),
        font: &font,
    };
    let root = backend.into_drawing_area();
    draw(&root, run_name, plan).map_err(|message| PlotError::Draw {
        path: path.to_path_buf(),
        message,
    })
}

pub(crate) fn draw_svg(
    run_name: &str,
    plan: &ChartPlan<'_>,
    path: &Path,
    size: (u32, u32),
) -> Result<(), PlotError> {
    ensure_font()?;
    // Drawn into a string so that a failed write reports the IO error itself.
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, size).into_drawing_area();
        draw(&root, run_name, plan).map_err(|message| PlotError::Draw {
            path: path.to_path_buf(),
            message,
        })?;
    }
    std::fs::write(path, svg).map_err(|source| PlotError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    run_name: &str,
    plan: &ChartPlan<'_>,
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&BACKGROUND).map_err(err)?;
    let (x_range, y_range) = ranges(plan);
    let mut chart = ChartBuilder::on(root)
        .caption(format!("{run_name}: {}", plan.title), (FONT, 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(84)
        .build_cartesian_2d(x_range, y_range)
        .map_err(err)?;
    let weight = crate::smoothing::DEFAULT_WEIGHT;
    chart
        .configure_mesh()
        .x_desc(format!(
            "step  (faint: each value; bold: their EMA, weight {weight})"
        ))
        .y_desc(plan.y_label)
        .y_label_formatter(&|v: &f64| super::axis::label(*v))
        .x_label_formatter(&|x: &u64| x.to_string())
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .bold_line_style(RGBColor(215, 215, 215))
        .light_line_style(RGBColor(240, 240, 240))
        .draw()
        .map_err(err)?;

    // As the workbench draws them: the raw series faded, its EMA over it in full colour.
    for (index, series) in plan.lines.iter().enumerate() {
        let color = curve_color(index);
        let faded = color.mix(0.3).stroke_width(1);
        for run in finite_runs(&series.steps, &series.values) {
            if run.len() > 1 {
                chart
                    .draw_series(LineSeries::new(run, faded))
                    .map_err(err)?;
            }
        }
    }
    for (index, series) in plan.lines.iter().enumerate() {
        let style = curve_color(index).stroke_width(2);
        let smoothed = crate::smoothing::ema(&series.values, crate::smoothing::DEFAULT_WEIGHT);
        let mut labelled = false;
        for run in finite_runs(&series.steps, &smoothed) {
            let drawn = if let [point] = run.as_slice() {
                chart.draw_series(std::iter::once(Circle::new(*point, 3, style.filled())))
            } else {
                chart.draw_series(LineSeries::new(run, style))
            }
            .map_err(err)?;
            if !labelled {
                labelled = true;
                drawn
                    .label(series.key.as_str())
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], style));
            }
        }
    }
    chart
        .configure_series_labels()
        .position(legend_corner(plan))
        .label_font((FONT, 13))
        .background_style(BACKGROUND.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::palette::colour_distance;
    use crate::plot::tests::series;
    use crate::plot::{ExportFormat, ExportOptions, export_run};

    fn options(formats: &[ExportFormat], width: u32, height: u32) -> ExportOptions {
        ExportOptions {
            formats: formats.to_vec(),
            width,
            height,
            started_at: 0.0,
        }
    }

    /// Decodes an 8-bit RGB(A) PNG into its size and RGB pixels.
    fn decode_png(path: &Path) -> ((u32, u32), Vec<[u8; 3]>) {
        let decoder = png::Decoder::new(std::fs::File::open(path).unwrap());
        let mut reader = decoder.read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut buf).unwrap();
        assert_eq!(info.bit_depth, png::BitDepth::Eight);
        let channels = info.color_type.samples();
        let pixels = buf[..info.buffer_size()]
            .chunks(channels)
            .map(|p| [p[0], p[1], p[2]])
            .collect();
        ((info.width, info.height), pixels)
    }

    /// Pixels within a small L1 distance of `color` (line interiors match exactly; edges blend).
    fn count_near(pixels: &[[u8; 3]], color: RGBColor) -> usize {
        pixels
            .iter()
            .filter(|p| colour_distance(RGBColor(p[0], p[1], p[2]), color) <= 24)
            .count()
    }

    #[test]
    fn png_has_the_size_and_a_colour_per_curve() {
        let dir = tempfile::tempdir().unwrap();
        let input = vec![
            series("rl", "reward/math/mean", &[0.1, 0.4, 0.35, 0.7, 0.8]),
            series("rl", "reward/code/mean", &[0.6, 0.5, 0.2, 0.3, 0.1]),
        ];
        let opts = options(&[ExportFormat::Png], 640, 400);
        let written = export_run("colours", &input, dir.path(), &opts).unwrap();
        assert_eq!(written, vec![dir.path().join("reward.png")]);

        let (size, pixels) = decode_png(&written[0]);
        assert_eq!(size, (640, 400));
        let background = pixels.iter().filter(|p| **p == [255, 255, 255]).count();
        assert!(background > pixels.len() / 2, "background {background}");
        for index in 0..2 {
            let n = count_near(&pixels, curve_color(index));
            assert!(n > 300, "curve {index} has only {n} pixels");
        }
        // Colours of lines that were not drawn must be (nearly) absent.
        for unused in 2..5 {
            let n = count_near(&pixels, curve_color(unused));
            assert!(n < 10, "unused colour {unused} has {n} pixels");
        }
    }

    #[test]
    fn the_legend_goes_where_the_data_is_not() {
        use crate::plot::select::plan_charts;
        let rising = vec![series("rl", "reward/a/mean", &[0.0, 0.25, 0.5, 0.75, 1.0])];
        let falling = vec![series("rl", "reward/a/mean", &[1.0, 0.75, 0.5, 0.25, 0.0])];
        let corner = |input: &[crate::metrics::Series]| {
            let plans = plan_charts(input);
            legend_corner(&plans[0])
        };
        // A rising curve fills the lower left and the upper right: the legend goes upper left.
        assert_eq!(corner(&rising), SeriesLabelPosition::UpperLeft);
        // A falling one fills the upper left and lower right (its middle point counts as upper
        // right): the lower left is empty.
        assert_eq!(corner(&falling), SeriesLabelPosition::LowerLeft);
    }

    #[test]
    fn svg_contains_title_and_every_legend_label() {
        let dir = tempfile::tempdir().unwrap();
        let input = vec![
            series("rl", "time/rollout", &[3.0, 2.5]),
            series("rl", "time/train", &[1.0, 1.2]),
            series("rl", "time/reward", &[0.2, 0.1]),
        ];
        let opts = options(&[ExportFormat::Svg], 800, 500);
        let written = export_run("svg-run", &input, dir.path(), &opts).unwrap();
        assert_eq!(written, vec![dir.path().join("timings.svg")]);
        let svg = std::fs::read_to_string(&written[0]).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..40.min(svg.len())]);
        for label in [
            "svg-run: timings (rl)",
            "time/rollout",
            "time/train",
            "time/reward",
        ] {
            assert!(svg.contains(label), "missing '{label}'");
        }
    }

    #[test]
    fn awkward_data_draws_without_panicking() {
        let dir = tempfile::tempdir().unwrap();
        let nan = f64::NAN;
        let mut huge_steps = series("rl", "actor/entropy", &[1.0, 2.0]);
        huge_steps.steps = vec![u64::MAX - 1, u64::MAX];
        let input = vec![
            series(
                "rl",
                "reward/math/mean",
                &[nan, 0.2, f64::INFINITY, 0.4, 0.5, nan],
            ),
            series("rl", "reward/code/mean", &[0.3]),
            series("rl", "reward/flat/mean", &[0.25, 0.25, 0.25]),
            series("rl", "actor/kl", &[f64::MAX, -f64::MAX, f64::NEG_INFINITY]),
            series("rl", "critic/value_loss", &[f64::MAX]),
            series("rl", "actor/pg_loss", &[nan, nan]),
            series("sft", "sft/loss", &[0.0, 0.0]),
            huge_steps,
        ];
        let opts = options(&[ExportFormat::Png, ExportFormat::Svg], 320, 240);
        let written = export_run("awkward", &input, dir.path(), &opts).unwrap();
        let names: Vec<_> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_owned())
            .collect();
        for name in ["reward", "loss", "sft_loss", "kl", "entropy"] {
            assert!(
                names.contains(&format!("{name}.png").into()),
                "{name}: {names:?}"
            );
        }
        // The single point of the second reward line is drawn as a dot in its colour.
        let (_, pixels) = decode_png(&dir.path().join("reward.png"));
        assert!(count_near(&pixels, curve_color(1)) > 15);
    }
}
