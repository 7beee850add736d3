//! What the live UI knows, built from events alone and free of any terminal:
//! the run's header, the run as the shared fold sees it (latest readings
//! and their peaks, the memory history, the stage timeline with deltas and
//! window peaks, layer progress and its ETA: [`RunFold`]), messages, and the
//! keyboard state (focus, scroll, pause, help, quit confirmation). The view
//! (`tui::view`) only reads it, so every rule here is unit-tested.

use crate::estimate::forecast::{self, Forecast};
use crate::estimate::{Estimate, Phase};
use crate::events::fold::RunFold;
use crate::events::{Event, Level, RunStatus};

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

#[derive(Debug, Clone)]
pub struct UiState {
    pub mode: Mode,
    pub command: String,
    pub model: String,
    pub method: String,
    /// The run: readings, history, stages, progress.
    pub run: RunFold,
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
    /// The estimator's prediction for this run's plan, when it can place it.
    pub estimate: Option<Estimate>,
    /// The run's `--budget` (plan setting `memory_budget`).
    pub budget: Option<u64>,
}

impl UiState {
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            command: String::new(),
            model: String::new(),
            method: String::new(),
            run: RunFold::with_point_limit(HISTORY_POINTS),
            messages: Vec::new(),
            finished: None,
            focus: Focus::Stages,
            stage_scroll: 0,
            message_scroll: 0,
            paused: false,
            help: false,
            confirm_quit: false,
            dropped: 0,
            estimate: None,
            budget: None,
        }
    }

    /// Will the run fit: the estimate corrected by what was measured, against
    /// the budget (`--budget`, else the GPU's total, else the host's memory).
    pub fn forecast(&self) -> Option<Forecast> {
        let e = self.estimate.as_ref()?;
        let b = match self.run.on_device() {
            true => {
                // The run's pool cap, as its plan recorded it.
                let plan = self.run.plan.as_ref();
                let cap = plan.and_then(|p| p.settings.get("device_memory")?.as_u64());
                forecast::device_budget(self.budget, cap, self.run.gpu.total)
            }
            false => forecast::budget(self.budget, self.run.gpu.total, self.run.host_total),
        };
        Some(forecast::forecast(e, &self.run, b))
    }

    /// The estimated phase under way: its first stage seen, its last not yet.
    pub fn phase_now(&self) -> Option<&Phase> {
        let e = self.estimate.as_ref()?;
        e.phases
            .iter()
            .find(|p| match (p.stages.first(), p.stages.last()) {
                (Some(a), Some(b)) => {
                    self.run.stage_index(a).is_some() && self.run.stage_index(b).is_none()
                }
                _ => false,
            })
    }

    /// Takes one event.
    pub fn apply(&mut self, event: &Event) {
        self.run.apply(event);
        match event {
            Event::RunStarted { plan } => {
                self.estimate = forecast::estimate_plan(plan);
                self.budget = plan.settings.get("memory_budget").and_then(|v| v.as_u64());
                // The program by its name, not its path: the header shows
                // the command once (`prunemem prune …`).
                self.command = match plan.argv.split_first() {
                    None => format!("prunemem {}", plan.command),
                    Some((program, rest)) => {
                        let name = std::path::Path::new(program)
                            .file_name()
                            .map_or(program.clone(), |n| n.to_string_lossy().into_owned());
                        std::iter::once(name)
                            .chain(rest.iter().cloned())
                            .collect::<Vec<_>>()
                            .join(" ")
                    }
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
            Event::Stage { .. } => self.follow_stages(),
            Event::Message { level, text, .. } => {
                self.messages.push((*level, text.clone()));
                if self.messages.len() > MESSAGES {
                    self.messages.remove(0);
                }
            }
            Event::RunFinished { summary } => self.finished = Some(summary.status.clone()),
            _ => {}
        }
    }

    /// Keeps the newest stage row in view unless the user scrolled away.
    fn follow_stages(&mut self) {
        let rows = self.run.stages.len();
        if self.focus != Focus::Stages || self.stage_scroll + 1 >= rows.saturating_sub(1) {
            self.stage_scroll = rows.saturating_sub(1);
        }
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
                    Focus::Stages => (self.run.stages.len(), &mut self.stage_scroll),
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
