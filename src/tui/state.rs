//! What the live UI knows, built from events alone and free of any terminal:
//! the run's header, the latest readings and their peaks, a history of the
//! memory series, the stage timeline with deltas, layer progress, messages,
//! and the keyboard state (focus, scroll, pause, help, quit confirmation).
//! The view (`tui::view`) only reads it, so every rule here is unit-tested.

use std::collections::VecDeque;

use crate::events::{Event, Level, RunStatus};
use crate::memory::MemorySnapshot;

/// Most history points kept; older halves are thinned when exceeded.
const HISTORY_POINTS: usize = 4096;
/// Messages kept for the message pane.
const MESSAGES: usize = 200;

/// Who owns the run the UI shows, which decides what `q` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The run lives in this process or is a child of it (`prune`, `watch --
    /// cmd`): quitting asks first, then stops the run.
    Owner,
    /// A log followed or replayed: quitting only closes the view.
    Viewer,
}

/// Keys the UI reacts to, independent of the terminal library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Char(char),
    Tab,
    Up,
    Down,
    PageUp,
    PageDown,
    Home,
    End,
    Esc,
    CtrlC,
}

/// What a key asks of the UI loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    None,
    /// Close the view (viewer mode, or the user confirmed).
    Quit,
    /// Stop the run (owner mode, confirmed or Ctrl-C), then close.
    Abort,
}

/// Panels that take the arrow keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Focus {
    Stages,
    Messages,
}

/// One point of the history chart.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub t: f64,
    pub rss: Option<u64>,
    pub heap: Option<u64>,
    pub reserved: Option<u64>,
    pub gpu_used: Option<u64>,
}

/// One row of the stage timeline.
#[derive(Debug, Clone, PartialEq)]
pub struct StageRow {
    pub label: String,
    pub elapsed_s: f64,
    pub rss: Option<u64>,
    pub heap: Option<u64>,
    /// Highest RSS reached since the previous stage (samples and the
    /// kernel's high-water mark).
    pub peak: Option<u64>,
    /// RSS change from the previous stage.
    pub delta: Option<i64>,
    /// Seconds since the previous stage.
    pub seconds: f64,
}

/// A reading and its highest value so far.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reading {
    pub now: Option<u64>,
    pub peak: Option<u64>,
    /// What the reading is a part of (GPU total), when known.
    pub total: Option<u64>,
}

impl Reading {
    fn update(&mut self, now: Option<u64>, peak: Option<u64>) {
        if now.is_some() {
            self.now = now;
        }
        self.peak = [self.peak, now, peak].into_iter().flatten().max();
    }
}

#[derive(Debug, Clone)]
pub struct UiState {
    pub mode: Mode,
    pub command: String,
    pub model: String,
    pub method: String,
    pub elapsed_s: f64,
    pub rss: Reading,
    pub heap: Reading,
    pub reserved: Reading,
    pub gpu: Reading,
    pub history: VecDeque<Point>,
    pub stages: Vec<StageRow>,
    /// Layer progress: done, total, name of the last finished unit.
    pub progress: Option<(usize, usize, String)>,
    /// When the current progress sequence began (seconds) and its total.
    progress_origin: Option<(f64, usize)>,
    /// Peak RSS since the last stage, for the next stage row.
    window_peak: Option<u64>,
    pub messages: Vec<(Level, String)>,
    pub finished: Option<RunStatus>,
    pub focus: Focus,
    /// First stage row shown (scrolling).
    pub stage_scroll: usize,
    pub message_scroll: usize,
    pub paused: bool,
    pub help: bool,
    pub confirm_quit: bool,
    /// Samples dropped before reaching the UI (reported in the footer).
    pub dropped: u64,
}

impl UiState {
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            command: String::new(),
            model: String::new(),
            method: String::new(),
            elapsed_s: 0.0,
            rss: Reading::default(),
            heap: Reading::default(),
            reserved: Reading::default(),
            gpu: Reading::default(),
            history: VecDeque::new(),
            stages: Vec::new(),
            progress: None,
            progress_origin: None,
            window_peak: None,
            messages: Vec::new(),
            finished: None,
            focus: Focus::Stages,
            stage_scroll: 0,
            message_scroll: 0,
            paused: false,
            help: false,
            confirm_quit: false,
            dropped: 0,
        }
    }

    /// Takes one event.
    pub fn apply(&mut self, event: &Event) {
        match event {
            Event::RunStarted { plan } => {
                self.command = if plan.argv.is_empty() {
                    plan.command.clone()
                } else {
                    plan.argv.join(" ")
                };
                if let Some(m) = &plan.model {
                    self.model = format!(
                        "{} ({} layers, hidden {})",
                        short_source(&m.source),
                        m.layers,
                        m.hidden
                    );
                }
                let setting =
                    |k: &str| plan.settings.get(k).map(|v| v.to_string().replace('"', ""));
                self.method = match (&plan.method, setting("sparsity"), setting("sparsity_type")) {
                    (Some(m), Some(s), Some(t)) => format!("{m} {s} {t}"),
                    (Some(m), Some(s), None) => format!("{m} {s}"),
                    (Some(m), _, _) => m.clone(),
                    (None, _, _) => plan.command.clone(),
                };
            }
            Event::Stage { snapshot } => {
                self.reading(snapshot);
                let prev = self.stages.last();
                let delta = match (prev.and_then(|p| p.rss), snapshot.rss) {
                    (Some(a), Some(b)) => Some(b as i64 - a as i64),
                    _ => None,
                };
                let seconds = snapshot.elapsed_s - prev.map_or(0.0, |p| p.elapsed_s);
                let peak = [self.window_peak, snapshot.rss].into_iter().flatten().max();
                self.stages.push(StageRow {
                    label: snapshot.label.clone(),
                    elapsed_s: snapshot.elapsed_s,
                    rss: snapshot.rss,
                    heap: snapshot.heap_allocated,
                    peak,
                    delta,
                    seconds: seconds.max(0.0),
                });
                self.window_peak = snapshot.rss;
                self.follow_stages();
            }
            Event::Sample { snapshot } => self.reading(snapshot),
            Event::Progress {
                index,
                total,
                name,
                elapsed_s,
            } => {
                let origin = match self.progress_origin {
                    Some((t, n)) if n == *total && *index > 0 => t,
                    // A new sequence starts at the last stage before it.
                    _ => self.stages.last().map_or(0.0, |s| s.elapsed_s),
                };
                self.progress_origin = Some((origin, *total));
                self.progress = Some((index + 1, *total, name.clone()));
                self.elapsed_s = self.elapsed_s.max(*elapsed_s);
            }
            Event::Message { level, text, .. } => {
                self.messages.push((*level, text.clone()));
                if self.messages.len() > MESSAGES {
                    self.messages.remove(0);
                }
            }
            Event::RunFinished { summary } => {
                self.finished = Some(summary.status.clone());
                self.elapsed_s = self.elapsed_s.max(summary.wall_s);
                self.rss.update(None, summary.rss_peak);
                self.heap.update(None, summary.heap_peak);
            }
            Event::ScopeBegin { .. } | Event::ScopeEnd { .. } | Event::Components { .. } => {}
        }
    }

    fn reading(&mut self, s: &MemorySnapshot) {
        self.elapsed_s = self.elapsed_s.max(s.elapsed_s);
        // The kernel's high-water mark counts even between samples: when it
        // rose, the new high happened in the current stage window.
        let rose = match (s.rss_peak, self.rss.peak) {
            (Some(p), Some(prev)) if p > prev => Some(p),
            _ => None,
        };
        self.window_peak = [self.window_peak, s.rss, rose].into_iter().flatten().max();
        self.rss.update(s.rss, s.rss_peak);
        self.heap.update(s.heap_allocated, s.heap_peak);
        self.reserved.update(s.device_reserved, None);
        self.gpu.update(s.gpu_used, None);
        if s.gpu_total.is_some() {
            self.gpu.total = s.gpu_total;
        }
        self.history.push_back(Point {
            t: s.elapsed_s,
            rss: s.rss,
            heap: s.heap_allocated,
            reserved: s.device_reserved,
            gpu_used: s.gpu_used,
        });
        if self.history.len() > HISTORY_POINTS {
            // Thin the older half: keep every other point.
            let half = self.history.len() / 2;
            let kept: VecDeque<Point> = self
                .history
                .iter()
                .enumerate()
                .filter(|(i, _)| *i >= half || i % 2 == 0)
                .map(|(_, p)| *p)
                .collect();
            self.history = kept;
        }
    }

    /// Keeps the newest stage row in view unless the user scrolled away.
    fn follow_stages(&mut self) {
        if self.focus != Focus::Stages
            || self.stage_scroll + 1 >= self.stages.len().saturating_sub(1)
        {
            self.stage_scroll = self.stages.len().saturating_sub(1);
        }
    }

    /// The stage row with the highest peak.
    pub fn peak_stage(&self) -> Option<usize> {
        self.stages
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.peak.map(|p| (i, p)))
            .max_by_key(|(_, p)| *p)
            .map(|(i, _)| i)
    }

    /// Seconds left in the current progress sequence, from its pace so far.
    pub fn eta_s(&self) -> Option<f64> {
        let (done, total, _) = self.progress.as_ref()?;
        let (origin, _) = self.progress_origin?;
        if *done == 0 || done >= total || self.finished.is_some() {
            return None;
        }
        let per = (self.elapsed_s - origin) / *done as f64;
        Some(per * (total - done) as f64)
    }

    /// Reacts to a key.
    pub fn key(&mut self, key: Key) -> Action {
        if self.confirm_quit {
            self.confirm_quit = false;
            return match key {
                Key::Char('y' | 'Y') | Key::CtrlC => Action::Abort,
                _ => Action::None,
            };
        }
        if self.help && !matches!(key, Key::CtrlC | Key::Char('q')) {
            self.help = false;
            return Action::None;
        }
        match key {
            Key::CtrlC => match (self.mode, &self.finished) {
                (Mode::Owner, None) => Action::Abort,
                _ => Action::Quit,
            },
            Key::Char('q') | Key::Esc => match (self.mode, &self.finished) {
                (Mode::Owner, None) => {
                    self.confirm_quit = true;
                    Action::None
                }
                _ => Action::Quit,
            },
            Key::Char('p') => {
                self.paused = !self.paused;
                Action::None
            }
            Key::Char('?') => {
                self.help = true;
                Action::None
            }
            Key::Tab => {
                self.focus = match self.focus {
                    Focus::Stages => Focus::Messages,
                    Focus::Messages => Focus::Stages,
                };
                Action::None
            }
            Key::Up | Key::Down | Key::PageUp | Key::PageDown | Key::Home | Key::End => {
                let (len, pos) = match self.focus {
                    Focus::Stages => (self.stages.len(), &mut self.stage_scroll),
                    Focus::Messages => (self.messages.len(), &mut self.message_scroll),
                };
                let last = len.saturating_sub(1);
                *pos = match key {
                    Key::Up => pos.saturating_sub(1),
                    Key::Down => (*pos + 1).min(last),
                    Key::PageUp => pos.saturating_sub(10),
                    Key::PageDown => (*pos + 10).min(last),
                    Key::Home => 0,
                    _ => last,
                };
                Action::None
            }
            Key::Char(_) => Action::None,
        }
    }
}

/// The last two path components of a model source, for the header.
fn short_source(source: &str) -> String {
    let parts: Vec<&str> = source.trim_end_matches('/').rsplit('/').take(2).collect();
    parts.into_iter().rev().collect::<Vec<_>>().join("/")
}

#[cfg(test)]
mod tests;
