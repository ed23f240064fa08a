//! The colours of chart lines: a palette of strong colours on a white background, extended on demand.
//!
//! Owns only colour choice; where a colour is used is [`super::chart`]'s business.

use plotters::style::{Color, HSLColor, RGBColor, WHITE};

pub(crate) const BACKGROUND: RGBColor = WHITE;

/// Strong colours, distinct from each other and from the white background and grey grid. The
/// first six are the workbench's series colours in its order (blue, magenta, cyan, green, red,
/// yellow — a dark yellow, readable on white), so an exported plot's lines match the screen's.
const PALETTE: [RGBColor; 16] = [
    RGBColor(31, 119, 180),  // blue
    RGBColor(190, 50, 170),  // magenta
    RGBColor(23, 170, 190),  // cyan
    RGBColor(44, 160, 44),   // green
    RGBColor(214, 39, 40),   // red
    RGBColor(184, 150, 11),  // yellow (dark)
    RGBColor(255, 127, 14),  // orange
    RGBColor(140, 86, 75),   // brown
    RGBColor(148, 103, 189), // purple
    RGBColor(188, 189, 34),  // olive
    RGBColor(0, 0, 128),     // navy
    RGBColor(0, 128, 128),   // teal
    RGBColor(128, 0, 0),     // maroon
    RGBColor(227, 119, 194), // pink
    RGBColor(85, 107, 47),   // dark olive
    RGBColor(0, 0, 0),       // black
];

/// The `index`-th line's colour as red, green and blue.
pub fn curve_rgb(index: usize) -> (u8, u8, u8) {
    let RGBColor(r, g, b) = curve_color(index);
    (r, g, b)
}

/// The colour of the `index`-th line of a chart: the palette, then dark saturated hues stepped by the
/// golden angle, skipping any that look like a colour already handed out (past a few hundred lines
/// that is impossible, and the rule gives up rather than loop).
pub(crate) fn curve_color(index: usize) -> RGBColor {
    if let Some(colour) = PALETTE.get(index) {
        return *colour;
    }
    let mut chosen = PALETTE.to_vec();
    let mut candidate = 0usize;
    while chosen.len() <= index {
        let hue = (candidate as f64 * 0.618_033_988_75).fract();
        let lightness = [0.3, 0.45, 0.22][candidate % 3];
        let (r, g, b) = HSLColor(hue, 0.85, lightness).rgb();
        let colour = RGBColor(r, g, b);
        candidate += 1;
        let distinct = chosen.iter().all(|c| colour_distance(*c, colour) > 60);
        if distinct || candidate > 8 * index {
            chosen.push(colour);
        }
    }
    chosen[index]
}

/// L1 distance in RGB, enough to tell "looks alike" from "clearly different" on a chart.
pub(crate) fn colour_distance(a: RGBColor, b: RGBColor) -> u32 {
    [(a.0, b.0), (a.1, b.1), (a.2, b.2)]
        .iter()
        .map(|(x, y)| u32::from(x.abs_diff(*y)))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curve_colours_are_distinct_and_stand_out_from_the_background() {
        let colours: Vec<RGBColor> = (0..32).map(curve_color).collect();
        for (i, a) in colours.iter().enumerate() {
            assert!(
                colour_distance(*a, BACKGROUND) > 150,
                "colour {i} {a:?} is too light"
            );
            for (j, b) in colours.iter().enumerate().take(i) {
                let d = colour_distance(*a, *b);
                assert!(d > 60, "colours {j} and {i} look alike: {b:?} {a:?}");
            }
        }
    }
}
