//! Reading a run's `events.jsonl` from another process: [`follow`] tails it
//! while the run writes (whole lines only; a torn last line waits for its
//! end), [`replay`] plays a finished log back at a chosen speed, optionally
//! jumping straight to a stage.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::WatchError;
use crate::events::logdir::{self, JSONL_FILE, LogError, Tail};
use crate::events::{Event, Level};

/// How often a followed log is polled for new lines.
const POLL: Duration = Duration::from_millis(100);

/// A log that cannot be read: its I/O error as it came, anything else in
/// one line naming the file.
fn watch_error(e: LogError) -> WatchError {
    match e {
        LogError::Io { path, source } => WatchError::Io { path, source },
        other => WatchError::Invalid(other.to_string()),
    }
}

/// Every event of a finished log; a torn last line is skipped, a bad line
/// elsewhere is an error naming it.
pub fn read_all(dir: &Path) -> Result<Vec<Event>, WatchError> {
    let path = dir.join(JSONL_FILE);
    let events = match logdir::read_events(dir) {
        Ok(log) => log.events,
        Err(LogError::Empty(_)) => Vec::new(),
        Err(e) => return Err(WatchError::Invalid(e.to_string())),
    };
    if events.is_empty() {
        return Err(WatchError::Invalid(format!(
            "{}: no events",
            path.display()
        )));
    }
    Ok(events)
}

/// Tails `DIR/events.jsonl`, passing each event to `emit`, until the run's
/// last event, until `stop` is set, or (when the file stops growing and
/// `idle_exit` is given) after that long without news. Waits for the file
/// to appear.
pub fn follow(
    dir: &Path,
    emit: &mut dyn FnMut(Event),
    stop: &AtomicBool,
    idle_exit: Option<Duration>,
) -> Result<(), WatchError> {
    let mut tail = Tail::new(dir.join(JSONL_FILE));
    let mut announced = false;
    let mut last_news = Instant::now();
    loop {
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        let events = match tail.poll().map_err(watch_error)? {
            Some(events) => events,
            None => {
                if !announced {
                    emit(Event::Message {
                        level: Level::Info,
                        text: format!("waiting for {}", tail.path().display()),
                        elapsed_s: 0.0,
                    });
                    announced = true;
                }
                std::thread::sleep(POLL);
                continue;
            }
        };
        if events.is_empty() {
            if idle_exit.is_some_and(|d| last_news.elapsed() > d) {
                return Ok(());
            }
            std::thread::sleep(POLL);
            continue;
        }
        last_news = Instant::now();
        for event in events {
            let done = matches!(event, Event::RunFinished { .. });
            emit(event);
            if done {
                return Ok(());
            }
        }
    }
}

fn event_time(e: &Event) -> Option<f64> {
    match e {
        Event::Stage { snapshot } | Event::Sample { snapshot } => Some(snapshot.elapsed_s),
        Event::Progress { elapsed_s, .. }
        | Event::Message { elapsed_s, .. }
        | Event::Components { elapsed_s, .. }
        | Event::ScopeBegin { elapsed_s, .. } => Some(*elapsed_s),
        Event::ScopeEnd { report } => Some(report.elapsed_s),
        Event::Rank { .. } => None,
        Event::RunStarted { .. } | Event::RunFinished { .. } => None,
    }
}

/// Plays `events` back through `emit` at `speed` times real time; events
/// before the stage `from` (when given) are passed at once. Returns early
/// when `stop` is set.
pub fn replay(
    events: &[Event],
    speed: f64,
    from: Option<&str>,
    emit: &mut dyn FnMut(Event),
    stop: &AtomicBool,
) -> Result<(), WatchError> {
    if !(speed > 0.0 && speed.is_finite()) {
        return Err(WatchError::Invalid(format!(
            "--speed must be positive, got {speed}"
        )));
    }
    let start_at = match from {
        Some(label) => events
            .iter()
            .find_map(|e| match e {
                Event::Stage { snapshot } if snapshot.label == label => Some(snapshot.elapsed_s),
                _ => None,
            })
            .ok_or_else(|| {
                let stages: Vec<String> = events
                    .iter()
                    .filter_map(|e| match e {
                        Event::Stage { snapshot } => Some(snapshot.label.clone()),
                        _ => None,
                    })
                    .take(12)
                    .collect();
                WatchError::Invalid(format!(
                    "no stage '{label}' in the log (stages: {})",
                    stages.join(", ")
                ))
            })?,
        None => 0.0,
    };
    let clock = Instant::now();
    for e in events {
        if stop.load(Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(t) = event_time(e).filter(|t| *t > start_at) {
            let due = Duration::from_secs_f64((t - start_at) / speed);
            while clock.elapsed() < due {
                if stop.load(Ordering::SeqCst) {
                    return Ok(());
                }
                std::thread::sleep((due - clock.elapsed()).min(Duration::from_millis(50)));
            }
        }
        emit(e.clone());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
