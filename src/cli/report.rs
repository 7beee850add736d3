//! `prunemem report RUN_DIR [--out DIR]` and `prunemem report compare A B
//! [--label NAME]...`: charts, report.md and report.html from finished logs
//! (prunemem's or the Python scripts' memory_log.csv).

use std::path::PathBuf;

use clap::Args;

use super::CliResult;
use crate::report;

#[derive(Args, Debug)]
pub struct ReportArgs {
    /// A run's log folder, or `compare` followed by two or more folders
    #[arg(required = true, value_name = "RUN_DIR | compare A B")]
    runs: Vec<PathBuf>,
    /// Output folder (default: reports/<run name>, or reports/compare)
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Names for the compared runs, in order (default: folder names)
    #[arg(long = "label", value_name = "NAME")]
    labels: Vec<String>,
    /// Project the run to this GPU (catalog name: "RTX 4090", "A100 80GB"...)
    #[arg(long, value_name = "NAME")]
    gpu: Option<String>,
}

pub fn run(args: ReportArgs) -> CliResult<i32> {
    let compare = args
        .runs
        .first()
        .is_some_and(|p| p.as_os_str() == "compare");
    let written = if compare {
        let dirs = &args.runs[1..];
        if dirs.len() < 2 {
            return Err("report compare needs two or more run folders".into());
        }
        let mut runs = Vec::new();
        for (i, d) in dirs.iter().enumerate() {
            let mut r = report::load(d)?;
            if let Some(l) = args.labels.get(i) {
                r.name = l.clone();
            }
            runs.push(r);
        }
        let out = args.out.unwrap_or_else(|| PathBuf::from("reports/compare"));
        report::write_compare(&runs, &out)?
    } else {
        if args.runs.len() != 1 {
            return Err("report takes one run folder (or: report compare A B)".into());
        }
        let dir = &args.runs[0];
        let run = report::load(dir)?;
        for n in &run.notes {
            eprintln!("note: {n}");
        }
        let out = args
            .out
            .unwrap_or_else(|| PathBuf::from("reports").join(&run.name));
        let gpu = match &args.gpu {
            Some(name) => Some(crate::estimate::catalog::find(name)?),
            None => None,
        };
        report::write_report(&run, dir, &out, gpu.as_ref())?
    };
    for f in &written.files {
        println!("{}", f.display());
    }
    Ok(0)
}
