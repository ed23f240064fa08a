//! Text on bitmaps, drawn where the font puts it. plotters 0.3.7 rasterises each glyph at its pen
//! position but leaves out the glyph's left side bearing, so in a monospace font a narrow glyph
//! sits at the left of its cell: "0.9" reads "0. 9". [`TextFix`] wraps a backend and draws text
//! itself, with the bearing; everything else goes to the wrapped backend unchanged. (SVG writes
//! `<text>` elements and has no such problem.)

use ab_glyph::{Font, FontRef, ScaleFont};
use plotters::prelude::DrawingBackend;
use plotters_backend::text_anchor::{HPos, VPos};
use plotters_backend::{
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind,
};

/// A backend whose text is drawn by [`draw_glyphs`] with `font`.
pub struct TextFix<'f, B> {
    pub inner: B,
    pub font: &'f FontRef<'f>,
}

/// Rasterises `text` at `size` px with `font`, calling `pixel(x, y, coverage)` for every covered
/// pixel relative to the pen's start; the vertical placement is plotters' own (so layout boxes
/// stay right).
pub fn draw_glyphs<E>(
    font: &FontRef<'_>,
    size: f32,
    text: &str,
    mut pixel: impl FnMut(i32, i32, f32) -> Result<(), E>,
) -> Result<(), E> {
    let scaled = font.as_scaled(size);
    let mut pen = 0f32;
    let mut prev = None;
    for c in text.chars() {
        let id = scaled.glyph_id(c);
        if let Some(p) = prev {
            pen += scaled.kern(p, id);
        }
        prev = Some(id);
        if let Some(outline) = scaled.outline_glyph(scaled.scaled_glyph(c)) {
            let bounds = outline.px_bounds();
            // The outline's pixels start at its bounds: the bearing is `bounds.min.x`.
            let dx = (pen + bounds.min.x).round() as i32;
            let dy = (size / 2.0 + bounds.min.y) as i32;
            let mut covered = vec![];
            outline.draw(|x, y, c| covered.push((x as i32, y as i32, c)));
            for (x, y, c) in covered {
                pixel(dx + x, dy + y, c)?;
            }
        }
        pen += scaled.h_advance(id);
    }
    Ok(())
}

impl<B: DrawingBackend> DrawingBackend for TextFix<'_, B> {
    type ErrorType = B::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.inner.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.present()
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.fill_polygon(vert, style)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        size: (u32, u32),
        src: &[u8],
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.blit_bitmap(pos, size, src)
    }

    /// plotters' placement (anchor, rotation, clipping), with the glyphs drawn by [`draw_glyphs`].
    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let ((min_x, min_y), (max_x, max_y)) = style
            .layout_box(text)
            .map_err(|e| DrawingErrorKind::FontError(Box::new(e)))?;
        let (width, height) = (max_x - min_x, max_y - min_y);
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Right => -width,
            HPos::Center => -width / 2,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -height / 2,
            VPos::Bottom => -height,
        };
        let trans = style.transform();
        let (w, h) = self.inner.get_size();
        let font = self.font;
        let inner = &mut self.inner;
        draw_glyphs(font, style.size() as f32, text, |x, y, coverage| {
            let (x, y) = trans.transform(x + dx - min_x, y + dy - min_y);
            let (x, y) = (pos.0 + x, pos.1 + y);
            if x >= 0 && x < w as i32 && y >= 0 && y < h as i32 {
                let shade = BackendColor {
                    alpha: color.alpha * f64::from(coverage),
                    rgb: color.rgb,
                };
                inner.draw_pixel((x, y), shade)
            } else {
                Ok(())
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The columns of a `w` x `h` coverage grid with any ink.
    fn inked_columns(text: &str, size: f32) -> Vec<bool> {
        let font = FontRef::try_from_slice(super::super::chart::FONT_BYTES).expect("the font");
        let mut ink = vec![false; 200];
        draw_glyphs(&font, size, text, |x, _y, c| {
            if c > 0.25 && (0..200).contains(&x) {
                ink[x as usize] = true;
            }
            Ok::<(), ()>(())
        })
        .expect("drawn");
        ink
    }

    /// Widths of the blank runs between inked columns.
    fn gaps(ink: &[bool]) -> Vec<usize> {
        let first = ink.iter().position(|&i| i).unwrap_or(0);
        let last = ink.iter().rposition(|&i| i).unwrap_or(0);
        let mut out = vec![];
        let mut run = 0;
        for &i in &ink[first..=last] {
            if i {
                if run > 0 {
                    out.push(run);
                }
                run = 0;
            } else {
                run += 1;
            }
        }
        out
    }

    #[test]
    fn a_narrow_glyph_sits_in_the_middle_of_its_cell() {
        // In a monospace font '.' is centred in its advance: the blank columns before and after
        // it in "0.9" are the same within a pixel. Without the bearing, '.' touches the '0' and
        // the whole of its cell's slack lands before the '9' ("0. 9").
        let g = gaps(&inked_columns("0.9", 26.0));
        assert_eq!(g.len(), 2, "{g:?}");
        assert!(g[0].abs_diff(g[1]) <= 1, "gaps around '.': {g:?}");
        assert!(g[0] >= 2, "{g:?}");
    }
}
