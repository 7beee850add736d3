//! A file written by its own thread.
//!
//! File sinks must not make the engine wait on disk for every sample, yet a
//! log must survive the run being killed — SIGKILL from the OOM killer
//! included, where no code of ours runs. [`LineFile`] hands complete lines
//! to a writer thread; [`LineFile::flush`] sends a flush request and waits
//! for the thread's acknowledgement, after which the lines are in the
//! kernel (a killed process loses nothing the kernel has). Sinks flush after
//! every line that must not be lost (stages, scopes, messages, the end);
//! other lines (samples) reach the kernel within [`BATCH`], however busy the
//! channel is. Lines are written whole, so a file cut short by a kill ends
//! at a line boundary or with at most one torn line.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest a queued line waits before it is handed to the kernel.
pub const BATCH: Duration = Duration::from_millis(200);

use crate::events::SinkError;

enum Msg {
    Line(String),
    Flush(SyncSender<Result<(), String>>),
}

/// A file fed line by line through a writer thread.
pub struct LineFile {
    tx: Option<Sender<Msg>>,
    thread: Option<JoinHandle<()>>,
    path: String,
    name: &'static str,
}

impl LineFile {
    /// Creates (truncates) `path`, writes `header` if given, and starts the
    /// writer thread.
    pub fn create(
        path: &Path,
        header: Option<&str>,
        name: &'static str,
    ) -> Result<Self, SinkError> {
        let shown = path.display().to_string();
        let io_err = |source| SinkError::Io {
            path: shown.clone(),
            source,
        };
        let mut out = BufWriter::with_capacity(64 * 1024, File::create(path).map_err(io_err)?);
        if let Some(h) = header {
            out.write_all(h.as_bytes()).map_err(io_err)?;
            out.write_all(b"\n").map_err(io_err)?;
            out.flush().map_err(io_err)?;
        }
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name(format!("prunemem-{name}"))
            .spawn(move || writer_loop(out, rx))
            .map_err(io_err)?;
        Ok(Self {
            tx: Some(tx),
            thread: Some(thread),
            path: shown,
            name,
        })
    }

    /// Queues one line (without its newline).
    pub fn write_line(&self, line: String) -> Result<(), SinkError> {
        self.tx
            .as_ref()
            .and_then(|tx| tx.send(Msg::Line(line)).ok())
            .ok_or(SinkError::Disconnected(self.name))
    }

    /// Returns once every queued line is written to the file.
    pub fn flush(&self) -> Result<(), SinkError> {
        let (ack_tx, ack_rx) = mpsc::sync_channel(1);
        let tx = self.tx.as_ref().ok_or(SinkError::Disconnected(self.name))?;
        tx.send(Msg::Flush(ack_tx))
            .map_err(|_| SinkError::Disconnected(self.name))?;
        match ack_rx.recv() {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(SinkError::Io {
                path: self.path.clone(),
                source: std::io::Error::other(message),
            }),
            Err(_) => Err(SinkError::Disconnected(self.name)),
        }
    }
}

impl Drop for LineFile {
    fn drop(&mut self) {
        // Closing the channel lets the thread drain, flush and sync.
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn writer_loop(mut out: BufWriter<File>, rx: Receiver<Msg>) {
    let mut dirty = false;
    let mut failed: Option<String> = None;
    let mut flushed = Instant::now();
    loop {
        // A steady stream of lines never times out: flush on the clock too.
        if dirty && failed.is_none() && flushed.elapsed() >= BATCH {
            let _ = out.flush();
            dirty = false;
            flushed = Instant::now();
        }
        match rx.recv_timeout(BATCH) {
            Ok(Msg::Line(mut line)) => {
                line.push('\n');
                if failed.is_none()
                    && let Err(e) = out.write_all(line.as_bytes())
                {
                    failed = Some(e.to_string());
                }
                dirty = true;
            }
            Ok(Msg::Flush(ack)) => {
                if failed.is_none()
                    && let Err(e) = out.flush()
                {
                    failed = Some(e.to_string());
                }
                dirty = false;
                flushed = Instant::now();
                let _ = ack.send(failed.clone().map_or(Ok(()), Err));
            }
            Err(RecvTimeoutError::Timeout) => {
                if dirty && failed.is_none() {
                    let _ = out.flush();
                    dirty = false;
                }
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    let _ = out.flush();
    let _ = out.get_ref().sync_data();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_acknowledges_every_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lines.txt");
        let file = LineFile::create(&path, Some("header"), "test").unwrap();
        for i in 0..10_000 {
            file.write_line(format!("line {i}")).unwrap();
        }
        file.flush().unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 10_001);
        assert_eq!(lines[0], "header");
        assert_eq!(lines[10_000], "line 9999");
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn a_busy_stream_still_reaches_the_file_within_the_batch_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lines.txt");
        let file = LineFile::create(&path, None, "test").unwrap();
        let start = Instant::now();
        // Lines every 20 ms (faster than the batch time) for 1 s, no flush.
        let mut seen_early = false;
        while start.elapsed() < Duration::from_secs(1) {
            file.write_line("sample".into()).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            if start.elapsed() > BATCH * 3 {
                seen_early |= !std::fs::read_to_string(&path).unwrap().is_empty();
            }
        }
        assert!(
            seen_early,
            "lines reached the file while the stream went on"
        );
    }

    #[test]
    fn unwritable_path_is_a_typed_error() {
        let err = LineFile::create(Path::new("/nonexistent-dir/x/y.csv"), None, "csv")
            .err()
            .expect("creating a file in a missing folder fails");
        assert!(err.to_string().contains("/nonexistent-dir/x/y.csv"));
    }
}
