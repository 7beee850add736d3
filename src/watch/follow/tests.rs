use std::io::Write;
use std::sync::atomic::AtomicBool;

use super::*;
use crate::events::{RunPlan, RunStatus, RunSummary};
use crate::memory::MemorySnapshot;

fn stage(label: &str, t: f64) -> Event {
    Event::Stage {
        snapshot: MemorySnapshot {
            label: label.into(),
            elapsed_s: t,
            rss: Some(1 << 20),
            ..Default::default()
        },
    }
}

fn finished() -> Event {
    Event::RunFinished {
        summary: RunSummary {
            status: RunStatus::Ok,
            wall_s: 1.0,
            rss_peak: None,
            heap_peak: None,
            device_peak: None,
            results: Default::default(),
        },
    }
}

fn line(e: &Event) -> String {
    serde_json::to_string(e).unwrap() + "\n"
}

#[test]
fn read_all_skips_a_torn_last_line_and_names_bad_ones() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(JSONL_FILE);
    std::fs::write(
        &p,
        line(&stage("a", 0.0)) + &line(&stage("b", 1.0)) + "{\"event\":\"sta",
    )
    .unwrap();
    assert_eq!(read_all(dir.path()).unwrap().len(), 2);
    std::fs::write(&p, "garbage\n".to_string() + &line(&stage("b", 1.0))).unwrap();
    let err = read_all(dir.path()).unwrap_err().to_string();
    assert!(err.contains("line 1"), "{err}");
    std::fs::write(&p, "").unwrap();
    assert!(
        read_all(dir.path())
            .unwrap_err()
            .to_string()
            .contains("no events")
    );
    assert!(read_all(&dir.path().join("missing")).is_err());
}

#[test]
fn follow_sees_lines_as_they_are_written_and_stops_at_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(JSONL_FILE);
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        let mut f = std::fs::File::create(&p).unwrap();
        f.write_all(
            line(&Event::RunStarted {
                plan: RunPlan::default(),
            })
            .as_bytes(),
        )
        .unwrap();
        f.flush().unwrap();
        std::thread::sleep(Duration::from_millis(150));
        // A line written in two pieces arrives whole.
        let l = line(&stage("01_start", 0.1));
        f.write_all(&l.as_bytes()[..10]).unwrap();
        f.flush().unwrap();
        std::thread::sleep(Duration::from_millis(250));
        f.write_all(&l.as_bytes()[10..]).unwrap();
        f.write_all(line(&finished()).as_bytes()).unwrap();
        f.write_all(line(&stage("after_end", 2.0)).as_bytes())
            .unwrap();
    });
    let mut seen = Vec::new();
    let stop = AtomicBool::new(false);
    follow(
        dir.path(),
        &mut |e| seen.push(e),
        &stop,
        Some(Duration::from_secs(10)),
    )
    .unwrap();
    writer.join().unwrap();
    assert!(
        matches!(seen[0], Event::Message { .. }),
        "announces the wait"
    );
    assert!(matches!(seen[1], Event::RunStarted { .. }));
    assert!(matches!(&seen[2], Event::Stage { snapshot } if snapshot.label == "01_start"));
    assert!(matches!(seen[3], Event::RunFinished { .. }));
    assert_eq!(seen.len(), 4, "stops at the run's end");
}

#[test]
fn replay_jumps_to_a_stage_and_keeps_pace() {
    let events = vec![
        stage("01_start", 0.0),
        stage("02_mid", 5.0),
        stage("03_end", 5.4),
        finished(),
    ];
    let stop = AtomicBool::new(false);
    let mut seen = Vec::new();
    let t = Instant::now();
    replay(&events, 1.0, Some("02_mid"), &mut |e| seen.push(e), &stop).unwrap();
    let took = t.elapsed().as_secs_f64();
    assert_eq!(seen.len(), 4);
    assert!((0.35..2.0).contains(&took), "{took}");
    let t = Instant::now();
    replay(&events, 100.0, None, &mut |_| {}, &stop).unwrap();
    assert!(t.elapsed().as_secs_f64() < 1.0);
    assert!(replay(&events, 0.0, None, &mut |_| {}, &stop).is_err());
    let err = replay(&events, 1.0, Some("nope"), &mut |_| {}, &stop)
        .unwrap_err()
        .to_string();
    assert!(err.contains("02_mid"), "{err}");
}
