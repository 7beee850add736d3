use super::*;
use crate::events::{RunPlan, RunSummary};
use crate::memory::MemorySnapshot;

fn snap(label: &str, t: f64, rss: u64, heap: u64, rss_peak: u64) -> MemorySnapshot {
    MemorySnapshot {
        label: label.into(),
        elapsed_s: t,
        rss: Some(rss),
        rss_peak: Some(rss_peak),
        heap_allocated: Some(heap),
        heap_peak: Some(heap),
        ..Default::default()
    }
}

fn stage(label: &str, t: f64, rss: u64, peak: u64) -> Event {
    Event::Stage {
        snapshot: snap(label, t, rss, rss / 2, peak),
    }
}

fn sample(t: f64, rss: u64, peak: u64) -> Event {
    Event::Sample {
        snapshot: snap("sample", t, rss, rss / 2, peak),
    }
}

const M: u64 = 1 << 20;

#[test]
fn stage_rows_carry_deltas_times_and_the_peak_between_stages() {
    let mut s = UiState::new(Mode::Viewer);
    s.apply(&stage("01_start", 0.0, 10 * M, 10 * M));
    s.apply(&sample(0.5, 40 * M, 40 * M));
    s.apply(&sample(0.9, 30 * M, 55 * M)); // the kernel saw 55 between samples
    s.apply(&stage("02_loaded", 1.0, 20 * M, 55 * M));
    s.apply(&sample(1.5, 25 * M, 55 * M));
    s.apply(&stage("03_done", 3.0, 22 * M, 55 * M));
    assert_eq!(s.run.stages.len(), 3);
    let r = &s.run.stages[1];
    assert_eq!(r.delta, Some(10 * M as i64));
    assert_eq!(r.peak, Some(55 * M));
    assert!((r.seconds - 1.0).abs() < 1e-9);
    // The later window did not reach the old peak.
    assert_eq!(s.run.stages[2].peak, Some(25 * M));
    assert_eq!(s.run.stages[2].delta, Some(2 * M as i64));
    assert_eq!(s.run.peak_stage(), Some(1));
    assert_eq!(s.run.rss.peak, Some(55 * M));
    assert_eq!(s.run.rss.now, Some(22 * M));
    assert_eq!(s.run.points.len(), 6);
}

#[test]
fn missing_readings_stay_missing() {
    let mut s = UiState::new(Mode::Viewer);
    s.apply(&Event::Sample {
        snapshot: MemorySnapshot {
            label: "sample".into(),
            elapsed_s: 1.0,
            ..Default::default()
        },
    });
    assert_eq!(s.run.rss.now, None);
    assert_eq!(s.run.gpu.peak, None);
    s.apply(&stage("01_start", 2.0, 5 * M, 5 * M));
    assert_eq!(s.run.stages[0].delta, None, "no previous row, no delta");
}

#[test]
fn eta_follows_layer_pace() {
    let mut s = UiState::new(Mode::Owner);
    s.apply(&stage("03_before_pruning", 10.0, M, M));
    for i in 0..3 {
        s.apply(&Event::Progress {
            index: i,
            total: 10,
            name: format!("model.layers.{i}"),
            pass: "pruning".into(),
            elapsed_s: 10.0 + 2.0 * (i + 1) as f64,
        });
    }
    // 3 layers in 6 s: 7 left at 2 s each.
    let eta = s.run.eta_s().unwrap();
    assert!((eta - 14.0).abs() < 1e-9, "{eta}");
    assert_eq!(s.run.progress.as_ref().unwrap().done, 3);
    s.apply(&Event::RunFinished {
        summary: RunSummary {
            status: RunStatus::Ok,
            wall_s: 30.0,
            rss_peak: Some(9 * M),
            heap_peak: None,
            device_peak: None,
            results: Default::default(),
        },
    });
    assert_eq!(s.run.eta_s(), None);
    assert_eq!(s.run.rss.peak, Some(9 * M));
}

#[test]
fn header_comes_from_the_plan() {
    let mut s = UiState::new(Mode::Viewer);
    let mut plan = RunPlan {
        command: "prune".into(),
        argv: vec!["prunemem".into(), "prune".into()],
        method: Some("wanda".into()),
        ..Default::default()
    };
    plan.settings.insert("sparsity".into(), 0.5.into());
    plan.settings.insert("sparsity_type".into(), "2:4".into());
    plan.model = Some(crate::events::ModelInfo {
        source: "/data/models/smollm2-135m".into(),
        layers: 30,
        hidden: 576,
        ..Default::default()
    });
    s.apply(&Event::RunStarted { plan });
    assert_eq!(s.command, "prunemem prune");
    assert_eq!(s.method, "wanda 0.5 2:4");
    assert_eq!(s.model, "models/smollm2-135m (30 layers, hidden 576)");
}

#[test]
fn quitting_a_running_owner_asks_first() {
    let mut s = UiState::new(Mode::Owner);
    assert_eq!(s.key(Key::Char('q')), Action::None);
    assert!(s.confirm_quit);
    assert_eq!(s.key(Key::Char('n')), Action::None);
    assert!(!s.confirm_quit);
    s.key(Key::Char('q'));
    assert_eq!(s.key(Key::Char('y')), Action::Abort);
    assert_eq!(
        s.key(Key::CtrlC),
        Action::Abort,
        "Ctrl-C needs no confirmation"
    );
    let mut v = UiState::new(Mode::Viewer);
    assert_eq!(v.key(Key::Char('q')), Action::Quit);
    assert_eq!(v.key(Key::CtrlC), Action::Quit);
}

#[test]
fn keys_pause_focus_scroll_and_help() {
    let mut s = UiState::new(Mode::Viewer);
    for i in 0..30 {
        s.apply(&stage(&format!("s{i:02}"), i as f64, M, M));
    }
    assert_eq!(s.stage_scroll, 29, "follows the newest row");
    s.key(Key::Up);
    s.key(Key::Up);
    assert_eq!(s.stage_scroll, 27);
    s.apply(&stage("s30", 30.0, M, M));
    assert_eq!(s.stage_scroll, 27, "scrolled away: stays put");
    s.key(Key::End);
    assert_eq!(s.stage_scroll, 30);
    s.key(Key::Home);
    assert_eq!(s.stage_scroll, 0);
    s.key(Key::PageDown);
    assert_eq!(s.stage_scroll, 10);
    s.key(Key::Tab);
    assert_eq!(s.focus, Focus::Messages);
    s.key(Key::Down);
    assert_eq!(s.message_scroll, 0, "no messages to scroll");
    s.key(Key::Char('p'));
    assert!(s.paused);
    s.key(Key::Char('p'));
    assert!(!s.paused);
    s.key(Key::Char('?'));
    assert!(s.help);
    assert_eq!(s.key(Key::Char('x')), Action::None);
    assert!(!s.help, "any key closes help");
}

#[test]
fn history_is_bounded() {
    let mut s = UiState::new(Mode::Viewer);
    for i in 0..(HISTORY_POINTS * 3) {
        s.apply(&sample(i as f64, M, M));
    }
    assert!(s.run.points.len() <= HISTORY_POINTS);
    assert_eq!(
        s.run.points.last().unwrap().t,
        (HISTORY_POINTS * 3 - 1) as f64
    );
    assert_eq!(s.run.points.first().unwrap().t, 0.0, "keeps the start");
}
