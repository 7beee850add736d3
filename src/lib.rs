//! prunemem: prune Llama-family models with Burn, profile their memory as they
//! run, and predict memory before anyone buys a GPU.
//!
//! The crate is one engine with several faces. Engines ([`profiler`], and the
//! model, pruning and estimation modules) emit [`events::Event`]s; sinks
//! ([`sinks`], the live UI, reports) consume them. No engine module imports a
//! sink, the UI or the charts.

pub mod data;
pub mod estimate;
pub mod events;
pub mod jobs;
pub mod memory;
pub mod model;
pub mod profiler;
pub mod prune;
pub mod report;
pub mod sinks;
#[cfg(feature = "tui")]
pub mod tui;
pub mod units;
pub mod watch;

pub mod cli;
