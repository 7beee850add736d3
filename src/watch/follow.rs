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

/// How long `follow` waits for a log to appear when no run holds the
/// folder's lock, and how long a log may stay still before its writer's
/// lock is checked.
const WAIT_START: Duration = Duration::from_secs(20);
const STILL: Duration = Duration::from_secs(2);

/// Tails `DIR/events.jsonl`, passing each event to `emit`, until the run's
/// last event, until `stop` is set, or (when the file stops growing and
/// `idle_exit` is given) after that long without news. Waits for the file
/// to appear while a run holds the folder's lock, else for [`WAIT_START`].
/// A log that stops growing while no process holds its lock was left by a
/// run that died without its final event: an error after its last line,
/// never a wait forever.
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
                if !crate::model::lock::held(dir) && last_news.elapsed() > WAIT_START {
                    return Err(WatchError::Invalid(format!(
                        "no run wrote {} in {} s",
                        crate::input::shown(tail.path()),
                        WAIT_START.as_secs()
                    )));
                }
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
            if last_news.elapsed() > STILL && !crate::model::lock::held(dir) {
                return Err(WatchError::Invalid(format!(
                    "{}: the run that wrote it is not running and left no final event (killed?); followed to its last line",
                    crate::input::shown(tail.path())
                )));
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
    // Below a thousandth of real time a replay of a minute's run takes
    // most of a day: a typo, not a request.
    if !(1e-3..=1e9).contains(&speed) {
        return Err(WatchError::Invalid(format!(
            "--speed must be between 0.001 and 1e9, got {speed}"
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
            let due = crate::timing::duration((t - start_at) / speed);
            while clock.elapsed() < due {
                if stop.load(Ordering::SeqCst) {
                    return Ok(());
                }
                std::thread::sleep(
                    due.saturating_sub(clock.elapsed())
                        .min(Duration::from_millis(50)),
                );
            }
        }
        emit(e.clone());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
