//! Time charts that stay readable for long runs: a series reduced to one
//! min / mean / max triple per pixel column (an envelope with its line of
//! means, instead of a solid band of raw 10 Hz samples), and the heap by
//! category over time as stacked areas, each category in its own colour
//! (`memory::tag::color`, the same as the live UI's).

use plotters::prelude::*;

use super::ReportError;
use super::load::RunData;
use super::style::{blank, err, frame, legend, unit};
use crate::memory::tag;

/// Pixel columns a time series is reduced to.
pub const COLUMNS: usize = 900;

/// One column of an envelope: its time (the mean of its points') and the
/// min, mean and max value in it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Column {
    pub t: f64,
    pub min: f64,
    pub mean: f64,
    pub max: f64,
}

/// `points` (time, value) grouped into at most `columns` equal time slices
/// of `0..t_max`; empty slices are left out.
pub fn envelope(points: &[(f64, f64)], t_max: f64, columns: usize) -> Vec<Column> {
    let columns = columns.max(1);
    let width = (t_max / columns as f64).max(f64::MIN_POSITIVE);
    let mut out: Vec<(usize, Column, usize)> = Vec::new();
    for &(t, v) in points {
        let k = ((t / width) as usize).min(columns - 1);
        match out.last_mut() {
            Some((col, c, n)) if *col == k => {
                c.t += t;
                c.min = c.min.min(v);
                c.max = c.max.max(v);
                c.mean += v;
                *n += 1;
            }
            _ => out.push((
                k,
                Column {
                    t,
                    min: v,
                    mean: v,
                    max: v,
                },
                1,
            )),
        }
    }
    out.into_iter()
        .map(|(_, c, n)| Column {
            t: c.t / n as f64,
            mean: c.mean / n as f64,
            ..c
        })
        .collect()
}

/// The heap by category over time, stacked, in MiB or GiB (reports draw it
/// only when the log has categories: not a Python CSV or an older log).
pub fn categories<DB: DrawingBackend>(
    area: DrawingArea<DB, plotters::coord::Shift>,
    run: &RunData,
    title: &str,
) -> Result<(), ReportError>
where
    DB::ErrorType: 'static,
{
    blank(&area)?;
    let series = &run.category_points;
    let t_max = series.iter().map(|(t, _)| *t).fold(1.0f64, f64::max);
    let top = series
        .iter()
        .map(|(_, c)| c.values().sum::<u64>())
        .max()
        .unwrap_or(1 << 20);
    let (div, name) = unit(top);
    let mut names: Vec<&String> = series.iter().flat_map(|(_, c)| c.keys()).collect();
    names.sort_by_key(|n| (tag::order(n), n.to_string()));
    names.dedup();
    let mut chart = frame(&area, title, 40)
        .build_cartesian_2d(0.0..t_max * 1.02, 0.0..top as f64 / div * 1.25)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("elapsed (s)")
        .y_desc(format!("live heap by category ({name})"))
        .label_style(("sans-serif", 14))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()
        .map_err(err)?;
    // Top of each band = the sum of it and every band below; drawn from the
    // top band down so each lower band covers the one above's lower part.
    for k in (0..names.len()).rev() {
        let below = &names[..=k];
        let points: Vec<(f64, f64)> = series
            .iter()
            .map(|(t, c)| {
                let v: u64 = below.iter().filter_map(|n| c.get(*n)).sum();
                (*t, v as f64 / div)
            })
            .collect();
        // The column maxima: a short peak of a band is never averaged away.
        let tops: Vec<(f64, f64)> = envelope(&points, t_max, COLUMNS)
            .into_iter()
            .map(|c| (c.t, c.max))
            .collect();
        let (r, g, b) = tag::color(names[k]);
        let color = RGBColor(r, g, b);
        chart
            .draw_series(AreaSeries::new(tops, 0.0, color.mix(0.85)).border_style(color))
            .map_err(err)?
            .label(names[k].as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
    }
    legend(&mut chart)?;
    area.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_keeps_extremes_and_means_per_column() {
        // A sawtooth of 10 000 points over 100 s into 10 columns.
        let pts: Vec<(f64, f64)> = (0..10_000)
            .map(|i| (i as f64 / 100.0, (i % 10) as f64))
            .collect();
        let cols = envelope(&pts, 100.0, 10);
        assert_eq!(cols.len(), 10);
        for c in &cols {
            assert_eq!((c.min, c.max), (0.0, 9.0));
            assert!((c.mean - 4.5).abs() < 1e-9);
        }
        assert!(cols.windows(2).all(|w| w[0].t < w[1].t));
        // Points within one column's span make one column.
        assert_eq!(envelope(&pts[..5], 100.0, 900).len(), 1);
        assert!(envelope(&[], 1.0, 10).is_empty());
    }
}
