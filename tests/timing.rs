//! `timing`'s spans in a process of their own (the totals are process-wide).

use std::time::{Duration, Instant};

use prunemem::timing::{self, Phase, Totals, Work};

fn busy(ms: u64) {
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(ms) {
        std::hint::spin_loop();
    }
}

#[test]
fn nested_work_is_counted_once_and_phases_on_their_own() {
    let start = Totals::now();
    {
        let _p = timing::phase(Phase::Prune);
        let _outer = timing::work(Work::Elementwise);
        busy(30);
        timing::timed(Work::Gemm, || busy(60));
        busy(30);
    }
    let (work, phase) = Totals::now().since(&start);
    let get = |v: &[(&str, f64)], n: &str| v.iter().find(|(k, _)| *k == n).map_or(0.0, |(_, s)| *s);
    let (gemm, outer) = (get(&work, "gemm"), get(&work, "norms_rope_activations"));
    assert!((0.060..0.080).contains(&gemm), "{work:?}");
    assert!(
        (0.060..0.080).contains(&outer),
        "the inner 60 ms is not in the outer span: {work:?}"
    );
    assert!((0.120..0.150).contains(&get(&phase, "prune")), "{phase:?}");
    assert_eq!(work.len(), 2, "kinds never used are left out: {work:?}");
}
