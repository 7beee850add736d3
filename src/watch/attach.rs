//! `prunemem watch --pid PID`: attaches to a process that is already running
//! (a training script started an hour ago) and samples its whole process
//! tree's RSS and, with NVML, the GPU memory of those processes, until it
//! exits. Its stdout is not ours to read, so stage markers
//! (`PRUNEMEM_STAGE name`, `Memory Checkpoint: NAME`) come from a log file
//! it writes, followed from its end (`--follow FILE`). Quitting the view
//! detaches; the process is never signalled.

use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::WatchError;
use super::command::{
    Emit, Probe, WatchOptions, finish, flush_pending, lock, on_line, send, watch_plan,
};
use crate::events::{Event, RunStatus, stages};
use crate::memory::process::TreeProbe;
use crate::memory::unix_ms_now;

/// Whether `pid` is a live process (a zombie has ended).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Tails `path` from its current end, turning marker lines into stages and
/// alarming lines into messages, until `done`.
fn follow_thread(
    path: PathBuf,
    probe: Arc<Mutex<Probe>>,
    emit: Emit,
    done: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = loop {
            if done.load(Ordering::SeqCst) {
                return;
            }
            if let Ok(mut f) = std::fs::File::open(&path) {
                let _ = f.seek(SeekFrom::End(0));
                break BufReader::new(f);
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut pending = String::new();
        loop {
            match reader.read_line(&mut pending) {
                Ok(0) | Err(_) => {
                    if done.load(Ordering::SeqCst) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                Ok(_) if !pending.ends_with('\n') => continue,
                Ok(_) => {}
            }
            let line = std::mem::take(&mut pending);
            on_line(line.trim_end_matches('\n'), &probe, &emit);
        }
    })
}

/// Watches process `pid` until it exits or a signal number is stored in
/// `detach` (then it stops watching and leaves the process alone); returns 0.
pub fn attach(
    pid: u32,
    follow: Option<&Path>,
    options: &WatchOptions,
    emit: Emit,
    detach: Arc<AtomicI32>,
) -> Result<i32, WatchError> {
    if !alive(pid) {
        return Err(WatchError::Invalid(format!(
            "no running process with pid {pid}"
        )));
    }
    if !(options.hz > 0.0 && options.hz <= 1000.0) {
        return Err(WatchError::Invalid(format!(
            "the sample rate must be between 0 and 1000 Hz, got {}",
            options.hz
        )));
    }
    let started_unix_ms = unix_ms_now();
    let probe = Arc::new(Mutex::new(Probe {
        tree: TreeProbe::new(pid),
        start: Instant::now(),
        peak: None,
        gpu_peak: None,
        pending: None,
        busy: Default::default(),
    }));
    let mut argv = vec![
        "prunemem".to_string(),
        "watch".into(),
        "--pid".into(),
        pid.to_string(),
    ];
    if let Some(f) = follow {
        argv.extend(["--follow".to_string(), f.display().to_string()]);
    }
    let plan = watch_plan(format!("process {pid}"), argv, options.hz, started_unix_ms);
    send(&emit, Event::RunStarted { plan });
    let first = lock(&probe).snapshot(stages::WATCH_START);
    send(&emit, Event::Stage { snapshot: first });
    let done = Arc::new(AtomicBool::new(false));
    let follower =
        follow.map(|p| follow_thread(p.to_path_buf(), probe.clone(), emit.clone(), done.clone()));
    let period = crate::timing::duration(1.0 / options.hz);
    let detached = loop {
        if !alive(pid) {
            break false;
        }
        if detach.swap(0, Ordering::SeqCst) != 0 {
            break true;
        }
        flush_pending(&probe, &emit, false);
        let snapshot = lock(&probe).snapshot(stages::SAMPLE);
        send(&emit, Event::Sample { snapshot });
        std::thread::sleep(period);
    };
    done.store(true, Ordering::SeqCst);
    if let Some(f) = follower {
        let _ = f.join();
    }
    let status = if detached {
        RunStatus::Interrupted
    } else {
        RunStatus::Ok
    };
    finish(&probe, &emit, status, Default::default());
    Ok(0)
}
