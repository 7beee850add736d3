//! The live UI as an event sink: [`TuiSink`] turns events into private
//! messages on a bounded channel to a render thread that owns the terminal
//! (as burn-train's renderer does). The engine never waits on the UI:
//! samples are dropped when the channel is full (counted, shown in the key
//! line), stages and every other event are always delivered. The thread
//! redraws at most every 100 ms, reads keys, and restores the terminal when
//! it ends, when the run it watches is aborted, and on panic (ratatui's
//! hook).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossterm::event::{self as ct, KeyCode, KeyEventKind, KeyModifiers};

use super::state::{Action, Key, Mode, UiState};
use super::view;
use crate::events::{Event, EventSink, SinkError};

/// Least time between two frames.
const FRAME: Duration = Duration::from_millis(100);
/// Messages waiting for the render thread before samples are dropped.
const QUEUE: usize = 1024;

enum Msg {
    Event(Box<Event>),
    Flush(SyncSender<()>),
    Close,
}

/// What the UI thread cost, for the record.
#[derive(Debug, Clone, Copy, Default)]
pub struct UiStats {
    pub frames: u64,
    pub cpu_s: f64,
    pub wall_s: f64,
}

impl UiStats {
    /// One line for the record (`PRUNEMEM_UI_STATS=1`).
    pub fn line(&self) -> String {
        format!(
            "ui thread: {:.2} s CPU over {:.1} s ({:.2}% of a core), {} frames",
            self.cpu_s,
            self.wall_s,
            self.cpu_percent(),
            self.frames
        )
    }

    /// Share of one core the UI thread used, in percent.
    pub fn cpu_percent(&self) -> f64 {
        100.0 * self.cpu_s / self.wall_s.max(1e-9)
    }
}

/// Called when the user stops the run from the UI (after the terminal is
/// restored).
pub type AbortFn = Box<dyn Fn() + Send>;

type Shared = Arc<Mutex<(Option<JoinHandle<UiStats>>, UiStats)>>;

/// The live terminal UI, fed as an event sink.
pub struct TuiSink {
    handle: TuiHandle,
    dropped: Arc<AtomicU64>,
    close_on_finish: bool,
}

/// Waits for or closes the UI from outside the emitter that owns the sink.
#[derive(Clone)]
pub struct TuiHandle {
    tx: SyncSender<Msg>,
    thread: Shared,
    quit: Arc<AtomicBool>,
}

impl TuiHandle {
    /// Whether the view has closed (the user quit, or it was closed).
    pub fn quit_requested(&self) -> bool {
        self.quit.load(Ordering::SeqCst)
    }

    /// Waits until the user quits, then returns what the UI cost.
    pub fn wait(&self) -> UiStats {
        let mut guard = match self.thread.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Some(t) = guard.0.take() {
            guard.1 = t.join().unwrap_or_default();
        }
        guard.1
    }

    /// Closes the view now (the terminal is restored when this returns).
    pub fn close(&self) -> UiStats {
        // A view that already quit has a drain thread that ends when the
        // senders are gone; one that is running ends at this message.
        if !self.quit_requested() {
            let _ = self.tx.send(Msg::Close);
        }
        self.wait()
    }
}

impl TuiSink {
    /// Takes over the terminal. `close_on_finish`: leave the screen as soon
    /// as the run's last event arrives (an in-process run, whose summary is
    /// then printed); otherwise the view stays until the user quits.
    pub fn start(mode: Mode, on_abort: AbortFn, close_on_finish: bool) -> Result<Self, SinkError> {
        let (tx, rx) = mpsc::sync_channel(QUEUE);
        let quit = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicU64::new(0));
        let terminal = ratatui::try_init().map_err(|source| SinkError::Io {
            path: "terminal".into(),
            source,
        })?;
        let (q, d) = (quit.clone(), dropped.clone());
        let thread = std::thread::Builder::new()
            .name("prunemem-tui".into())
            .spawn(move || ui_loop(terminal, rx, mode, q, d, on_abort))
            .map_err(|source| {
                ratatui::restore();
                SinkError::Io {
                    path: "tui thread".into(),
                    source,
                }
            })?;
        Ok(Self {
            handle: TuiHandle {
                tx,
                thread: Arc::new(Mutex::new((Some(thread), UiStats::default()))),
                quit,
            },
            dropped,
            close_on_finish,
        })
    }

    pub fn handle(&self) -> TuiHandle {
        self.handle.clone()
    }
}

impl EventSink for TuiSink {
    fn on_event(&mut self, event: &Event) -> Result<(), SinkError> {
        if self.handle.quit_requested() {
            return Ok(());
        }
        let tx = &self.handle.tx;
        match event {
            Event::Sample { .. } => match tx.try_send(Msg::Event(Box::new(event.clone()))) {
                Ok(()) | Err(TrySendError::Disconnected(_)) => {}
                Err(TrySendError::Full(_)) => {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                }
            },
            _ => {
                let _ = tx.send(Msg::Event(Box::new(event.clone())));
                if self.close_on_finish && matches!(event, Event::RunFinished { .. }) {
                    let stats = self.handle.close();
                    if std::env::var_os("PRUNEMEM_UI_STATS").is_some() {
                        eprintln!("{}", stats.line());
                    }
                }
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), SinkError> {
        if !self.handle.quit_requested() {
            let (ack, done) = mpsc::sync_channel(1);
            if self.handle.tx.send(Msg::Flush(ack)).is_ok() {
                let _ = done.recv_timeout(Duration::from_secs(2));
            }
        }
        Ok(())
    }
}

impl Drop for TuiSink {
    fn drop(&mut self) {
        if self.close_on_finish {
            self.handle.close();
        }
    }
}

fn key_of(k: ct::KeyEvent) -> Option<Key> {
    if k.kind != KeyEventKind::Press {
        return None;
    }
    Some(match k.code {
        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => Key::CtrlC,
        KeyCode::Char(c) => Key::Char(c),
        KeyCode::Tab => Key::Tab,
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::PageUp => Key::PageUp,
        KeyCode::PageDown => Key::PageDown,
        KeyCode::Home => Key::Home,
        KeyCode::End => Key::End,
        KeyCode::Esc => Key::Esc,
        _ => return None,
    })
}

/// CPU time of the calling thread.
fn thread_cpu_s() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc == 0 {
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    } else {
        0.0
    }
}

fn ui_loop(
    mut terminal: ratatui::DefaultTerminal,
    rx: Receiver<Msg>,
    mode: Mode,
    quit: Arc<AtomicBool>,
    dropped: Arc<AtomicU64>,
    on_abort: AbortFn,
) -> UiStats {
    let start = Instant::now();
    let cpu0 = thread_cpu_s();
    let mut state = UiState::new(mode);
    // Events that arrive while the view is paused wait here.
    let mut held: Vec<Event> = Vec::new();
    let mut frames = 0u64;
    let mut last_draw: Option<Instant> = None;
    let mut dirty = true;
    let mut abort = false;
    'run: loop {
        let wait = last_draw.map_or(Duration::ZERO, |t| FRAME.saturating_sub(t.elapsed()));
        let mut next = match rx.recv_timeout(wait.max(Duration::from_millis(10))) {
            Ok(m) => Some(m),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => break,
        };
        while let Some(msg) = next.take() {
            match msg {
                Msg::Event(e) if state.paused => held.push(*e),
                Msg::Event(e) => {
                    state.apply(&e);
                    dirty = true;
                }
                Msg::Flush(ack) => {
                    let _ = ack.send(());
                }
                Msg::Close => break 'run,
            }
            next = rx.try_recv().ok();
        }
        while ct::poll(Duration::ZERO).unwrap_or(false) {
            match ct::read() {
                Ok(ct::Event::Key(k)) => {
                    let Some(key) = key_of(k) else { continue };
                    let action = state.key(key);
                    if !state.paused {
                        for e in held.drain(..) {
                            state.apply(&e);
                        }
                    }
                    dirty = true;
                    match action {
                        Action::None => {}
                        Action::Quit => break 'run,
                        Action::Abort => {
                            abort = true;
                            break 'run;
                        }
                    }
                }
                Ok(ct::Event::Resize(..)) => dirty = true,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        if dirty && last_draw.is_none_or(|t| t.elapsed() >= FRAME) {
            state.dropped = dropped.load(Ordering::Relaxed);
            if terminal.draw(|f| view::draw(f, &state)).is_err() {
                break;
            }
            frames += 1;
            last_draw = Some(Instant::now());
            dirty = false;
        }
    }
    ratatui::restore();
    quit.store(true, Ordering::SeqCst);
    let stats = UiStats {
        frames,
        cpu_s: thread_cpu_s() - cpu0,
        wall_s: start.elapsed().as_secs_f64(),
    };
    if abort {
        on_abort();
    }
    // Keep answering flushes until every sender is gone or closes us.
    drain_after_quit(rx);
    stats
}

/// After the view closed, acknowledge flushes so the run never waits on a
/// UI that is gone; returns on `Close` or when the sink is dropped.
fn drain_after_quit(rx: Receiver<Msg>) {
    std::thread::spawn(move || {
        while let Ok(msg) = rx.recv() {
            match msg {
                Msg::Flush(ack) => {
                    let _ = ack.send(());
                }
                Msg::Close => break,
                Msg::Event(_) => {}
            }
        }
    });
}
