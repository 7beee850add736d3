//! The house's walls, checked on every test run: which modules may name
//! which. Engines, the profiler, memory probes, the event contract and the
//! estimator never name the consumers (sinks, the UI, reports, the CLI,
//! jobs); consumers (sinks, the UI, reports, watch) never name the engines
//! or jobs; nothing but the binary's entry point names the CLI; and stage
//! names are spelled only in the stage catalogue (`events::stages`).
//!
//! The check reads the source as text: a `use`, a path in code or a doc
//! link all count, since each is a dependency a reader has to follow.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Files under `src/<dir>` for each dir, with their text.
fn files(dirs: &[&str]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for d in dirs {
        let mut paths = Vec::new();
        let p = src().join(d);
        if p.is_dir() {
            rust_files(&p, &mut paths);
        } else {
            paths.push(p.with_extension("rs"));
        }
        for path in paths {
            let text = std::fs::read_to_string(&path).unwrap();
            let name = path.strip_prefix(src()).unwrap().display().to_string();
            out.push((name, text));
        }
    }
    out
}

/// Lines of `text` naming `crate::<module>` (or `prunemem::<module>`) for
/// any of `modules`, as `file:line: text`.
fn naming(files: &[(String, String)], modules: &[&str]) -> Vec<String> {
    let mut hits = Vec::new();
    for (name, text) in files {
        for (n, line) in text.lines().enumerate() {
            for m in modules {
                for prefix in ["crate::", "prunemem::"] {
                    let needle = format!("{prefix}{m}");
                    let named = line.match_indices(&needle).any(|(i, _)| {
                        let next = line[i + needle.len()..].chars().next();
                        !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
                    });
                    if named {
                        hits.push(format!("{name}:{}: {}", n + 1, line.trim()));
                    }
                }
            }
        }
    }
    hits
}

const ENGINES_AND_CONTRACT: [&str; 8] = [
    "prune", "model", "profiler", "memory", "events", "estimate", "data", "train",
];
const CONSUMERS: [&str; 4] = ["sinks", "tui", "report", "watch"];

#[test]
fn engines_and_the_contract_never_name_consumers() {
    let hits = naming(
        &files(&ENGINES_AND_CONTRACT),
        &["sinks", "tui", "report", "cli", "jobs", "watch"],
    );
    assert!(
        hits.is_empty(),
        "engine code names a consumer:\n{}",
        hits.join("\n")
    );
}

#[test]
fn consumers_never_name_engines_or_jobs() {
    let hits = naming(
        &files(&CONSUMERS),
        // `train::analysis` reads logs, as `estimate::against` does; the
        // training engine itself is off limits.
        &[
            "prune",
            "jobs",
            "model::perplexity",
            "model::tiny",
            "train::step",
            "train::optim",
            "train::train",
            "cli",
        ],
    );
    assert!(
        hits.is_empty(),
        "a consumer names an engine:\n{}",
        hits.join("\n")
    );
}

#[test]
fn only_the_entry_point_names_the_cli() {
    let mut all = files(&["."]);
    all.retain(|(name, _)| !name.starts_with("cli/") && name != "main.rs" && name != "lib.rs");
    let hits = naming(&all, &["cli"]);
    assert!(
        hits.is_empty(),
        "library code names the CLI:\n{}",
        hits.join("\n")
    );
}

/// The first quoted stage name in `line`: `"NN_word…"`, `"layer_NN…"`
/// (or a `layer_{…}` format string) or `"sample"`.
fn stage_literal(line: &str) -> Option<&str> {
    line.split('"').skip(1).step_by(2).find(|q| {
        let b = q.as_bytes();
        let numbered = b.len() > 3
            && b[0].is_ascii_digit()
            && b[1].is_ascii_digit()
            && b[2] == b'_'
            && b[3].is_ascii_lowercase();
        let layer = q
            .strip_prefix("layer_")
            .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit() || c == '{'));
        numbered || layer || *q == "sample"
    })
}

#[test]
fn stage_names_live_in_the_catalogue() {
    let mut hits = Vec::new();
    for (name, text) in files(&["."]) {
        let is_test_file = name.ends_with("/tests.rs") || name.contains("/tests/");
        if name == "events/stages.rs" || is_test_file {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            if line.starts_with("#[cfg(test)]") {
                break; // unit tests may spell fixtures out
            }
            let code = line.split("//").next().unwrap_or_default();
            if let Some(q) = stage_literal(code) {
                hits.push(format!("{name}:{}: \"{q}\"", n + 1));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "stage names outside events/stages.rs:\n{}",
        hits.join("\n")
    );
}

#[test]
fn the_checks_can_fail() {
    let planted = vec![(
        "prune/x.rs".to_string(),
        "use crate::sinks::CsvSink;\nuse crate::sinksx;\n".to_string(),
    )];
    assert_eq!(naming(&planted, &["sinks"]).len(), 1);
    assert_eq!(
        stage_literal(r#"p.stage("03_before_pruning");"#),
        Some("03_before_pruning")
    );
    assert_eq!(stage_literal(r#"format!("{i:02}_x")"#), None);
    assert_eq!(stage_literal(r#"scope("layer_01")"#), Some("layer_01"));
    assert_eq!(
        stage_literal(r#"format!("layer_{i:02}")"#),
        Some("layer_{i:02}")
    );
    assert_eq!(stage_literal(r#"result("layer_sparsity", s)"#), None);
}
