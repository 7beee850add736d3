use ratatui::Terminal;
use ratatui::backend::TestBackend;

use super::gauges::bar;
use super::*;
use crate::events::Event;
use crate::events::fold::Reading;
use crate::memory::MemorySnapshot;
use crate::tui::state::{Key, UiState};

const M: u64 = 1 << 20;

fn screen(state: &UiState, w: u16, h: u16) -> String {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| draw(f, state)).unwrap();
    let buf = t.backend().buffer().clone();
    let mut out = String::new();
    for y in 0..h {
        for x in 0..w {
            out.push_str(buf[(x, y)].symbol());
        }
        out.push('\n');
    }
    out
}

fn state() -> UiState {
    let mut s = UiState::new(Mode::Owner);
    let mut t = 0.0;
    for (label, rss) in [
        ("01_start", 20),
        ("02_model_loaded", 120),
        ("layer_00_pruned", 300),
        ("04_after_pruning", 90),
    ] {
        t += 1.0;
        s.apply(&Event::Sample {
            snapshot: MemorySnapshot {
                label: "sample".into(),
                elapsed_s: t - 0.5,
                rss: Some(rss * M + 5 * M),
                heap_allocated: Some(rss * M),
                ..Default::default()
            },
        });
        s.apply(&Event::Stage {
            snapshot: MemorySnapshot {
                label: label.into(),
                elapsed_s: t,
                rss: Some(rss * M),
                rss_peak: Some(305 * M),
                heap_allocated: Some(rss * M / 2),
                ..Default::default()
            },
        });
    }
    s.apply(&Event::Progress {
        index: 0,
        total: 30,
        name: "model.layers.0".into(),
        pass: "pruning".into(),
        elapsed_s: t,
    });
    s.apply(&Event::Message {
        level: Level::Warn,
        text: "seqlen capped at 2048".into(),
        elapsed_s: t,
    });
    s
}

#[test]
fn the_screen_shows_gauges_stages_progress_and_messages() {
    let text = screen(&state(), 120, 36);
    for want in [
        "RSS",
        "allocated",
        "GPU used",
        "n/a",
        "02_model_loaded",
        "layer_00_pruned",
        "+100.0 MiB",
        "1/30 model.layers.0",
        "seqlen capped at 2048",
        "q stop run",
        "history (MiB",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
}

#[test]
fn the_peak_row_is_highlighted() {
    let s = state();
    let mut t = Terminal::new(TestBackend::new(120, 36)).unwrap();
    t.draw(|f| draw(f, &s)).unwrap();
    let buf = t.backend().buffer().clone();
    let row = (0..36)
        .find(|&y| {
            let line: String = (0..120).map(|x| buf[(x, y)].symbol().to_string()).collect();
            line.contains("layer_00_pruned")
        })
        .unwrap();
    let x = (0..120)
        .find(|&x| buf[(x, row)].symbol() == "l" && buf[(x + 1, row)].symbol() == "a")
        .unwrap();
    assert_eq!(buf[(x, row)].bg, Color::Yellow);
    let other = (0..36)
        .find(|&y| {
            let line: String = (0..120).map(|x| buf[(x, y)].symbol().to_string()).collect();
            line.contains("01_start")
        })
        .unwrap();
    assert_ne!(buf[(x, other)].bg, Color::Yellow);
}

#[test]
fn a_small_terminal_gets_a_message() {
    let text = screen(&state(), 60, 20);
    assert!(text.contains("terminal too small"), "{text}");
    assert!(!text.contains("stages"));
}

#[test]
fn confirm_and_help_overlays() {
    let mut s = state();
    s.key(Key::Char('q'));
    assert!(screen(&s, 100, 30).contains("Stop the run?"));
    s.key(Key::Char('n'));
    s.key(Key::Char('?'));
    assert!(screen(&s, 100, 30).contains("pause / resume"));
}

#[test]
fn bars_mark_the_peak() {
    let r = Reading {
        now: Some(50),
        peak: Some(80),
        total: None,
    };
    let b = bar(&r, 100, 10);
    assert_eq!(b.chars().count(), 10);
    assert_eq!(b.chars().filter(|c| *c == '█').count(), 5);
    assert_eq!(b.chars().position(|c| c == '│'), Some(7));
    let none = bar(&Reading::default(), 100, 10);
    assert_eq!(none, "░".repeat(10));
}

#[test]
fn an_80_column_terminal_keeps_the_stage_table() {
    let text = screen(&state(), 80, 24);
    assert!(text.contains("02_model_loaded"), "{text}");
    assert!(!text.contains("history"), "{text}");
}

#[test]
fn the_heap_split_by_category_is_drawn_now_and_at_the_peak() {
    let mut s = state();
    let blank = screen(&s, 140, 40);
    assert!(
        blank.contains("by kind   n/a"),
        "no categories yet: n/a, not 0"
    );
    let mut cats = std::collections::BTreeMap::new();
    cats.insert("weights".to_string(), 300 * M);
    cats.insert("activations".to_string(), 100 * M);
    s.apply(&Event::Sample {
        snapshot: MemorySnapshot {
            label: "sample".into(),
            elapsed_s: 9.0,
            categories: cats,
            ..Default::default()
        },
    });
    let text = screen(&s, 140, 40);
    let line = text.lines().find(|l| l.contains("by kind")).unwrap();
    assert!(
        line.contains("heap now 400.0 MiB: weights 300.0 MiB · activations 100.0 MiB"),
        "{line}"
    );
    // Three quarters of the bar are weights.
    let bar: String = line
        .chars()
        .skip_while(|c| *c != '█')
        .take_while(|c| *c == '█')
        .collect();
    assert!(bar.chars().count() >= 10, "{line}");
    let peak = text.lines().find(|l| l.contains("at peak")).unwrap();
    // No stage window yet: the fullest reading so far is the peak.
    assert!(
        peak.contains("heap peak 400.0 MiB: weights 300.0 MiB · activations 100.0 MiB"),
        "the live peak before any stage window: {peak}"
    );
    // A stage whose window peaked at 600 MiB: the peak bar is that
    // composition, on the same scale (longer than the bar of now).
    let mut window = std::collections::BTreeMap::new();
    window.insert("activations".to_string(), 450 * M);
    window.insert("weights".to_string(), 150 * M);
    s.apply(&Event::Stage {
        snapshot: MemorySnapshot {
            label: "05_before_eval".into(),
            elapsed_s: 10.0,
            window_peak_categories: window,
            ..Default::default()
        },
    });
    let text = screen(&s, 140, 40);
    let peak = text.lines().find(|l| l.contains("at peak")).unwrap();
    assert!(
        peak.contains("heap peak 600.0 MiB: activations 450.0 MiB · weights 150.0 MiB"),
        "{peak}"
    );
    let blocks = |l: &str| l.chars().filter(|c| *c == '█').count();
    let now = text.lines().find(|l| l.contains("by kind")).unwrap();
    assert!(blocks(peak) > blocks(now), "one scale:\n{now}\n{peak}");
}

#[test]
fn the_forecast_line_says_whether_the_run_fits_its_budget() {
    let mut s = state();
    let none = screen(&s, 160, 40);
    assert!(
        none.contains("forecast  n/a"),
        "no plan, no estimate:\n{none}"
    );
    // Prune phase predicted at 200 MiB; this run went to 300 MiB in it.
    s.estimate = Some(crate::estimate::Estimate {
        arch: crate::estimate::presets::all().remove(0),
        workload: crate::estimate::Workload::new(crate::estimate::Task::Wanda),
        phases: vec![
            crate::estimate::Phase::new("prune", &["02_model_loaded", "04_after_pruning"])
                .add("activations", 150 * M)
                .add("weights", 50 * M),
            crate::estimate::Phase::new("eval", &["05_before_eval", "06_after_eval"])
                .add("logits", 100 * M),
        ],
        saved_weights: None,
        notes: Vec::new(),
        device_pool: None,
    });
    s.budget = Some(1 << 30);
    let fits = screen(&s, 160, 40);
    let line = fits.lines().find(|l| l.contains("forecast")).unwrap();
    assert!(line.contains("fits --budget 1.000 GiB"), "{line}");
    assert!(line.contains("estimate 200.0 MiB"), "{line}");
    s.budget = Some(250 * M);
    let over = screen(&s, 160, 40);
    let line = over.lines().find(|l| l.contains("forecast")).unwrap();
    assert!(
        line.contains("EXCEEDED --budget 250.0 MiB in prune"),
        "{line}"
    );
}

#[test]
fn the_eta_names_the_pass_it_measures() {
    use super::pass_name;
    use crate::events::fold::Progress;
    let unit = |name: &str, pass: &str| Progress {
        done: 1,
        total: 2,
        name: name.into(),
        pass: pass.into(),
        origin_s: 0.0,
    };
    // The pass the progress event names.
    assert_eq!(
        pass_name(&unit("eval batch 1", "dense evaluation")),
        "dense evaluation"
    );
    assert_eq!(
        pass_name(&unit("backward layer 4", "gradient pass (modified)")),
        "gradient pass (modified)"
    );
    // Logs written before events named it: read from the unit.
    assert_eq!(pass_name(&unit("eval model.layers.3", "")), "evaluation");
    assert_eq!(pass_name(&unit("eval logits batch 2", "")), "logits");
    assert_eq!(pass_name(&unit("model.layers.12", "")), "pruning");
    assert_eq!(
        pass_name(&unit("OWL outliers, model.layers.0", "")),
        "OWL outliers"
    );
    assert_eq!(pass_name(&unit("backward layer 4", "")), "gradient pass");
    assert_eq!(
        pass_name(&unit("epoch 1 step 3/6 loss 2.1", "")),
        "training"
    );
}

/// A device run's bus in the live view: bytes each way and launches so
/// far, their rates over the last second, and the phase open; no line on
/// the CPU backend, whose readings have no bus.
#[test]
fn a_device_run_shows_its_bus_and_launches_as_they_go() {
    let mut s = state();
    assert!(
        !screen(&s, 140, 40).contains("bus "),
        "no bus line without a bus reading"
    );
    let bus = |t: f64, up: u64, down: u64, kernels: u64, phase: &str| Event::Sample {
        snapshot: MemorySnapshot {
            label: "sample".into(),
            elapsed_s: t,
            device_allocated: Some(100 * M),
            device_reserved: Some(120 * M),
            bus: Some(crate::memory::BusReading {
                host_to_device_bytes: up,
                device_to_host_bytes: down,
                kernels: Some(kernels),
                phase: Some(phase.into()),
                compiled: Some(kernels / 100),
            }),
            ..Default::default()
        },
    };
    s.apply(&bus(10.0, 100 * M, 4096, 1000, "load_layer"));
    s.apply(&bus(10.5, 300 * M, 4096, 1500, "probe_backward"));
    s.apply(&bus(11.0, 500 * M, 8192, 2000, "probe_backward"));
    let text = screen(&s, 140, 40);
    let line = text
        .lines()
        .find(|l| l.contains("bus "))
        .unwrap_or_else(|| panic!("no bus line in\n{text}"));
    for want in [
        "↑ 500.0 MiB 400.0 MiB/s",
        "↓ 8.000 KiB 4.000 KiB/s",
        "2000 kernels 1000/s, 20 compiled",
        "in probe_backward",
    ] {
        assert!(line.contains(want), "missing {want:?} in {line}");
    }
}

/// NVML's utilisation in the live view: the latest reading, the run's
/// mean and, on a device run, the open phase's mean, so a user sees which
/// phase keeps the GPU idle while it runs.
#[test]
fn the_gpu_line_gives_the_open_phases_utilisation() {
    let mut s = state();
    let reading = |t: f64, util: f32, phase: &str| Event::Sample {
        snapshot: MemorySnapshot {
            label: "sample".into(),
            elapsed_s: t,
            gpu_used: Some(900 * M),
            gpu_total: Some(8000 * M),
            gpu_util_percent: Some(util),
            bus: Some(crate::memory::BusReading {
                phase: Some(phase.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
    };
    s.apply(&reading(1.0, 10.0, "load_layer"));
    s.apply(&reading(2.0, 60.0, "prune"));
    s.apply(&reading(3.0, 80.0, "prune"));
    let text = screen(&s, 140, 40);
    let line = text
        .lines()
        .find(|l| l.contains("GPU busy"))
        .unwrap_or_else(|| panic!("no GPU busy line in\n{text}"));
    assert!(line.contains("80%  mean 50%  prune 70%"), "{line}");
    // Its bar is the latest reading's share of 100%.
    let cells = line.chars().filter(|c| *c == '█').count();
    let all = cells + line.chars().filter(|c| *c == '░').count();
    assert_eq!(cells, (all as f64 * 0.8).round() as usize, "{line}");
    // The narrowest terminal keeps the phase's figure.
    let narrow = screen(&s, 80, 40);
    assert!(narrow.contains("prune 70%"), "{narrow}");
    // No reading, no line.
    assert!(!screen(&state(), 140, 40).contains("GPU busy"));
}

/// A device run in a terminal's default 80×24: the pool (in use within its
/// reserve), the card, its utilisation, the bus and the forecast all show,
/// none cut at the right edge, and the latest stage keeps a row.
#[test]
fn a_device_run_fits_80_by_24() {
    let mut s = state();
    s.apply(&Event::RunStarted {
        plan: crate::events::RunPlan {
            command: "prune".into(),
            device: "cuda".into(),
            method: Some("wanda".into()),
            model: Some(crate::events::ModelInfo {
                source: "/data/models/llama-3.2-1b-instruct".into(),
                layers: 16,
                hidden: 2048,
                ..Default::default()
            }),
            ..Default::default()
        },
    });
    let reading = |t: f64, k: u64| Event::Sample {
        snapshot: MemorySnapshot {
            label: "sample".into(),
            elapsed_s: t,
            rss: Some(300 * M),
            heap_allocated: Some(200 * M),
            device_allocated: Some(100 * M * k),
            device_reserved: Some(120 * M * k),
            gpu_used: Some(900 * M * k),
            gpu_total: Some(81_559 * M),
            gpu_util_percent: Some(40.0 * k as f32),
            bus: Some(crate::memory::BusReading {
                host_to_device_bytes: 700 * M * k,
                device_to_host_bytes: 8192 * k,
                kernels: Some(10_000 * k),
                phase: Some("stats_pass".into()),
                compiled: Some(120 * k),
            }),
            ..Default::default()
        },
    };
    s.apply(&reading(10.0, 1));
    s.apply(&reading(11.0, 2));
    let text = screen(&s, 80, 24);
    let line = |start: &str| {
        text.lines()
            .find(|l| l.trim_start_matches('│').starts_with(start))
            .unwrap_or_else(|| panic!("no {start:?} line in\n{text}"))
            .to_string()
    };
    // Each figure whole: a line that ran past the edge loses its end.
    for (start, end) in [
        ("host", "peak 305.0 MiB"),
        (
            "device",
            "in use 200.0 MiB / reserved 240.0 MiB  peak 240.0 MiB",
        ),
        ("GPU used", "1.758 GiB of 79.65 GiB  peak 1.758 GiB"),
        ("GPU busy", "80%  mean 60%  stats_pass 60%"),
        ("bus", "10000 kernels/s, 240 compiled"),
        ("forecast", "n/a (no estimate for this plan)"),
    ] {
        let l = line(start);
        assert!(l.trim_end_matches([' ', '│']).ends_with(end), "{l}\n{text}");
    }
    // The pool's bar: in use (█) within the reserve (▒), on one scale.
    let device = line("device");
    let used = device.chars().filter(|c| *c == '█').count();
    let reserved = used + device.chars().filter(|c| *c == '▒').count() + 1;
    assert!(used > 0 && reserved > used, "{device}");
    // The bus gives up its bytes' rates and the launches' total (the busy
    // line names the phase); the bytes stay.
    assert!(line("bus").contains("↑ 1.367 GiB  ↓ 16.00 KiB  "), "{text}");
    assert!(text.contains("04_after_pruning"), "{text}");
    // The header keeps the run's status and time; the edge cuts the
    // model's name, which the command line names too.
    let header = line("running");
    assert!(header.contains("elapsed 00:00:11   ETA "), "{header}");
    assert!(
        header
            .trim_end_matches('│')
            .ends_with("model models/llama-3.2-…"),
        "{header}"
    );
    // A tall terminal keeps the separate gauges and both category lines.
    let tall = screen(&s, 140, 40);
    for want in [
        "model models/llama-3.2-1b-instruct (16 layers, hidden 2048)   method wanda",
        "│RSS ",
        "│heap ",
        "│reserved ",
        "│by kind",
        "│at peak",
        "700.0 MiB/s",
        "20000 kernels 10000/s, 240 compiled  in stats_pass",
    ] {
        assert!(tall.contains(want), "missing {want:?} in\n{tall}");
    }
}
