//! The profiler with the counting allocator installed, as in the binary:
//! heap accounting, nested scope peaks, the log formats and what survives an
//! interrupt.

use std::sync::{Arc, Mutex};

use prunemem::events::{
    Emitter, Event, EventSink, Level, RunPlan, RunStatus, RunSummary, SinkError,
};
use prunemem::jobs::{Run, RunOptions};
use prunemem::memory::{self, MemorySnapshot};
use prunemem::profiler::{Profiler, ProfilerConfig};
use prunemem::sinks::{self, CSV_HEADER};

#[global_allocator]
static GLOBAL: memory::CountingAllocator = memory::CountingAllocator;

/// The allocator's counters are process-wide: tests that measure them take
/// this lock so parallel tests do not disturb each other.
static SERIAL: Mutex<()> = Mutex::new(());

const MIB: u64 = 1 << 20;

struct Recorder(Arc<Mutex<Vec<Event>>>);
impl EventSink for Recorder {
    fn on_event(&mut self, event: &Event) -> Result<(), SinkError> {
        self.0.lock().unwrap().push(event.clone());
        Ok(())
    }
    fn flush(&mut self) -> Result<(), SinkError> {
        Ok(())
    }
}

fn quiet_profiler(emitter: Arc<Emitter>) -> Profiler {
    Profiler::new(
        emitter,
        ProfilerConfig {
            sampler_hz: None,
            gpu_index: None,
            ..Default::default()
        },
    )
}

fn touch(v: &mut [u8]) {
    for i in (0..v.len()).step_by(4096) {
        v[i] = 1;
    }
}

#[test]
fn snapshot_fields_on_linux() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let profiler = quiet_profiler(Arc::new(Emitter::new()));
    let before = profiler.snapshot("before");
    assert!(before.rss.unwrap() > 0, "RSS is read");
    assert!(before.rss_peak.unwrap() >= before.rss.unwrap());
    assert!(before.system_total.unwrap() > before.rss.unwrap());
    let mut block = vec![0u8; (64 * MIB) as usize];
    touch(&mut block);
    let after = profiler.snapshot("after");
    let grew = after.heap_allocated.unwrap() as i64 - before.heap_allocated.unwrap() as i64;
    let error = (grew - (64 * MIB) as i64).abs() as f64 / (64 * MIB) as f64;
    assert!(error < 0.05, "heap grew by {grew} bytes for a 64 MiB block");
    assert!(after.heap_peak.unwrap() >= after.heap_allocated.unwrap());
    // On the CPU backend the device columns are the heap.
    assert_eq!(after.device_allocated, after.heap_allocated);
    assert!(
        after.device_reserved.is_some(),
        "malloc statistics on glibc"
    );
    assert!(after.rss.unwrap() >= before.rss.unwrap() + 60 * MIB);
    // Nothing crosses a bus on the CPU backend: no bus reading, not zeros.
    assert_eq!(after.bus, None);
    drop(block);
}

/// A device the profiler reads: a pool, not the heap.
struct FakePool;
impl memory::DeviceProbe for FakePool {
    fn name(&self) -> String {
        "fake:0".into()
    }
    fn read(&self) -> memory::DeviceReading {
        memory::DeviceReading {
            allocated: Some(1),
            reserved: Some(2),
            parts: None,
        }
    }
}

/// A device run's readings carry what crossed the bus since the run
/// started and the phase open: the live view's bus line.
#[test]
fn a_device_runs_readings_carry_its_bus_since_it_started() {
    use prunemem::exec::transfer;
    use prunemem::timing::{self, Phase};
    // The phase open is process-wide: no other run here while it is read.
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Bytes moved before the run are not the run's.
    transfer::uploaded(1 << 40);
    let profiler = Profiler::new(
        Arc::new(Emitter::new()),
        ProfilerConfig {
            sampler_hz: None,
            gpu_index: None,
            device: Box::new(FakePool),
        },
    );
    let start = profiler
        .snapshot("start")
        .bus
        .expect("a device run has a bus");
    assert!(start.host_to_device_bytes < 1 << 40, "{start:?}");
    let after = {
        let _phase = timing::phase(Phase::ProbeHead);
        transfer::uploaded(1000);
        transfer::read_back(24);
        profiler.snapshot("inside")
    };
    let bus = after.bus.clone().unwrap();
    // Other tests in this process may count too: at least this test's.
    assert!(bus.host_to_device_bytes >= start.host_to_device_bytes + 1000);
    assert!(bus.device_to_host_bytes >= start.device_to_host_bytes + 24);
    assert_eq!(bus.phase.as_deref(), Some("probe_head"));
    // It is in the log: a reading's JSON round-trips it.
    let json = serde_json::to_string(&after).unwrap();
    let back: MemorySnapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back.bus, Some(bus));
}

#[test]
fn nested_scope_peaks_do_not_clobber_each_other() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let emitter = Arc::new(Emitter::new());
    emitter.add(Box::new(Recorder(seen.clone())));
    let profiler = quiet_profiler(emitter);
    let base = memory::alloc::heap_allocated().unwrap();

    let outer = profiler.scope("outer");
    let spike = vec![1u8; (96 * MIB) as usize]; // outer-only spike
    drop(spike);
    {
        let _inner = profiler.scope("inner");
        let small = vec![1u8; (16 * MIB) as usize];
        drop(small);
    }
    let run_peak_during = profiler.run_peaks().0.unwrap();
    outer.end();

    let reports: Vec<_> = seen
        .lock()
        .unwrap()
        .iter()
        .filter_map(|e| match e {
            Event::ScopeEnd { report } => Some(report.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(reports.len(), 2);
    let (inner, outer) = (&reports[0], &reports[1]);
    assert_eq!((inner.label.as_str(), inner.depth), ("inner", 1));
    assert_eq!((outer.label.as_str(), outer.depth), ("outer", 0));
    let inner_rise = inner.peak_heap.unwrap() - base;
    let outer_rise = outer.peak_heap.unwrap() - base;
    assert!(
        (16 * MIB..40 * MIB).contains(&inner_rise),
        "inner peak sees its 16 MiB, not the outer spike: {inner_rise}"
    );
    assert!(
        outer_rise >= 96 * MIB,
        "outer keeps its 96 MiB spike: {outer_rise}"
    );
    assert!(
        run_peak_during - base >= 96 * MIB,
        "the run peak never drops"
    );
    assert!(outer.peak_rss.is_some() && inner.peak_rss.is_some());
}

#[test]
fn log_dir_formats_round_trip() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let options = RunOptions {
        log_dir: Some(dir.path().to_path_buf()),
        sinks: vec![Box::new(Recorder(seen.clone()))],
        profiler: ProfilerConfig {
            sampler_hz: Some(50.0),
            gpu_index: Some(0),
            ..Default::default()
        },
        handle_signals: false,
        budget: Some(1 << 30),
        ..Default::default()
    };
    let plan = RunPlan {
        command: "test".into(),
        method: Some("wanda".into()),
        ..Default::default()
    };
    let mut run = Run::start(plan, options).unwrap();
    run.profiler.stage("01_start");
    {
        let _s = run.profiler.scope("work");
        let v = vec![3u8; (8 * MIB) as usize];
        std::thread::sleep(std::time::Duration::from_millis(60));
        drop(v);
    }
    run.profiler.progress("pruning", 0, 2, "layer 0");
    run.profiler.message(Level::Warn, "seqlen capped");
    run.profiler.stage("09_end");
    run.result("perplexity", 12.5);
    let (summary, errors) = run.finish(RunStatus::Ok);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(summary.results["perplexity"], 12.5);

    // events.jsonl holds exactly what the sinks saw, losslessly.
    let text = std::fs::read_to_string(dir.path().join(sinks::JSONL_FILE)).unwrap();
    let parsed: Vec<Event> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("every line is one event"))
        .collect();
    assert_eq!(parsed, *seen.lock().unwrap());
    assert!(matches!(parsed.first(), Some(Event::RunStarted { .. })));
    let Some(Event::RunStarted { plan }) = parsed.first() else {
        unreachable!()
    };
    assert_eq!(
        plan.settings.get("memory_budget").and_then(|v| v.as_u64()),
        Some(1 << 30),
        "the budget is recorded in the plan"
    );
    assert!(matches!(parsed.last(), Some(Event::RunFinished { .. })));
    assert!(
        parsed.iter().any(|e| matches!(e, Event::Sample { .. })),
        "sampler ran"
    );
    // Without a driver, GPU readings are absent, not zero.
    if prunemem::memory::gpu::status().is_err() {
        for e in &parsed {
            if let Event::Stage { snapshot } = e {
                assert_eq!(snapshot.gpu_used, None);
                assert_eq!(snapshot.gpu_total, None);
            }
        }
    }

    // memory_log.csv: exact header, one row per stage.
    let csv = std::fs::read_to_string(dir.path().join(sinks::CSV_FILE)).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], CSV_HEADER);
    assert_eq!(
        lines[0],
        "Timestamp,Checkpoint,GPU_Allocated_GB,GPU_Reserved_GB,GPU_Peak_GB,CPU_Used_GB,CPU_Percent"
    );
    assert_eq!(lines.len(), 3);
    assert!(lines[1].contains(",01_start,"));
    assert!(lines[2].contains(",09_end,"));
    assert_eq!(lines[1].split(',').count(), 7);

    let summary_txt = std::fs::read_to_string(dir.path().join(sinks::SUMMARY_FILE)).unwrap();
    assert!(summary_txt.contains("MEMORY USAGE SUMMARY"));
    assert!(summary_txt.contains("09_end"));
}

/// An interrupt closes the log while another thread is still emitting: every
/// event accepted before the close is in the file, in order, whole, and the
/// interrupt's `RunFinished` is the last line.
#[test]
fn interrupt_loses_nothing_and_tears_nothing() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let emitter = Arc::new(Emitter::new());
    sinks::attach_log_dir(&emitter, dir.path()).unwrap();
    let producer = {
        let emitter = emitter.clone();
        std::thread::spawn(move || {
            let mut accepted = 0u64;
            for i in 0u64.. {
                let event = Event::Stage {
                    snapshot: MemorySnapshot {
                        label: format!("stage_{i:08}"),
                        rss: Some(i),
                        ..Default::default()
                    },
                };
                if !emitter.emit(event) {
                    break;
                }
                accepted += 1;
            }
            accepted
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(150));
    emitter.close_with(Event::RunFinished {
        summary: RunSummary {
            status: RunStatus::Interrupted,
            wall_s: 0.15,
            rss_peak: None,
            heap_peak: None,
            device_peak: None,
            results: Default::default(),
        },
    });
    let accepted = producer.join().unwrap();
    assert!(accepted > 100, "the producer ran ({accepted} events)");

    let text = std::fs::read_to_string(dir.path().join(sinks::JSONL_FILE)).unwrap();
    assert!(text.ends_with('\n'), "last line is complete");
    let events: Vec<Event> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("no torn line"))
        .collect();
    assert_eq!(events.len() as u64, accepted + 1);
    for (i, e) in events[..events.len() - 1].iter().enumerate() {
        match e {
            Event::Stage { snapshot } => assert_eq!(snapshot.label, format!("stage_{i:08}")),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(matches!(
        events.last(),
        Some(Event::RunFinished { summary }) if summary.status == RunStatus::Interrupted
    ));
    let csv = std::fs::read_to_string(dir.path().join(sinks::CSV_FILE)).unwrap();
    assert_eq!(
        csv.lines().count() as u64,
        accepted + 1,
        "header + one row per stage"
    );
}

/// A run started after a big allocation reports its own peak, not the
/// process's earlier high-water mark.
#[test]
fn a_run_reports_its_own_peak_not_the_processes_history() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    {
        let mut big = vec![0u8; (256 * MIB) as usize];
        touch(&mut big);
        drop(big);
    }
    let before = prunemem::memory::process::rss_peak_since_reset().unwrap();
    assert!(before >= 256 * MIB, "the kernel saw the earlier peak");
    let p = quiet_profiler(Arc::new(Emitter::new()));
    let s = p.stage("01_start");
    let heap_peak = s.heap_peak.unwrap();
    let rss_peak = s.rss_peak.unwrap();
    assert!(heap_peak < 64 * MIB, "heap peak {heap_peak}");
    assert!(
        rss_peak < before - 128 * MIB,
        "rss peak {rss_peak} vs {before}"
    );
    let (heap, rss, _) = p.run_peaks();
    assert!(heap.unwrap() < 64 * MIB && rss.unwrap() < before - 128 * MIB);
}

fn category(name: &str) -> u64 {
    let heap = prunemem::memory::alloc::heap_allocated().unwrap();
    prunemem::memory::tag::breakdown(heap)
        .into_iter()
        .find(|(n, _)| *n == name)
        .map_or(0, |(_, v)| v)
}

/// Categories are exact: bytes allocated under a tag, on this thread or on
/// a worker thread, are charged to it until freed; the categories always
/// sum to the counted heap.
#[test]
fn tags_charge_exactly_and_sum_to_the_heap() {
    use prunemem::memory::tag::{Category, tag};
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (w0, s0) = (category("weights"), category("statistics"));
    let weights = {
        let _t = tag(Category::Weights);
        vec![1u8; (10 * MIB) as usize]
    };
    assert_eq!(category("weights") - w0, 10 * MIB);
    let stats = {
        let _t = tag(Category::Statistics);
        // Work handed to another thread inherits the tag.
        std::thread::scope(|s| s.spawn(|| vec![2u8; (3 * MIB) as usize]).join().unwrap())
    };
    assert_eq!(category("statistics") - s0, 3 * MIB);
    let mut grown = weights;
    grown.reserve_exact((5 * MIB) as usize); // a realloc stays with its owner
    assert_eq!(category("weights") - w0, grown.capacity() as u64);
    let heap = prunemem::memory::alloc::heap_allocated().unwrap();
    let sum: u64 = prunemem::memory::tag::breakdown(heap)
        .iter()
        .map(|(_, v)| v)
        .sum();
    assert_eq!(sum, heap, "the categories sum to the counted heap");
    drop((grown, stats));
    assert_eq!(category("weights"), w0);
    assert_eq!(category("statistics"), s0);
}
