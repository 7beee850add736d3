//! Rank 0 of a distributed run folds the other ranks' logs into its own
//! stream while they run: a collector thread reads what each rank appended
//! to `LOGDIR/rank-R/events.jsonl` (`events::ranks`) once a second and
//! emits its latest reading as [`Event::Rank`], so the live view, `watch`,
//! and rank 0's log show every rank's memory and progress. The ranks never
//! wait on it: it only reads files they write anyway.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::events::logdir::Tail;
use crate::events::{Emitter, Event, RankReading};

/// One rank's log, read as it grows, and its latest reading.
struct Follow {
    rank: usize,
    tail: Tail,
    latest: RankReading,
}

impl Follow {
    /// Takes the events the rank appended since the last poll; true when
    /// its reading changed. A log not there yet is looked for again at the
    /// next poll; a poll that fails (a line that is not an event) changes
    /// nothing, and the rank's own log keeps what it wrote.
    fn poll(&mut self) -> bool {
        let events = self.tail.poll().ok().flatten().unwrap_or_default();
        let mut changed = false;
        for e in &events {
            changed |= self.take(e);
        }
        changed
    }

    fn take(&mut self, e: &Event) -> bool {
        let r = &mut self.latest;
        match e {
            Event::Stage { snapshot } | Event::Sample { snapshot } => {
                r.elapsed_s = snapshot.elapsed_s;
                r.rss = snapshot.rss;
                r.rss_peak = r.rss_peak.max(snapshot.rss_peak).max(snapshot.rss);
                r.device_allocated = snapshot.device_allocated;
                r.device_peak = snapshot.device_peak;
                if matches!(e, Event::Stage { .. }) {
                    r.stage = Some(snapshot.label.clone());
                }
            }
            Event::Progress { index, total, .. } => {
                r.done = Some(index + 1);
                r.total = Some(*total);
            }
            Event::RunFinished { summary } => {
                r.rss_peak = r.rss_peak.max(summary.rss_peak);
                r.finished = Some(summary.status.name().into());
            }
            _ => return false,
        }
        true
    }
}

/// The running collector; [`Collector::stop`] reads once more and joins.
pub struct Collector {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

fn poll_all(tails: &mut [Follow], emitter: &Emitter) {
    for t in tails.iter_mut() {
        if t.poll() {
            emitter.emit(Event::Rank {
                rank: t.rank,
                reading: t.latest.clone(),
            });
        }
    }
}

impl Collector {
    /// Follows ranks `1..world` logging under `dir`, emitting to `emitter`.
    pub fn start(dir: &Path, world: usize, emitter: Arc<Emitter>) -> Self {
        let mut tails: Vec<Follow> = (1..world)
            .map(|rank| Follow {
                rank,
                tail: Tail::new(
                    dir.join(crate::events::ranks::folder(rank))
                        .join(crate::events::logdir::JSONL_FILE),
                ),
                latest: RankReading::default(),
            })
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("prunemem-ranks".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    poll_all(&mut tails, &emitter);
                    // Short naps, so that stopping is prompt.
                    for _ in 0..10 {
                        if flag.load(Ordering::Relaxed) {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
                poll_all(&mut tails, &emitter);
            })
            .ok();
        Self { stop, handle }
    }

    /// Reads every rank's log a last time and stops.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
