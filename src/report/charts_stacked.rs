//! Two more charts, same conventions as `charts` (shipped font, binary
//! units, one pipeline each, `present()` checked): the stacked breakdown of
//! the peak (measured accounting beside the estimator's prediction) and the
//! stage-aligned overlay of several runs.

use crate::events::stages;
use plotters::prelude::*;

use super::ReportError;
use super::breakdown::Bar;
use super::load::RunData;
use super::style::{COLORS, above, blank, err, frame, legend, rotated, unit};

/// Ten distinguishable fills, one per component name across bars.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Stacked bars of components, one colour per component name, a legend on
/// the right.
pub fn breakdown<DB: DrawingBackend>(
    area: DrawingArea<DB, plotters::coord::Shift>,
    bars: &[Bar],
    title: &str,
) -> Result<(), ReportError>
where
    DB::ErrorType: 'static,
{
    blank(&area)?;
    let names = super::breakdown::component_names(bars);
    // A category has its colour everywhere (`memory::tag::color`); other
    // component names (logs without categories) take the palette.
    let color = |n: &str| match crate::memory::tag::Category::from_name(n) {
        Some(c) => {
            let (r, g, b) = crate::memory::tag::color(c.name());
            RGBColor(r, g, b)
        }
        None => {
            let i = names.iter().position(|m| *m == n).unwrap_or(0);
            PALETTE[i % PALETTE.len()]
        }
    };
    let max = bars.iter().map(Bar::total).max().unwrap_or(1 << 20).max(1);
    let (div, unit_name) = unit(max);
    let (chart_area, legend_area) = area.split_horizontally(560);
    let n = bars.len().max(1);
    // Short names under the bars ("measured peak", "estimate"); the report's
    // table carries the full labels.
    let labels: Vec<String> = bars
        .iter()
        .map(|b| b.label.split(" (").next().unwrap_or_default().to_string())
        .collect();
    let mut chart = frame(&chart_area, title, 40)
        .build_cartesian_2d((0..n - 1).into_segmented(), 0.0..max as f64 / div * 1.1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(format!("memory at the peak ({unit_name})"))
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .x_labels(n)
        .label_style(("sans-serif", 12))
        .draw()
        .map_err(err)?;
    for (i, bar) in bars.iter().enumerate() {
        let mut base = 0.0;
        for (name, bytes) in &bar.parts {
            let top = base + *bytes as f64 / div;
            let rect = Rectangle::new(
                [
                    (SegmentValue::Exact(i), base),
                    (SegmentValue::Exact(i + 1), top),
                ],
                color(name).mix(0.85).filled(),
            );
            chart.draw_series([rect]).map_err(err)?;
            base = top;
        }
        let total = crate::units::format_bytes(bar.total());
        chart
            .draw_series([Text::new(
                total,
                (SegmentValue::CenterOf(i), base * 1.01),
                above(14),
            )])
            .map_err(err)?;
    }
    // Legend: one swatch and name per component, top to bottom.
    let legend = legend_area.margin(60, 10, 10, 10);
    for (k, name) in names.iter().enumerate() {
        let y = 22 * k as i32;
        legend
            .draw(&Rectangle::new(
                [(0, y), (14, y + 14)],
                color(name).filled(),
            ))
            .map_err(err)?;
        legend
            .draw(&Text::new(
                name.to_string(),
                (20, y),
                ("sans-serif", 13).into_font(),
            ))
            .map_err(err)?;
    }
    area.present().map_err(err)?;
    Ok(())
}

/// Stage labels of all runs merged in order (per-layer stages left out):
/// each run's stages keep their order; a label new to the list goes after
/// the last label it follows.
pub fn aligned_stages(runs: &[&RunData]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in runs {
        let mut at = 0;
        for s in r.stages.iter().filter(|s| !stages::is_layer(s.label())) {
            match out.iter().position(|l| *l == s.label()) {
                Some(p) => at = p + 1,
                None => {
                    out.insert(at, s.label().to_string());
                    at += 1;
                }
            }
        }
    }
    out
}

/// RSS (or allocated, for runs without RSS) at each aligned stage, one line
/// per run; a run missing a stage has a gap there.
pub fn stage_overlay<DB: DrawingBackend>(
    area: DrawingArea<DB, plotters::coord::Shift>,
    runs: &[&RunData],
    title: &str,
) -> Result<(), ReportError>
where
    DB::ErrorType: 'static,
{
    blank(&area)?;
    let stages = aligned_stages(runs);
    let value = |r: &RunData, label: &str| {
        r.stages
            .iter()
            .find(|s| s.label() == label)
            .and_then(|s| s.point.rss.or(s.point.allocated))
    };
    let max = runs
        .iter()
        .flat_map(|r| stages.iter().filter_map(|l| value(r, l)))
        .max()
        .unwrap_or(1 << 20)
        .max(1);
    let (div, unit_name) = unit(max);
    let n = stages.len().max(1);
    let mut chart = frame(&area, title, 200)
        .build_cartesian_2d(0..n - 1, 0.0..max as f64 / div * 1.15)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_labels(n)
        .x_label_formatter(&|_| String::new())
        .label_style(("sans-serif", 13))
        .y_desc(format!("RSS at the stage ({unit_name})"))
        .draw()
        .map_err(err)?;
    for (i, l) in stages.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(i, 0.0));
        area.draw(&Text::new(l.clone(), (x, y + 10), rotated(12)))
            .map_err(err)?;
    }
    for (k, r) in runs.iter().enumerate() {
        let c = COLORS[k % COLORS.len()];
        let pts: Vec<(usize, Option<f64>)> = stages
            .iter()
            .enumerate()
            .map(|(i, l)| (i, value(r, l).map(|v| v as f64 / div)))
            .collect();
        // Contiguous runs of present stages become line pieces.
        for piece in pts.split(|(_, v)| v.is_none()) {
            let line: Vec<(usize, f64)> = piece
                .iter()
                .filter_map(|(i, v)| v.map(|v| (*i, v)))
                .collect();
            chart
                .draw_series(LineSeries::new(line.clone(), c.stroke_width(2)))
                .map_err(err)?;
            chart
                .draw_series(line.iter().map(|p| Circle::new(*p, 4, c.filled())))
                .map_err(err)?;
        }
        chart
            .draw_series(std::iter::empty::<Circle<(usize, f64), i32>>())
            .map_err(err)?
            .label(r.name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], c.stroke_width(3)));
    }
    legend(&mut chart)?;
    area.present().map_err(err)?;
    Ok(())
}
