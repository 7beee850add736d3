//! `timing`'s spans in a process of their own (the totals are process-wide).
//!
//! The spans are checked against the same clock read around them here, not
//! against fixed windows: on a loaded machine a 60 ms busy-wait can take
//! 90 ms, and the span must say 90.

use std::time::{Duration, Instant};

use prunemem::timing::{self, Phase, Totals, Work};

fn busy(ms: u64) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(ms) {
        std::hint::spin_loop();
    }
}

/// What a span may lose to the instructions between it and the clock
/// readings around it (a preemption there included).
const SLACK: f64 = 0.005;

fn secs(a: Instant, b: Instant) -> f64 {
    (b - a).as_secs_f64()
}

/// `name`'s seconds from `totals`, 0 if it never ran.
fn get(totals: &[(&str, f64)], name: &str) -> f64 {
    totals
        .iter()
        .find(|(k, _)| *k == name)
        .map_or(0.0, |(_, s)| *s)
}

/// A span opened at `t[1]` and closed at `t[2]` inside one over `t[0]..t[3]`:
/// the inner span counted `inner` seconds, the time between the clock
/// readings, and the outer `outer`, the two stretches around it only.
fn assert_nested(inner: f64, outer: f64, t: [Instant; 4], what: &str) {
    let between = secs(t[1], t[2]);
    assert!(
        inner <= between && inner >= between - SLACK,
        "{what}: inner {inner} vs {between}"
    );
    let around = secs(t[0], t[1]) + secs(t[2], t[3]);
    assert!(
        outer >= around && outer <= around + 2.0 * SLACK,
        "{what}: the inner span is not in the outer: outer {outer}, around it {around}"
    );
}

/// Busy 30 ms, `inner` (60 ms of busy inside), 30 ms: the four clock
/// readings around them.
fn around(inner: impl FnOnce()) -> [Instant; 4] {
    let t0 = Instant::now();
    busy(30);
    let t1 = Instant::now();
    inner();
    let t2 = Instant::now();
    busy(30);
    [t0, t1, t2, Instant::now()]
}

#[test]
fn nested_work_is_counted_once_and_phases_on_their_own() {
    let start = Totals::now();
    let t = {
        let _p = timing::phase(Phase::Prune);
        let _outer = timing::work(Work::Elementwise);
        around(|| timing::timed(Work::Gemm, || busy(60)))
    };
    let (work, phase) = Totals::now().since(&start);
    assert!(secs(t[1], t[2]) >= 0.060);
    let (gemm, outer) = (get(&work, "gemm"), get(&work, "norms_rope_activations"));
    assert_nested(gemm, outer, t, &format!("{work:?}"));
    // The phase is the whole block, work spans or not.
    let whole = secs(t[0], t[3]);
    let prune = get(&phase, "prune");
    assert!(
        prune >= whole && prune <= whole + 2.0 * SLACK,
        "phase {prune} vs {whole}: {phase:?}"
    );
    assert_eq!(work.len(), 2, "kinds never used are left out: {work:?}");
}

/// A phase opened inside another pauses it, as work spans do: a layer's
/// load inside a GradProbe pass is `load_layer`'s seconds, not the pass's
/// (the phase bytes and launches are charged to, `current_phase`, is
/// process-wide and checked in `exec::transfer`'s unit test).
#[test]
fn a_nested_phase_pauses_the_one_around_it() {
    let start = Totals::now();
    let t = {
        let _pass = timing::phase(Phase::ProbeBackward);
        around(|| {
            let _load = timing::phase(Phase::Load);
            busy(60);
        })
    };
    let (_, phase) = Totals::now().since(&start);
    let (load, pass) = (get(&phase, "load_layer"), get(&phase, "probe_backward"));
    assert_nested(load, pass, t, &format!("{phase:?}"));
    // Together they are the block's wall time, not more.
    let whole = secs(t[0], t[3]);
    assert!(
        load + pass <= whole + 2.0 * SLACK,
        "{load} + {pass} > {whole}"
    );
}

/// `names` as `timing::in_run_order` sorts them.
fn in_run_order<'a>(names: &[&'a str]) -> Vec<&'a str> {
    timing::in_run_order(names.iter().map(|n| (*n, ())))
        .into_iter()
        .map(|(n, _)| n)
        .collect()
}

/// Logs keep phases by name; readers show them as a run goes through them.
#[test]
fn phases_sort_in_the_order_a_run_goes_through_them() {
    let gradprobe = [
        "eval",
        "load_layer",
        "other",
        "probe_backward",
        "probe_forward",
        "probe_head",
        "prune",
    ];
    assert_eq!(
        in_run_order(&gradprobe),
        [
            "load_layer",
            "probe_forward",
            "probe_head",
            "probe_backward",
            "prune",
            "eval",
            "other"
        ]
    );
    let wanda = [
        "write",
        "stats_pass",
        "eval",
        "output_pass",
        "prune",
        "load_layer",
    ];
    assert_eq!(
        in_run_order(&wanda),
        [
            "load_layer",
            "stats_pass",
            "prune",
            "output_pass",
            "write",
            "eval"
        ]
    );
}
