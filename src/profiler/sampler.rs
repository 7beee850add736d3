//! The background sampler: a thread that reads the probes at a fixed rate
//! and emits [`Event::Sample`]s, so that peaks between two stage snapshots
//! are seen (and, for allocators without their own peak counter, tracked).

use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use super::Inner;
use crate::events::{Event, stages};

pub(crate) struct Sampler {
    stop: Sender<()>,
    thread: JoinHandle<()>,
}

impl Sampler {
    pub(crate) fn start(inner: Arc<Inner>, period: Duration) -> Self {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("prunemem-sampler".into())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(period) {
                    let snapshot = inner.read(stages::SAMPLE, false);
                    inner.emitter.emit(Event::Sample { snapshot });
                }
            })
            .expect("spawning a thread only fails when the OS is out of resources");
        Self { stop, thread }
    }

    pub(crate) fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}
