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

#[test]
fn nested_work_is_counted_once_and_phases_on_their_own() {
    let start = Totals::now();
    let (t0, t1, t2, t3);
    {
        let _p = timing::phase(Phase::Prune);
        let _outer = timing::work(Work::Elementwise);
        t0 = Instant::now();
        busy(30);
        t1 = Instant::now();
        timing::timed(Work::Gemm, || busy(60));
        t2 = Instant::now();
        busy(30);
        t3 = Instant::now();
    }
    let (work, phase) = Totals::now().since(&start);
    let get = |v: &[(&str, f64)], n: &str| v.iter().find(|(k, _)| *k == n).map_or(0.0, |(_, s)| *s);
    let (gemm, outer) = (get(&work, "gemm"), get(&work, "norms_rope_activations"));
    let secs = |a: Instant, b: Instant| (b - a).as_secs_f64();
    // The inner span is the 60 ms call as this test's clock saw it.
    let inner = secs(t1, t2);
    assert!(inner >= 0.060, "{inner}");
    assert!(
        gemm <= inner && gemm >= inner - SLACK,
        "gemm {gemm} vs {inner}: {work:?}"
    );
    // The outer span holds the two 30 ms waits and not the inner call.
    let around = secs(t0, t1) + secs(t2, t3);
    assert!(
        outer >= around && outer <= around + 2.0 * SLACK,
        "the inner call is not in the outer span: outer {outer}, around it {around}: {work:?}"
    );
    // The phase is the whole block, work spans or not.
    let whole = secs(t0, t3);
    let prune = get(&phase, "prune");
    assert!(
        prune >= whole && prune <= whole + 2.0 * SLACK,
        "phase {prune} vs {whole}: {phase:?}"
    );
    assert_eq!(work.len(), 2, "kinds never used are left out: {work:?}");
}

/// A phase opened inside another pauses it, as work spans do: a layer's
/// load inside a GradProbe pass is `load_layer`'s seconds, not the pass's,
/// (the phase bytes and launches are charged to, `current_phase`, is
/// process-wide and checked in `exec::transfer`'s unit test).
#[test]
fn a_nested_phase_pauses_the_one_around_it() {
    let start = Totals::now();
    let (t0, t1, t2, t3);
    {
        let _pass = timing::phase(Phase::ProbeBackward);
        t0 = Instant::now();
        busy(30);
        t1 = Instant::now();
        {
            let _load = timing::phase(Phase::Load);
            busy(50);
        }
        t2 = Instant::now();
        busy(30);
        t3 = Instant::now();
    }
    let (_, phase) = Totals::now().since(&start);
    let get = |n: &str| phase.iter().find(|(k, _)| *k == n).map_or(0.0, |(_, s)| *s);
    let secs = |a: Instant, b: Instant| (b - a).as_secs_f64();
    let (load, pass) = (get("load_layer"), get("probe_backward"));
    let inner = secs(t1, t2);
    assert!(
        load <= inner && load >= inner - SLACK,
        "load {load} vs {inner}: {phase:?}"
    );
    let around = secs(t0, t1) + secs(t2, t3);
    assert!(
        pass >= around && pass <= around + 2.0 * SLACK,
        "the load is not in the pass: pass {pass}, around it {around}: {phase:?}"
    );
    // Together they are the block's wall time, not more.
    let whole = secs(t0, t3);
    assert!(
        load + pass <= whole + 2.0 * SLACK,
        "{load} + {pass} > {whole}"
    );
}
