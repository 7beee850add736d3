use super::*;
use crate::events::{RunStatus, ScopeReport};

const M: u64 = 1 << 20;

fn snap(label: &str, t: f64, rss: u64, kernel: u64) -> MemorySnapshot {
    MemorySnapshot {
        label: label.into(),
        elapsed_s: t,
        rss: Some(rss * M),
        rss_peak: Some(kernel * M),
        heap_allocated: Some(rss * M / 2),
        heap_peak: Some(kernel * M / 2),
        ..Default::default()
    }
}

fn stage(label: &str, t: f64, rss: u64, kernel: u64) -> Event {
    Event::Stage {
        snapshot: snap(label, t, rss, kernel),
    }
}

fn sample(t: f64, rss: u64, kernel: u64) -> Event {
    Event::Sample {
        snapshot: snap(stages::SAMPLE, t, rss, kernel),
    }
}

fn progress(index: usize, total: usize, t: f64) -> Event {
    Event::Progress {
        index,
        total,
        name: format!("unit {index}"),
        pass: "pruning".into(),
        elapsed_s: t,
    }
}

#[test]
fn window_peaks_count_samples_and_a_rising_kernel_mark() {
    let f = RunFold::of(&[
        stage("a", 0.0, 10, 10),
        sample(0.5, 30, 30),
        stage("b", 1.0, 12, 30),
        // The kernel's mark rose to 50 between samples: counted here.
        stage("c", 2.0, 14, 50),
        stage("d", 3.0, 11, 50),
    ]);
    let peaks: Vec<_> = f.stages.iter().map(|s| s.peak.map(|p| p / M)).collect();
    assert_eq!(peaks, vec![Some(10), Some(30), Some(50), Some(14)]);
    assert_eq!(f.stages[1].delta, Some(2 * M as i64));
    assert_eq!(f.stages[0].delta, None);
    assert_eq!(f.peak_stage(), Some(2));
    assert_eq!(f.peak_between("a", "b"), Some(30 * M));
    assert_eq!(f.peak_between("c", "d"), Some(14 * M));
    assert_eq!(f.peak_between("a", "d"), Some(50 * M));
    assert_eq!(f.peak_between("d", "a"), None);
    assert_eq!(f.peak_between("a", "zz"), None);
    assert_eq!(f.sampled_rss_peak, Some((30 * M, 0.5)));
}

#[test]
fn a_repeated_run_is_read_through_its_last_repetition() {
    // Two steps of the same stages (GradProbe's --iterative): the first
    // reaches 30 between a and b, the second 20.
    let f = RunFold::of(&[
        stage("start", 0.0, 5, 5),
        stage("a", 1.0, 10, 10),
        sample(1.5, 30, 30),
        stage("b", 2.0, 12, 30),
        stage("a", 3.0, 11, 30),
        sample(3.5, 20, 30),
        stage("b", 4.0, 12, 30),
        stage("end", 5.0, 6, 30),
    ]);
    assert_eq!(f.peak_between("a", "b"), Some(30 * M));
    let last = f.last_of_each_stage();
    let labels: Vec<_> = last.stages.iter().map(|s| s.label()).collect();
    assert_eq!(labels, ["start", "a", "b", "end"]);
    assert_eq!(last.peak_between("a", "b"), Some(20 * M));
}

#[test]
fn heap_window_takes_scope_peaks() {
    let mut f = RunFold::new();
    f.apply(&stage("a", 0.0, 10, 10));
    f.apply(&Event::ScopeEnd {
        report: ScopeReport {
            label: "layer_00".into(),
            peak_heap: Some(99 * M),
            ..Default::default()
        },
    });
    f.apply(&stage("b", 1.0, 10, 10));
    assert_eq!(f.stages[1].heap_peak, Some(99 * M));
    assert_eq!(f.heap_peak_between("a", "b"), Some(99 * M));
}

#[test]
fn eta_restarts_with_each_sequence_from_the_last_stage() {
    let mut f = RunFold::new();
    f.apply(&stage("a", 10.0, 1, 1));
    f.apply(&progress(0, 4, 12.0));
    f.apply(&progress(1, 4, 14.0));
    // 2 of 4 done in 4 s since the stage: 4 s left.
    assert_eq!(f.eta_s(), Some(4.0));
    f.apply(&progress(3, 4, 18.0));
    assert_eq!(f.eta_s(), None, "finished sequence");
    f.apply(&stage("b", 20.0, 1, 1));
    f.apply(&progress(0, 10, 21.0));
    // A new sequence: its origin is stage b, not the first sequence's.
    assert_eq!(f.progress.as_ref().unwrap().origin_s, 20.0);
    assert_eq!(f.eta_s(), Some(9.0));
    f.apply(&Event::RunFinished {
        summary: RunSummary {
            status: RunStatus::Ok,
            wall_s: 30.0,
            rss_peak: Some(77 * M),
            heap_peak: None,
            device_peak: None,
            results: Default::default(),
        },
    });
    assert_eq!(f.eta_s(), None);
    assert_eq!(f.rss.peak, Some(77 * M));
    assert_eq!(f.peak_rss(), Some(77 * M));
}

#[test]
fn a_point_limit_thins_the_older_half() {
    let mut f = RunFold::with_point_limit(100);
    for i in 0..1000 {
        f.apply(&sample(i as f64, 1, 1));
    }
    assert!(f.points.len() <= 100, "{}", f.points.len());
    assert_eq!(f.points.last().unwrap().t, 999.0, "the newest point stays");
    assert!(f.points.windows(2).all(|w| w[0].t < w[1].t));
    let all = RunFold::of(
        &(0..1000)
            .map(|i| sample(i as f64, 1, 1))
            .collect::<Vec<_>>(),
    );
    assert_eq!(all.points.len(), 1000, "no limit, no thinning");
}

#[test]
fn durations() {
    assert_eq!(format_duration(42.4), "42s");
    assert_eq!(format_duration(185.0), "3m05s");
    assert_eq!(format_duration(3720.0), "1h02m");
}

#[test]
fn exact_window_peaks_from_the_profiler_count() {
    let mut s = snap("02_b", 2.0, 50, 60);
    s.window_rss_peak = Some(300 * M);
    s.window_heap_peak = Some(280 * M);
    let f = RunFold::of(&[
        stage("01_a", 1.0, 40, 60),
        sample(1.5, 55, 60),
        Event::Stage { snapshot: s },
    ]);
    assert_eq!(f.stages[1].peak, Some(300 * M), "a spike between samples");
    assert_eq!(f.stages[1].heap_peak, Some(280 * M));
    assert_eq!(f.peak_between("01_a", "02_b"), Some(300 * M));
}

fn with_categories(mut e: Event, cats: &[(&str, u64)]) -> Event {
    if let Event::Stage { snapshot } | Event::Sample { snapshot } = &mut e {
        snapshot.categories = cats.iter().map(|(k, v)| (k.to_string(), v * M)).collect();
    }
    e
}

#[test]
fn the_at_peak_composition_follows_samples_between_stages() {
    let mut f = RunFold::of(&[with_categories(stage("a", 0.0, 10, 10), &[("weights", 5)])]);
    assert_eq!(f.heap_peak_composition().unwrap()["weights"], 5 * M);
    // A sample inside the next stage's window is fuller: the view shows it
    // now, not when the stage closes.
    f.apply(&with_categories(
        sample(0.5, 200, 200),
        &[("weights", 5), ("logits", 90)],
    ));
    let now = f.heap_peak_composition().unwrap();
    assert_eq!(now.get("logits"), Some(&(90 * M)));
    // A later, emptier reading does not replace it.
    f.apply(&with_categories(sample(0.9, 20, 200), &[("weights", 5)]));
    assert_eq!(
        f.heap_peak_composition().unwrap().get("logits"),
        Some(&(90 * M))
    );
}

#[test]
fn device_peaks_between_stages_come_from_the_device_windows() {
    let dev = |label: &str, now: u64, window: Option<u64>| {
        let mut s = snap(label, 0.0, 10, 10);
        s.device_allocated = Some(now * M);
        s.window_device_peak = window.map(|w| w * M);
        Event::Stage { snapshot: s }
    };
    let f = RunFold::of(&[
        dev("a", 1, Some(1)),
        dev("b", 2, Some(40)),
        dev("c", 3, Some(7)),
    ]);
    assert_eq!(f.device_peak_between("a", "b"), Some(40 * M));
    assert_eq!(f.device_peak_between("b", "c"), Some(7 * M));
    assert_eq!(f.device_peak_between("a", "c"), Some(40 * M));
    // A CPU run's stages carry no device windows.
    let cpu = RunFold::of(&[stage("a", 0.0, 10, 10), stage("b", 1.0, 10, 10)]);
    assert_eq!(cpu.device_peak_between("a", "b"), None);
}

/// A watched process's readings carry no phase: its utilisation goes to
/// the run and to each stage window, and no phase is made up for it.
#[test]
fn utilisation_without_phases_falls_into_stage_windows() {
    let util = |e: Event, u: Option<f32>| match e {
        Event::Stage { mut snapshot } => {
            snapshot.gpu_util_percent = u;
            Event::Stage { snapshot }
        }
        Event::Sample { mut snapshot } => {
            snapshot.gpu_util_percent = u;
            Event::Sample { snapshot }
        }
        e => e,
    };
    let f = RunFold::of(&[
        util(stage("watch_start", 0.0, 10, 10), None),
        util(sample(1.0, 10, 10), Some(2.0)),
        util(stage("after_load", 2.0, 10, 10), Some(4.0)),
        util(sample(3.0, 10, 10), Some(96.0)),
        util(stage("after_forward", 4.0, 10, 10), Some(98.0)),
        util(stage("watch_end", 5.0, 10, 10), None),
    ]);
    let windows: Vec<Option<f64>> = f.stages.iter().map(|s| s.gpu_busy).collect();
    assert_eq!(windows, [None, Some(3.0), Some(97.0), None]);
    assert_eq!(f.gpu_busy.run.percent(), Some(50.0));
    assert_eq!(f.gpu_busy.run.samples, 4);
    assert!(f.gpu_busy.by_phase.is_empty());
    assert_eq!(f.gpu_busy.now, Some(98.0));
}
