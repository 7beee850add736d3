//! The one contract between engines and everything that watches them.
//!
//! Engines (pruning, evaluation, the profiler's sampler) emit [`Event`]s to an
//! [`Emitter`]; sinks (CSV, JSONL, console summary, progress lines, the live
//! UI, report collectors) implement [`EventSink`]. No engine knows which
//! sinks listen, and no sink calls into an engine — the same shape as
//! ripgrep's `Sink`.

pub mod fold;
pub mod logdir;
pub mod plan;
pub mod ranks;
pub mod stages;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::memory::MemorySnapshot;
pub use plan::{HostInfo, ModelInfo, RunPlan, RunStatus, RunSummary};

/// Severity of a [`Event::Message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Info,
    Warn,
    Error,
}

/// Peaks reached inside one profiler scope, and where it ended.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScopeReport {
    pub label: String,
    /// Nesting depth: 0 for a top-level scope.
    pub depth: usize,
    pub elapsed_s: f64,
    pub duration_s: f64,
    pub peak_heap: Option<u64>,
    pub peak_rss: Option<u64>,
    pub peak_device: Option<u64>,
    pub start_heap: Option<u64>,
    pub end_heap: Option<u64>,
    pub start_rss: Option<u64>,
    pub end_rss: Option<u64>,
}

/// Everything a run reports. Serialised one per line into `events.jsonl`
/// with an `"event"` tag; bytes are integers, so the log is lossless.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// First event of a run: the resolved plan (command, model, method,
    /// settings, device).
    RunStarted { plan: RunPlan },
    /// A named stage snapshot (`01_start`, `layer_07_pruned`...), taken by
    /// `Profiler::stage`.
    Stage { snapshot: MemorySnapshot },
    /// A periodic reading from the background sampler; catches peaks
    /// between stages. Sinks may merge or drop samples, never stages.
    Sample { snapshot: MemorySnapshot },
    /// A profiler scope began.
    ScopeBegin {
        label: String,
        depth: usize,
        elapsed_s: f64,
    },
    /// A profiler scope ended, with the peaks reached inside it.
    ScopeEnd { report: ScopeReport },
    /// Progress through a sequence of units of work (decoder layers).
    /// `index` counts from 0; `index + 1 == total` is the last one.
    Progress {
        index: usize,
        total: usize,
        name: String,
        /// The pass the sequence belongs to (`pruning`, `evaluation`, …),
        /// which the ETA names; empty in logs written before it existed.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        pass: String,
        elapsed_s: f64,
    },
    /// The engine's own accounting of what it holds at a stage: bytes per
    /// component (weights, calibration buffers, statistics, masks...).
    Components {
        stage: String,
        elapsed_s: f64,
        bytes: BTreeMap<String, u64>,
    },
    /// A line for the user: a warning such as a capped seqlen, or progress
    /// information.
    Message {
        level: Level,
        text: String,
        elapsed_s: f64,
    },
    /// Another rank of a distributed run, as its own log last read
    /// (rank 0 folds the ranks' logs into its stream, `jobs::ranks`).
    Rank { rank: usize, reading: RankReading },
    /// Last event of a run.
    RunFinished { summary: RunSummary },
}

/// The latest of one rank's readings, from its own log.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RankReading {
    /// Seconds since the rank started.
    pub elapsed_s: f64,
    pub rss: Option<u64>,
    pub rss_peak: Option<u64>,
    pub device_allocated: Option<u64>,
    pub device_peak: Option<u64>,
    /// Its latest stage, and its progress through the layers.
    pub stage: Option<String>,
    pub done: Option<usize>,
    pub total: Option<usize>,
    /// Its status once it finished (`ok`, `failed`, …).
    pub finished: Option<String>,
}

impl Event {
    /// Samples are the only events a sink may drop under load.
    pub fn is_droppable(&self) -> bool {
        matches!(self, Event::Sample { .. })
    }
}

/// The events of a log's text (`events.jsonl`), as every reader of logs
/// needs them: blank lines are ignored, a torn last line (a run killed
/// mid-write) is skipped and reported, a bad line elsewhere is an error
/// `line N: why` (N counts the file's lines).
#[derive(Debug, Default)]
pub struct ParsedLog {
    pub events: Vec<Event>,
    pub torn_last_line: bool,
}

/// Parses a log's text; see [`ParsedLog`].
pub fn parse_log(text: &str) -> Result<ParsedLog, String> {
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .collect();
    let mut log = ParsedLog {
        events: Vec::with_capacity(lines.len()),
        torn_last_line: false,
    };
    for (k, (n, line)) in lines.iter().enumerate() {
        match serde_json::from_str::<Event>(line) {
            Ok(e) => log.events.push(e),
            Err(_) if k + 1 == lines.len() => log.torn_last_line = true,
            Err(e) => return Err(format!("line {}: {e}", n + 1)),
        }
    }
    Ok(log)
}

/// A sink that could not take an event.
#[derive(Debug, Error)]
pub enum SinkError {
    #[error("cannot write {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the {0} writer thread has stopped")]
    Disconnected(&'static str),
}

/// Receives events. Implementations must not block the engine for long:
/// file sinks hand lines to a writer thread, the UI drops samples under load.
pub trait EventSink: Send {
    /// Takes one event.
    fn on_event(&mut self, event: &Event) -> Result<(), SinkError>;
    /// Returns once everything taken so far is durable (on disk, drawn,
    /// printed).
    fn flush(&mut self) -> Result<(), SinkError>;
}

/// Fans events out to every sink. Shared by the engine thread, the sampler
/// thread and the interrupt handler, so it locks briefly per event.
#[derive(Default)]
pub struct Emitter {
    sinks: Mutex<Vec<Box<dyn EventSink>>>,
    errors: Mutex<Vec<String>>,
    closed: AtomicBool,
}

impl Emitter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a sink; events emitted earlier are not replayed to it.
    pub fn add(&self, sink: Box<dyn EventSink>) {
        if let Ok(mut sinks) = self.sinks.lock() {
            sinks.push(sink);
        }
    }

    /// Sends an event to every sink. A failing sink is remembered (see
    /// [`Emitter::take_errors`]) and does not stop the others or the engine.
    /// Returns false when the emitter was already closed and the event was
    /// dropped.
    pub fn emit(&self, event: Event) -> bool {
        let Ok(mut sinks) = self.sinks.lock() else {
            return false;
        };
        if self.closed.load(Ordering::SeqCst) {
            return false;
        }
        for sink in sinks.iter_mut() {
            if let Err(e) = sink.on_event(&event) {
                self.remember(e);
            }
        }
        true
    }

    /// Flushes every sink; returns after each has acknowledged.
    pub fn flush(&self) {
        let Ok(mut sinks) = self.sinks.lock() else {
            return;
        };
        for sink in sinks.iter_mut() {
            if let Err(e) = sink.flush() {
                self.remember(e);
            }
        }
    }

    /// Emits `last`, flushes every sink and ignores every later event, so
    /// that `last` stays the final line of every log (used on interrupt).
    pub fn close_with(&self, last: Event) {
        let Ok(mut sinks) = self.sinks.lock() else {
            return;
        };
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        for sink in sinks.iter_mut() {
            if let Err(e) = sink.on_event(&last) {
                self.remember(e);
            }
        }
        for sink in sinks.iter_mut() {
            if let Err(e) = sink.flush() {
                self.remember(e);
            }
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Sink failures seen so far, one line each, oldest first.
    pub fn take_errors(&self) -> Vec<String> {
        self.errors
            .lock()
            .map(|mut e| std::mem::take(&mut *e))
            .unwrap_or_default()
    }

    fn remember(&self, error: SinkError) {
        if let Ok(mut errors) = self.errors.lock() {
            let line = error.to_string();
            if !errors.contains(&line) {
                errors.push(line);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

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

    struct Broken;
    impl EventSink for Broken {
        fn on_event(&mut self, _: &Event) -> Result<(), SinkError> {
            Err(SinkError::Disconnected("test"))
        }
        fn flush(&mut self) -> Result<(), SinkError> {
            Ok(())
        }
    }

    #[test]
    fn a_broken_sink_does_not_starve_the_others() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let emitter = Emitter::new();
        emitter.add(Box::new(Broken));
        emitter.add(Box::new(Recorder(seen.clone())));
        for i in 0..3 {
            emitter.emit(Event::Message {
                level: Level::Info,
                text: format!("m{i}"),
                elapsed_s: 0.0,
            });
        }
        assert_eq!(seen.lock().unwrap().len(), 3);
        let errors = emitter.take_errors();
        assert_eq!(
            errors,
            vec!["the test writer thread has stopped".to_string()]
        );
    }

    #[test]
    fn events_are_tagged_json() {
        let e = Event::Progress {
            index: 2,
            total: 30,
            name: "model.layers.2".into(),
            pass: "pruning".into(),
            elapsed_s: 1.5,
        };
        let json = serde_json::to_string(&e).unwrap();
        assert!(json.starts_with(r#"{"event":"progress""#), "{json}");
        assert_eq!(serde_json::from_str::<Event>(&json).unwrap(), e);
    }
}
