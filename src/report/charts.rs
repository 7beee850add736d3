//! Charts of runs with plotters, one straight pipeline per chart, drawn to
//! an SVG string (testable, embedded in report.html) or a PNG file. Text
//! uses the DejaVu Sans font shipped in `assets/fonts` (no system fonts).
//! Axes are in binary units (MiB or GiB, picked from the data).

use crate::events::stages;
use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::ReportError;
use super::load::RunData;
use super::style::{COLORS, above, blank, err, frame, legend, rotated, unit};

/// A plotted series: its name, how to read it from a point, line width.
type Series = (&'static str, fn(&super::load::Point) -> Option<u64>, u32);

const SIZE: (u32, u32) = (1000, 520);

/// Memory over time: RSS and allocated for each run (solid / dashed by
/// series, one colour per run), stage boundaries of the first run as thin
/// lines, its peak annotated.
pub fn timeline<DB: DrawingBackend>(
    area: DrawingArea<DB, plotters::coord::Shift>,
    runs: &[&RunData],
    title: &str,
) -> Result<(), ReportError>
where
    DB::ErrorType: 'static,
{
    blank(&area)?;
    let t_max = runs
        .iter()
        .flat_map(|r| r.points.iter().map(|p| p.t))
        .fold(1.0f64, f64::max);
    let max = runs
        .iter()
        .flat_map(|r| {
            r.points
                .iter()
                .flat_map(|p| [p.rss, p.allocated, p.reserved, p.gpu_used])
        })
        .flatten()
        .chain(runs.iter().filter_map(|r| r.peak_rss()))
        .max()
        .unwrap_or(1 << 20);
    let (div, name) = unit(max);
    // Headroom above the data: the peak's label sits just over it and the
    // legend above that, so neither hides a line.
    let y_max = max as f64 / div * 1.3;
    let mut chart = frame(&area, title, 40)
        .build_cartesian_2d(0.0..t_max * 1.02, 0.0..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("elapsed (s)")
        .y_desc(format!("memory ({name})"))
        .label_style(("sans-serif", 14))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    if let Some(first) = runs.first() {
        // At most about 30 stage lines: more make a grey wall.
        let outline: Vec<_> = first.outline().collect();
        let step = outline.len().div_ceil(30).max(1);
        for s in outline.into_iter().step_by(step) {
            let x = s.point.t;
            chart
                .draw_series(LineSeries::new(
                    [(x, 0.0), (x, y_max)],
                    RGBColor(200, 200, 200),
                ))
                .map_err(err)?;
        }
    }
    for (k, run) in runs.iter().enumerate() {
        let color = COLORS[k % COLORS.len()];
        let prefix = (runs.len() > 1).then_some(run.name.as_str());
        run_series(&mut chart, run, prefix, color, (div, t_max))?;
        peak_mark(&mut chart, run, color, (div, t_max))?;
    }
    legend(&mut chart)?;
    area.present().map_err(err)?;
    Ok(())
}

/// The chart `timeline` draws on: seconds against memory.
type TimeChart<'a, DB> = ChartContext<
    'a,
    DB,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// One run's RSS, allocated and GPU series: per pixel column the min–max
/// band and the line of means (`scale`: the unit's divisor and the last
/// second).
fn run_series<DB: DrawingBackend>(
    chart: &mut TimeChart<'_, DB>,
    run: &RunData,
    prefix: Option<&str>,
    color: RGBColor,
    (div, t_max): (f64, f64),
) -> Result<(), ReportError>
where
    DB::ErrorType: 'static,
{
    let series: [Series; 3] = [
        ("RSS", |p| p.rss, 2),
        ("allocated", |p| p.allocated, 1),
        ("GPU used", |p| p.gpu_used, 1),
    ];
    for (what, get, width) in series {
        let data: Vec<(f64, f64)> = run
            .points
            .iter()
            .filter_map(|p| get(p).map(|v| (p.t, v as f64 / div)))
            .collect();
        if data.is_empty() {
            continue;
        }
        let style = if what == "RSS" {
            color.stroke_width(width)
        } else {
            color.mix(0.55).stroke_width(width)
        };
        let cols = super::charts_area::envelope(&data, t_max, super::charts_area::COLUMNS);
        let band: Vec<(f64, f64)> = (cols.iter().map(|c| (c.t, c.max)))
            .chain(cols.iter().rev().map(|c| (c.t, c.min)))
            .collect();
        chart
            .draw_series([Polygon::new(band, color.mix(0.18).filled())])
            .map_err(err)?;
        let means: Vec<(f64, f64)> = cols.iter().map(|c| (c.t, c.mean)).collect();
        let label = match prefix {
            Some(name) => format!("{name} {what}"),
            None => what.to_string(),
        };
        chart
            .draw_series(LineSeries::new(means, style))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], style));
    }
    Ok(())
}

/// The run's RSS peak: a dot at its stage and its size beside it.
fn peak_mark<DB: DrawingBackend>(
    chart: &mut TimeChart<'_, DB>,
    run: &RunData,
    color: RGBColor,
    (div, t_max): (f64, f64),
) -> Result<(), ReportError>
where
    DB::ErrorType: 'static,
{
    let (Some(peak), Some(at)) = (run.peak_rss(), run.peak_stage()) else {
        return Ok(());
    };
    let x = run.stages[at].point.t;
    let y = peak as f64 / div;
    chart
        .draw_series([Circle::new((x, y), 4, color.filled())])
        .map_err(err)?;
    // Right of the point, or left of it near the right edge: never clipped
    // by the plot's border.
    let side = if x > 0.7 * t_max {
        HPos::Right
    } else {
        HPos::Left
    };
    let style = TextStyle::from(("sans-serif", 14).into_font())
        .color(&color)
        .pos(Pos::new(side, VPos::Bottom));
    chart
        .draw_series([Text::new(
            format!("peak {}", crate::units::format_bytes(peak)),
            (x, y * 1.03),
            style,
        )])
        .map_err(err)?;
    Ok(())
}

/// RSS at each non-layer stage as bars, with the change from the previous
/// bar written above it.
pub fn stage_bars<DB: DrawingBackend>(
    area: DrawingArea<DB, plotters::coord::Shift>,
    run: &RunData,
    title: &str,
) -> Result<(), ReportError>
where
    DB::ErrorType: 'static,
{
    blank(&area)?;
    // Per-layer stages are folded into the next shown stage's peak.
    let mut stages: Vec<super::load::Stage> = Vec::new();
    let mut folded: Option<u64> = None;
    for s in &run.stages {
        folded = folded.max(s.peak);
        if !stages::is_layer(s.label()) {
            let mut shown = s.clone();
            shown.peak = folded;
            stages.push(shown);
            folded = None;
        }
    }
    let value = |s: &super::load::Stage| s.point.rss.or(s.point.allocated).unwrap_or(0);
    let max = stages
        .iter()
        .map(|s| value(s).max(s.peak.unwrap_or(0)))
        .max()
        .unwrap_or(1 << 20);
    let (div, name) = unit(max);
    let n = stages.len().max(1);
    let mut chart = frame(&area, title, 200)
        .build_cartesian_2d((0..n - 1).into_segmented(), 0.0..max as f64 / div * 1.2)
        .map_err(err)?;
    let labels: Vec<String> = stages.iter().map(|s| s.label().to_string()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(format!(
            "RSS at the stage ({name}); line = peak since previous"
        ))
        .x_label_formatter(&|_| String::new())
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    // Stage names turned a quarter, hanging from their bars (plotters
    // centres rotated axis labels on the axis, across the bars).
    for (i, l) in labels.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(SegmentValue::CenterOf(i), 0.0));
        area.draw(&Text::new(l.clone(), (x, y + 10), rotated(12)))
            .map_err(err)?;
    }
    // Bars drawn in stage order (plotters' Histogram gathers its data in a
    // hash map, so its SVG came out in a different order every run).
    chart
        .draw_series(stages.iter().enumerate().map(|(i, s)| {
            let top = value(s) as f64 / div;
            let mut bar = Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), top),
                ],
                COLORS[0].mix(0.8).filled(),
            );
            bar.set_margin(0, 0, 6, 6);
            bar
        }))
        .map_err(err)?;
    for (i, s) in stages.iter().enumerate() {
        let y = value(s) as f64 / div;
        if let Some(p) = s.peak {
            let py = p as f64 / div;
            chart
                .draw_series([PathElement::new(
                    [
                        (SegmentValue::Exact(i), py),
                        (SegmentValue::Exact(i + 1), py),
                    ],
                    COLORS[1].stroke_width(2),
                )])
                .map_err(err)?;
        }
        let delta = if i == 0 {
            String::new()
        } else {
            let prev = value(&stages[i - 1]) as i64;
            let d = value(s) as i64 - prev;
            let sign = if d < 0 { "-" } else { "+" };
            format!("{sign}{}", crate::units::format_bytes(d.unsigned_abs()))
        };
        chart
            .draw_series([Text::new(
                delta,
                (SegmentValue::CenterOf(i), y * 1.01),
                above(11),
            )])
            .map_err(err)?;
    }
    area.present().map_err(err)?;
    Ok(())
}

/// A chart drawn into an SVG string.
pub fn svg(
    draw: impl FnOnce(DrawingArea<SVGBackend, plotters::coord::Shift>) -> Result<(), ReportError>,
) -> Result<String, ReportError> {
    let mut out = String::new();
    {
        let area = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        draw(area)?;
    }
    Ok(out)
}

/// A chart drawn into a PNG file.
pub fn png(
    path: &Path,
    draw: impl FnOnce(DrawingArea<BitMapBackend, plotters::coord::Shift>) -> Result<(), ReportError>,
) -> Result<(), ReportError> {
    let area = BitMapBackend::new(path, SIZE).into_drawing_area();
    draw(area)
}
