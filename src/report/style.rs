//! The plotters set-up every chart shares: the shipped font registered
//! once, the run colours, the legend box, rotated and centred labels, the
//! byte unit of an axis, and plotters' errors as ours.

use std::sync::Once;

use plotters::prelude::*;
use plotters::style::FontStyle;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::ReportError;

static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

pub(super) fn font() {
    REGISTER.call_once(|| {
        // The font is ours and valid; a failure would show as missing text.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

/// A chart's canvas: the font registered and the area painted white.
pub(super) fn blank<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), ReportError>
where
    DB::ErrorType: 'static,
{
    font();
    area.fill(&WHITE).map_err(err)
}

/// Every chart's frame: its title, margin and label areas (`x_labels`:
/// 40 for numbers, 200 for rotated stage names).
pub(super) fn frame<'a, 'b, DB: DrawingBackend>(
    area: &'a DrawingArea<DB, plotters::coord::Shift>,
    title: &'b str,
    x_labels: u32,
) -> ChartBuilder<'a, 'b, DB> {
    let mut b = ChartBuilder::on(area);
    b.caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(x_labels)
        .y_label_area_size(70);
    b
}

pub(super) const COLORS: [RGBColor; 4] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

pub(super) fn err(e: impl std::fmt::Display) -> ReportError {
    ReportError::Chart(e.to_string())
}

/// The legend, top left on a translucent white box (every chart's).
pub(super) fn legend<'a, DB, CT>(chart: &mut ChartContext<'a, DB, CT>) -> Result<(), ReportError>
where
    DB: DrawingBackend + 'a,
    DB::ErrorType: 'static,
    CT: plotters::coord::CoordTranslate,
{
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)
}

/// Axis labels turned a quarter clockwise, starting at their tick.
pub(super) fn rotated(size: u32) -> TextStyle<'static> {
    TextStyle::from(
        ("sans-serif", size)
            .into_font()
            .transform(FontTransform::Rotate90),
    )
    .pos(Pos::new(HPos::Left, VPos::Center))
}

/// Text centred above its anchor point (bar values).
pub(super) fn above(size: u32) -> TextStyle<'static> {
    TextStyle::from(("sans-serif", size).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom))
}

/// The unit for an axis whose largest value is `max` bytes.
pub(super) fn unit(max: u64) -> (f64, &'static str) {
    if max >= 2 << 30 {
        ((1u64 << 30) as f64, "GiB")
    } else {
        ((1u64 << 20) as f64, "MiB")
    }
}
