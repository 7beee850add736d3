//! Reports of finished runs: `prunemem report RUN_DIR` writes `report.md`,
//! a self-contained `report.html` and the charts (PNG and SVG);
//! `prunemem report compare A B` sets runs side by side and explains the
//! difference. Reads logs only (`load`); never imports the engine's UI.

pub mod breakdown;
#[cfg(feature = "charts")]
pub mod charts;
#[cfg(feature = "charts")]
pub mod charts_area;
#[cfg(feature = "charts")]
pub mod charts_stacked;
pub mod compare;
pub mod compare_text;
pub mod estimate;
pub mod load;
mod sections;
#[cfg(feature = "charts")]
mod style;
pub mod text;
pub mod training;

use std::path::Path;

use thiserror::Error;

pub use load::{RunData, load};

#[derive(Debug, Error)]
pub enum ReportError {
    #[error("{0}")]
    Invalid(String),
    #[error("chart: {0}")]
    Chart(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

fn write(path: &Path, text: &str) -> Result<(), ReportError> {
    std::fs::write(path, text).map_err(|source| ReportError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Files a report wrote.
#[derive(Debug, Default)]
pub struct Written {
    pub files: Vec<std::path::PathBuf>,
}

/// Writes the report of `run` (loaded from `source`) into `out`.
pub fn write_report(
    run: &RunData,
    source: &Path,
    out: &Path,
    gpu: Option<&crate::estimate::catalog::Gpu>,
) -> Result<Written, ReportError> {
    std::fs::create_dir_all(out).map_err(|e| ReportError::Io {
        path: out.display().to_string(),
        source: e,
    })?;
    let mut written = Written::default();
    let comparison = text::estimate_check(source);
    #[allow(unused_mut)]
    let mut charts: Vec<(String, String)> = Vec::new();
    #[cfg(feature = "charts")]
    {
        let title = format!("Memory over time: {}", run.name);
        let tl = charts::svg(|a| charts::timeline(a, &[run], &title))?;
        let bars_title = format!("RSS per stage: {}", run.name);
        let bars = charts::svg(|a| charts::stage_bars(a, run, &bars_title))?;
        for (name, svg) in [("timeline", &tl), ("stages", &bars)] {
            let p = out.join(format!("{name}.svg"));
            write(&p, svg)?;
            written.files.push(p);
        }
        let p = out.join("timeline.png");
        charts::png(&p, |a| charts::timeline(a, &[run], &title))?;
        written.files.push(p);
        let p = out.join("stages.png");
        charts::png(&p, |a| charts::stage_bars(a, run, &bars_title))?;
        written.files.push(p);
        if !run.category_points.is_empty() {
            let title = format!("Heap by category: {}", run.name);
            let svg = charts::svg(|a| charts_area::categories(a, run, &title))?;
            let p = out.join("categories.svg");
            write(&p, &svg)?;
            written.files.push(p);
            let p = out.join("categories.png");
            charts::png(&p, |a| charts_area::categories(a, run, &title))?;
            written.files.push(p);
            charts.push(("categories".into(), svg));
        }
        charts.push(("timeline".into(), tl));
        charts.push(("stages".into(), bars));
        let stacked = breakdown::bars(run, comparison.as_ref());
        if !stacked.is_empty() {
            let title = format!("What the peak is made of: {}", run.name);
            let svg = charts::svg(|a| charts_stacked::breakdown(a, &stacked, &title))?;
            let p = out.join("breakdown.svg");
            write(&p, &svg)?;
            written.files.push(p);
            let p = out.join("breakdown.png");
            charts::png(&p, |a| charts_stacked::breakdown(a, &stacked, &title))?;
            written.files.push(p);
            charts.push(("breakdown".into(), svg));
        }
    }
    let md = text::markdown(run, comparison.as_ref(), !charts.is_empty(), gpu);
    let p = out.join("report.md");
    write(&p, &md)?;
    written.files.push(p);
    let html = text::html(&md, &charts);
    let p = out.join("report.html");
    write(&p, &html)?;
    written.files.push(p);
    Ok(written)
}

/// Writes the comparison of `runs` into `out`.
pub fn write_compare(runs: &[RunData], out: &Path) -> Result<Written, ReportError> {
    if runs.len() < 2 {
        return Err(ReportError::Invalid(
            "compare needs at least two runs".into(),
        ));
    }
    std::fs::create_dir_all(out).map_err(|e| ReportError::Io {
        path: out.display().to_string(),
        source: e,
    })?;
    let mut written = Written::default();
    #[allow(unused_mut)]
    let mut charts: Vec<(String, String)> = Vec::new();
    #[cfg(feature = "charts")]
    {
        let refs: Vec<&RunData> = runs.iter().collect();
        let svg = charts::svg(|a| charts::timeline(a, &refs, "Memory over time"))?;
        let p = out.join("compare.svg");
        write(&p, &svg)?;
        written.files.push(p);
        let p = out.join("compare.png");
        charts::png(&p, |a| charts::timeline(a, &refs, "Memory over time"))?;
        written.files.push(p);
        charts.push(("compare".into(), svg));
        let title = "Memory at each stage, aligned by stage name";
        let svg = charts::svg(|a| charts_stacked::stage_overlay(a, &refs, title))?;
        let p = out.join("compare_stages.svg");
        write(&p, &svg)?;
        written.files.push(p);
        let p = out.join("compare_stages.png");
        charts::png(&p, |a| charts_stacked::stage_overlay(a, &refs, title))?;
        written.files.push(p);
        charts.push(("compare_stages".into(), svg));
    }
    let md = compare_text::compare_markdown(runs, !charts.is_empty());
    let p = out.join("compare.md");
    write(&p, &md)?;
    written.files.push(p);
    let p = out.join("compare.html");
    write(&p, &text::html(&md, &charts))?;
    written.files.push(p);
    Ok(written)
}

#[cfg(test)]
mod tests;
