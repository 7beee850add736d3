use super::*;

fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/run-wanda-tiny")
}

#[test]
fn a_recorded_run_gives_a_full_report() {
    let run = load(&fixture()).unwrap();
    assert!(run.notes.is_empty(), "{:?}", run.notes);
    assert!(run.stages.iter().any(|s| s.label() == "04_after_pruning"));
    let out = tempfile::tempdir().unwrap();
    let w = write_report(&run, &fixture(), out.path(), None).unwrap();
    let md = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    for want in [
        "## Summary",
        "Peak RSS",
        "the model",
        "## Timeline",
        "← peak",
        "## Top consumers",
        "theoretical minimum",
        "## Estimate vs measured",
        "LLaMA 7B",
    ] {
        assert!(md.contains(want), "missing {want:?}:\n{md}");
    }
    let html = std::fs::read_to_string(out.path().join("report.html")).unwrap();
    assert!(html.contains("<table>") && html.contains("</html>"));
    #[cfg(feature = "charts")]
    {
        assert!(html.contains("<svg"), "charts are inline");
        assert!(w.files.iter().any(|f| f.ends_with("timeline.png")));
        assert!(
            std::fs::metadata(out.path().join("stages.png"))
                .unwrap()
                .len()
                > 5000
        );
    }
    let _ = w;
}

#[cfg(feature = "charts")]
#[test]
fn charts_have_titles_series_and_binary_units() {
    let run = load(&fixture()).unwrap();
    let svg = charts::svg(|a| charts::timeline(a, &[&run], "Memory over time: tiny")).unwrap();
    for want in [
        "Memory over time: tiny",
        "RSS",
        "allocated",
        "memory (MiB)",
        "elapsed (s)",
        "peak ",
    ] {
        assert!(svg.contains(want), "missing {want:?}");
    }
    let bars = charts::svg(|a| charts::stage_bars(a, &run, "RSS per stage")).unwrap();
    assert!(bars.contains("02_model_loaded") && bars.contains("RSS per stage"));
    assert!(bars.contains("+"), "deltas are written");
    assert!(
        !bars.contains("layer_00"),
        "per-layer stages are left out of the bars"
    );
    // The same log gives the same file, byte for byte (the bars once came
    // out of a hash map in a different order every run).
    for _ in 0..3 {
        let again = charts::svg(|a| charts::stage_bars(a, &run, "RSS per stage")).unwrap();
        assert_eq!(again, bars, "stage bars differ between two renderings");
    }
}

#[test]
fn python_csv_logs_are_read_and_compared_with_a_prunemem_run() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("memory_log.csv");
    std::fs::write(
        &csv,
        "Timestamp,Checkpoint,GPU_Allocated_GB,GPU_Reserved_GB,GPU_Peak_GB,CPU_Used_GB,CPU_Percent,Extra\n\
         2025-01-01T10:00:00.000,01_start,0.0,0.0,0.0,0.5,10,x\n\
         2025-01-01T10:00:05.500,02_model_loaded,0.25,0.3,0.25,1.5,50,y\n\
         2025-01-01T10:00:20.000,04_after_pruning,0.25,0.5,1.0,1.75,80,z\n",
    )
    .unwrap();
    let py = load(dir.path()).unwrap();
    assert_eq!(py.stages.len(), 3);
    assert_eq!(py.stages[1].point.t, 5.5);
    assert_eq!(py.stages[1].point.allocated, Some(1 << 28));
    assert!(py.notes.iter().any(|n| n.contains("Extra")));
    let ours = load(&fixture()).unwrap();
    let out = tempfile::tempdir().unwrap();
    write_compare(&[ours, py], out.path()).unwrap();
    let md = std::fs::read_to_string(out.path().join("compare.md")).unwrap();
    for want in [
        "| scope | continuous peak | checkpoint snapshots |",
        "measured differently",
        "02_model_loaded",
        "Net:",
    ] {
        assert!(md.contains(want), "missing {want:?}:\n{md}");
    }
}

#[test]
fn bad_inputs_are_errors_or_marked_partial() {
    let dir = tempfile::tempdir().unwrap();
    assert!(
        load(&dir.path().join("missing"))
            .unwrap_err()
            .to_string()
            .contains("no such run folder")
    );
    assert!(
        load(dir.path())
            .unwrap_err()
            .to_string()
            .contains("no events.jsonl")
    );
    std::fs::write(dir.path().join("events.jsonl"), "").unwrap();
    assert!(load(dir.path()).unwrap_err().to_string().contains("empty"));
    // A torn last line and no final event: a partial report, marked.
    let text = std::fs::read_to_string(fixture().join("events.jsonl")).unwrap();
    let cut: Vec<&str> = text.lines().collect();
    let torn = cut[..cut.len() - 1].join("\n") + "\n{\"event\":\"run_fin";
    std::fs::write(dir.path().join("events.jsonl"), torn).unwrap();
    let run = load(dir.path()).unwrap();
    assert!(run.notes.iter().any(|n| n.contains("torn")));
    assert!(run.notes.iter().any(|n| n.contains("partial")));
    let md = text::markdown(&run, None, false, None);
    assert!(md.contains("partial report"));
    let whole = load(&fixture()).unwrap();
    let cmp = compare_text::compare_markdown(&[whole, run], false);
    assert!(cmp.contains("partial report"), "compare marks the torn log");
    let csvdir = tempfile::tempdir().unwrap();
    std::fs::write(csvdir.path().join("memory_log.csv"), "a,b,c\n1,2,3\n").unwrap();
    let e = load(csvdir.path()).unwrap_err().to_string();
    assert!(e.contains("unknown columns (a, b, c)"), "{e}");
}

#[test]
fn breakdown_has_measured_and_predicted_bars_summing_to_their_totals() {
    let run = load(&fixture()).unwrap();
    let check = text::estimate_check(&fixture());
    let bars = breakdown::bars(&run, check.as_ref());
    assert_eq!(bars.len(), 2, "measured and estimate");
    let measured = &bars[0];
    let c = check.as_ref().unwrap();
    let peak = c.phases[c.estimate.peak_phase()].measured.unwrap();
    assert_eq!(
        measured.total(),
        peak,
        "topped up to the peak of the estimate's peak phase"
    );
    let alone = breakdown::measured(&run, None).unwrap();
    assert_eq!(
        alone.total(),
        run.summary.as_ref().and_then(|s| s.rss_peak).unwrap()
    );
    assert!(
        measured
            .parts
            .iter()
            .any(|(n, _)| n.starts_with("unaccounted"))
    );
    assert!(bars[1].label.starts_with("estimate ("));
    let md = text::markdown(&run, check.as_ref(), false, None);
    assert!(md.contains("## What the peak is made of"), "{md}");
    assert!(md.contains("| **total** |"));
}

#[cfg(feature = "charts")]
#[test]
fn stacked_and_aligned_charts_name_their_parts() {
    let run = load(&fixture()).unwrap();
    let check = text::estimate_check(&fixture());
    let bars = breakdown::bars(&run, check.as_ref());
    let svg =
        charts::svg(|a| charts_stacked::breakdown(a, &bars, "What the peak is made of")).unwrap();
    assert!(svg.contains("What the peak is made of"));
    assert!(svg.contains("memory at the peak (MiB)"));
    for (name, _) in &bars[0].parts {
        assert!(svg.contains(name.as_str()), "legend names {name}");
    }
    let mut other = run.clone();
    other.name = "second".into();
    other.stages.retain(|s| s.label() != "05_before_eval");
    let mut extra = other.stages[0].clone();
    extra.snapshot.label = "01b_extra".into();
    other.stages.insert(1, extra);
    let stages = charts_stacked::aligned_stages(&[&run, &other]);
    let pos = |l: &str| stages.iter().position(|s| s == l).unwrap();
    assert!(pos("01_start") < pos("01b_extra") && pos("01b_extra") < pos("02_model_loaded"));
    assert!(stages.contains(&"05_before_eval".to_string()));
    assert!(!stages.iter().any(|s| s.starts_with("layer_")));
    let svg =
        charts::svg(|a| charts_stacked::stage_overlay(a, &[&run, &other], "Aligned")).unwrap();
    for want in [
        "Aligned",
        "second",
        "run-wanda-tiny",
        "01b_extra",
        "RSS at the stage (MiB)",
    ] {
        assert!(svg.contains(want), "missing {want:?}");
    }
}

#[test]
fn projection_to_a_named_gpu() {
    let run = load(&fixture()).unwrap();
    let gpu = crate::estimate::catalog::find("RTX 4090").unwrap();
    let md = text::markdown(&run, None, false, Some(&gpu));
    assert!(md.contains("## Projection to RTX 4090"), "{md}");
    assert!(md.contains("| LLaMA 7B |"), "{md}");
    assert!(md.contains("usable"));
}

#[test]
fn the_peak_by_category_is_a_measured_table() {
    let mut run = load(&fixture()).unwrap();
    let md = text::markdown(&run, None, false, None);
    assert!(
        !md.contains("by category"),
        "no section without measurements"
    );
    run.fold.peak_categories.insert("weights".into(), 3 << 20);
    run.fold.peak_categories.insert("untagged".into(), 1 << 20);
    let md = text::markdown(&run, None, false, None);
    assert!(md.contains("## The heap at its peak, by category (measured)"));
    assert!(md.contains("| weights | 3.000 MiB | 75.0% |"), "{md}");
    assert!(md.contains("| untagged | 1.000 MiB | 25.0% |"), "{md}");
}

#[test]
fn the_category_chart_names_every_category() {
    let mut run = load(&fixture()).unwrap();
    for (k, t) in [0.0, 1.0, 2.0].into_iter().enumerate() {
        let mut c = std::collections::BTreeMap::new();
        c.insert("weights".to_string(), (10 + k as u64) << 20);
        c.insert("activations".to_string(), 5 << 20);
        c.insert("small allocations".to_string(), 1 << 20);
        run.fold.category_points.push((t, c));
    }
    let svg = charts::svg(|a| charts_area::categories(a, &run, "By category")).unwrap();
    for name in [
        "weights",
        "activations",
        "small allocations",
        "live heap by category (MiB)",
    ] {
        assert!(svg.contains(name), "missing {name}");
    }
}

/// The fixture's log with heap categories on every stage (as a current
/// prunemem writes them), in a temporary folder.
fn fixture_with_categories() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for f in ["memory_log.csv", "summary.txt"] {
        let _ = std::fs::copy(fixture().join(f), dir.path().join(f));
    }
    let text = std::fs::read_to_string(fixture().join("events.jsonl")).unwrap();
    let mut out = String::new();
    for line in text.lines() {
        let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
        if v["event"] == "stage" {
            let heap = v["snapshot"]["heap_allocated"].as_u64().unwrap_or(4 << 20);
            let cats = serde_json::json!({"weights": heap / 2, "activations": heap / 4, "small allocations": heap / 4});
            v["snapshot"]["categories"] = cats.clone();
            v["snapshot"]["window_peak_categories"] = cats;
        }
        out.push_str(&v.to_string());
        out.push('\n');
    }
    std::fs::write(dir.path().join("events.jsonl"), out).unwrap();
    dir
}

#[test]
fn measured_and_predicted_bars_share_the_categories() {
    let dir = fixture_with_categories();
    let run = load(dir.path()).unwrap();
    let check = text::estimate_check(dir.path()).expect("an estimate");
    let bars = breakdown::bars(&run, Some(&check));
    assert_eq!(bars.len(), 2);
    let names = |b: &breakdown::Bar| b.parts.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(names(&bars[0]), names(&bars[1]), "one list of categories");
    for n in names(&bars[0]) {
        assert!(
            crate::memory::tag::Category::from_name(&n).is_some(),
            "{n} is a category"
        );
    }
    let i = check.estimate.peak_phase();
    assert_eq!(
        bars[0].total(),
        check.phases[i].measured.unwrap(),
        "sums to the phase's peak"
    );
    assert_eq!(bars[1].total(), check.phases[i].predicted);
    let md = text::markdown(&run, Some(&check), false, None);
    assert!(md.contains("By category at each phase's peak"), "{md}");
    assert!(md.contains("| weights |"), "{md}");
}

/// The device section's bus table: the phases as the run went through them
/// (the log's map has them by name), each with its seconds.
#[test]
fn the_bus_table_follows_the_run_with_each_phases_seconds() {
    let mut fold = crate::events::fold::RunFold::new();
    let results: std::collections::BTreeMap<String, serde_json::Value> =
        serde_json::from_value(serde_json::json!({
            "transfers": {
                "eval": {"host_to_device_bytes": 1024, "device_to_host_bytes": 8, "kernels": 98},
                "load_layer": {"host_to_device_bytes": 2048, "device_to_host_bytes": 0, "kernels": 0},
                "probe_backward": {"host_to_device_bytes": 0, "device_to_host_bytes": 4096, "kernels": 2342},
                "probe_forward": {"host_to_device_bytes": 0, "device_to_host_bytes": 0, "kernels": 392},
                "probe_head": {"host_to_device_bytes": 0, "device_to_host_bytes": 512, "kernels": 240},
                "prune": {"host_to_device_bytes": 0, "device_to_host_bytes": 0, "kernels": null}
            },
            "seconds_by_phase": {"eval": 1.5, "load_layer": 0.25, "probe_backward": 9.0, "probe_forward": 2.0, "probe_head": 1.0}
        }))
        .unwrap();
    fold.apply(&crate::events::Event::RunFinished {
        summary: crate::events::RunSummary {
            status: crate::events::RunStatus::Ok,
            wall_s: 14.0,
            rss_peak: None,
            heap_peak: None,
            device_peak: None,
            results,
        },
    });
    let run = load::RunData {
        name: "gradprobe".into(),
        fold,
        scope: load::Scope::Continuous,
        notes: Vec::new(),
        ranks: None,
    };
    let mut md = String::new();
    sections::device(&mut md, &run);
    let rows: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).skip(1).collect();
    let phases: Vec<&str> = rows
        .iter()
        .map(|r| r.split('|').nth(1).unwrap().trim())
        .collect();
    assert_eq!(
        phases,
        [
            "load layer",
            "probe forward",
            "probe head",
            "probe backward",
            "prune",
            "eval"
        ],
        "{md}"
    );
    assert!(
        rows[3].contains("| 9.00 | 0 B | 4.000 KiB | 2342 |"),
        "{md}"
    );
    // A phase without a time reads "—", a launch count not counted "n/a".
    assert!(
        rows[4].contains("| — |") && rows[4].ends_with("| n/a |"),
        "{md}"
    );
}

/// A device run's readings with NVML's utilisation in each phase: the
/// device section gives each phase's mean beside its bytes and names the
/// phase that left the GPU idle longest; the timeline gives each stage
/// window's mean. A run without utilisation readings has neither.
#[test]
fn the_report_says_where_the_gpu_idled() {
    use crate::events::{Event, RunStatus, RunSummary};
    use crate::memory::{BusReading, MemorySnapshot};
    let reading = |label: &str, t: f64, util: Option<f32>, phase: &str| MemorySnapshot {
        label: label.into(),
        elapsed_s: t,
        rss: Some(100 << 20),
        device_allocated: Some(50 << 20),
        gpu_util_percent: util,
        bus: Some(BusReading {
            phase: Some(phase.into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let stage = |l, t, u, p| Event::Stage {
        snapshot: reading(l, t, u, p),
    };
    let sample = |t, u, p| Event::Sample {
        snapshot: reading("sample", t, u, p),
    };
    let events = |util: bool| {
        let u = |x: f32| util.then_some(x);
        let results = serde_json::json!({
            "transfers": {
                "load_layer": {"host_to_device_bytes": 4096, "device_to_host_bytes": 0, "kernels": 3, "compiled": 2, "from_cache": 1},
                "prune": {"host_to_device_bytes": 0, "device_to_host_bytes": 64, "kernels": 90, "compiled": 9, "from_cache": 0},
                "eval": {"host_to_device_bytes": 8, "device_to_host_bytes": 4, "kernels": 40},
            },
            "seconds_by_phase": {"load_layer": 4.0, "prune": 2.0, "eval": 1.0},
        });
        vec![
            stage("01_start", 0.0, u(0.0), "other"),
            sample(1.0, u(4.0), "load_layer"),
            sample(2.0, u(6.0), "load_layer"),
            stage("03_before_pruning", 3.0, u(5.0), "load_layer"),
            sample(4.0, u(70.0), "prune"),
            stage("04_after_pruning", 5.0, u(80.0), "prune"),
            // A phase with no reading: unknown, never 0%.
            stage("07_after_eval", 6.0, None, "eval"),
            Event::RunFinished {
                summary: RunSummary {
                    status: RunStatus::Ok,
                    wall_s: 7.0,
                    rss_peak: None,
                    heap_peak: None,
                    device_peak: Some(50 << 20),
                    results: serde_json::from_value(results).unwrap(),
                },
            },
        ]
    };
    let run = |util| RunData {
        name: "device".into(),
        fold: crate::events::fold::RunFold::of(&events(util)),
        scope: load::Scope::Continuous,
        notes: vec![],
        ranks: None,
    };
    let md = text::markdown(&run(true), None, false, None);
    for want in [
        "NVML's GPU utilisation averaged 27.5% over 6 samples; the GPU idled longest in `load_layer`: 4.00 s at 5% busy, about 3.80 s idle.",
        "| phase | seconds | GPU busy | host → device | device → host | kernels |",
        "| load layer | 4.00 | 5% | 4.000 KiB | 0 B | 3 |",
        "| prune | 2.00 | 75% | 0 B | 64 B | 90 |",
        "| eval | 1.00 | n/a | 8 B | 4 B | 40 |",
        "peak since previous | GPU busy since previous |",
        // The eval phase's counts are missing: an older log's shape.
        "The run compiled 11 kernels and loaded 1 from the kernel cache (`off`); compiled by phase: load_layer 2, prune 9. A later run of this build loads them instead.",
    ] {
        assert!(md.contains(want), "missing {want:?}:\n{md}");
    }
    let windows: Vec<&str> = md
        .lines()
        .filter(|l| {
            ["| 01_start", "| 03_before", "| 04_after", "| 07_after"]
                .iter()
                .any(|s| l.starts_with(s))
        })
        .map(|l| l.rsplit('|').nth(1).unwrap().trim())
        .collect();
    assert_eq!(windows, ["0%", "5%", "75%", "n/a"], "{md}");
    // Beside another run (a watched script without NVML readings): each
    // run's mean, unknown where it had none.
    let cmp = compare_text::compare_markdown(&[run(true), run(false)], false);
    assert!(
        cmp.contains("| **GPU busy (mean)** | 27.5% | n/a |"),
        "{cmp}"
    );
    let none = text::markdown(&run(false), None, false, None);
    assert!(!none.contains("GPU busy since previous"), "{none}");
    assert!(!none.contains("NVML"), "{none}");
    // Nor a column where no phase could have a reading.
    assert!(!none.contains("GPU busy"), "{none}");
    assert!(
        none.contains("| prune | 2.00 | 0 B | 64 B | 90 |"),
        "{none}"
    );
}
