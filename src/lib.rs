//! prunemem: prune Llama-family models with Burn, profile their memory as they
//! run, and predict memory before anyone buys a GPU.
//!
//! Three layers, each knowing only the one below:
//! - engines do the work and emit [`events::Event`]s: [`prune`] (layer by
//!   layer, GradProbe), [`model`] (checkpoints, the Llama, perplexity),
//!   [`data`], measured by [`profiler`] and [`memory`]; [`estimate`] predicts
//!   their memory. [`events`] is the contract: the event types, the stage
//!   catalogue, the one fold of events every reader uses, the log folder;
//! - [`jobs`] run them: a typed config validated into field-named errors, a
//!   run context given its sinks, an outcome;
//! - consumers read events: [`sinks`] (log files, summary, progress), the
//!   live UI (`tui`), [`report`], [`watch`]; the CLI (`cli`) turns flags into
//!   job configs, picks the sinks and prints.
//!
//! Engines never name jobs or consumers, consumers never name engines or
//! jobs (`tests/boundaries.rs` checks it).

pub mod data;
pub mod estimate;
pub mod events;
pub mod exec;
pub mod input;
pub mod jobs;
pub mod memory;
pub mod model;
pub mod profiler;
pub mod prune;
pub mod report;
pub mod scratch;
pub mod sinks;
pub mod timing;
pub mod train;
#[cfg(feature = "tui")]
pub mod tui;
pub mod units;
pub mod watch;

pub mod cli;
