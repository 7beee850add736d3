//! Events from outside this process, for the same sinks a prune run feeds:
//! following a run's `events.jsonl` as it grows ([`follow`]), playing a
//! finished run back ([`replay`]), and watching any command ([`command`]):
//! its process tree's memory and the stage markers it prints — or any
//! process already running ([`attach`]).

pub mod attach;
pub mod checkpoint;
pub mod command;
pub mod follow;

pub use attach::attach;
pub use command::{Emit, WatchOptions, parse_marker, watch_command};
pub use follow::{follow, read_all, replay};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum WatchError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}
