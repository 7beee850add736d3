use super::*;
use crate::events::{Event, stages};
use crate::memory::MemorySnapshot;

const M: u64 = 1 << 20;

fn at(label: &str, t: f64, rss: u64) -> Event {
    let snapshot = MemorySnapshot {
        label: label.into(),
        elapsed_s: t,
        rss: Some(rss * M),
        rss_peak: Some(rss * M),
        ..Default::default()
    };
    if label == stages::SAMPLE {
        Event::Sample { snapshot }
    } else {
        Event::Stage { snapshot }
    }
}

/// Load 100 MiB, prune 200 MiB, eval 150 MiB.
fn estimate() -> Estimate {
    let arch = crate::estimate::presets::all().remove(0);
    Estimate {
        arch: arch.clone(),
        workload: crate::estimate::Workload::new(crate::estimate::Task::Wanda),
        phases: vec![
            Phase::new("load", &[stages::START, stages::MODEL_LOADED]).add("weights", 100 * M),
            Phase::new("prune", &[stages::BEFORE_PRUNING, stages::AFTER_PRUNING])
                .add("activations", 200 * M),
            Phase::new("eval", &[stages::BEFORE_EVAL, stages::AFTER_EVAL]).add("logits", 150 * M),
        ],
        saved_weights: None,
        notes: Vec::new(),
        device_pool: None,
    }
}

fn fold(events: &[Event]) -> RunFold {
    RunFold::of(events)
}

fn user(mib: u64) -> Option<Budget> {
    budget(Some(mib * M), Some(1 << 40), None)
}

#[test]
fn before_any_measurement_the_forecast_is_the_estimate() {
    let f = forecast(&estimate(), &fold(&[]), user(250));
    assert_eq!(f.peak, 200 * M);
    assert_eq!(f.peak_phase, "prune");
    assert_eq!(f.verdict(), Some("fits"));
    let f = forecast(&estimate(), &fold(&[]), user(180));
    assert_eq!(f.exceeds_at, Some(("prune".into(), 200 * M)));
    assert_eq!(f.verdict(), Some("will exceed"));
    assert_eq!(forecast(&estimate(), &fold(&[]), None).verdict(), None);
}

#[test]
fn finished_phases_scale_the_ones_ahead() {
    // Load measured at 120 MiB (1.2× its prediction): prune forecast 240.
    let events = [
        at(stages::START, 0.0, 50),
        at(stages::SAMPLE, 0.5, 120),
        at(stages::MODEL_LOADED, 1.0, 110),
    ];
    let f = forecast(&estimate(), &fold(&events), user(230));
    assert_eq!(f.phases_done, 1);
    assert_eq!(f.peak, 240 * M);
    assert_eq!(f.verdict(), Some("will exceed"), "{f:?}");
    assert_eq!(f.exceeds_at.as_ref().unwrap().0, "prune");
}

#[test]
fn a_phase_under_way_counts_what_it_reached() {
    let events = [
        at(stages::START, 0.0, 50),
        at(stages::MODEL_LOADED, 1.0, 100),
        at(stages::BEFORE_PRUNING, 2.0, 100),
        at(stages::SAMPLE, 2.5, 300),
    ];
    let f = forecast(&estimate(), &fold(&events), user(250));
    assert_eq!(f.peak, 300 * M);
    assert_eq!(f.verdict(), Some("exceeded"));
}

#[test]
fn budget_prefers_the_user_then_the_gpu_then_the_host() {
    assert_eq!(
        budget(Some(1), Some(2), Some(3)).unwrap().source,
        "--budget"
    );
    assert_eq!(budget(None, Some(2), Some(3)).unwrap().bytes, 2);
    assert_eq!(budget(None, None, Some(3)).unwrap().source, "host memory");
    assert!(budget(None, None, None).is_none());
}

/// A device run's phases are measured on the device pool (readings inside
/// passes included) and held to the device's budget, never the host's.
#[test]
fn a_device_run_is_forecast_on_the_device_pool() {
    let plan = crate::events::RunPlan {
        command: "prune".into(),
        device: "wgpu".into(),
        ..Default::default()
    };
    let on_device = |label: &str, t: f64, rss: u64, pool: u64, window: Option<u64>| {
        let Event::Stage { mut snapshot } = at(label, t, rss) else {
            unreachable!()
        };
        snapshot.device_allocated = Some(pool * M);
        snapshot.window_device_peak = window.map(|w| w * M);
        Event::Stage { snapshot }
    };
    let events = [
        Event::RunStarted { plan },
        on_device(stages::START, 0.0, 500, 0, Some(0)),
        on_device(stages::MODEL_LOADED, 1.0, 900, 0, Some(0)),
        on_device(stages::BEFORE_PRUNING, 2.0, 900, 20, Some(20)),
        // A layer's window peaked at 260 MiB of pool; RSS says 900.
        on_device("layer_00_stats", 3.0, 900, 30, Some(260)),
    ];
    let run = fold(&events);
    assert!(run.on_device());
    let budget = device_budget(None, Some(250 * M), Some(1 << 40));
    assert_eq!(budget.as_ref().unwrap().source, "device memory");
    let f = forecast(&estimate(), &run, budget);
    assert_eq!(f.peak, 260 * M, "the pool's peak, not the host's RSS");
    assert_eq!(f.verdict(), Some("exceeded"));
    assert!(
        device_budget(None, None, None).is_none(),
        "no device size, no verdict"
    );
}
