//! The live terminal UI (feature `tui`): a sink like any other, so the
//! engine never knows it is watched. `state` folds events into what the
//! screen shows, `view` draws it, `app` owns the terminal and the render
//! thread.

pub mod app;
pub mod state;
pub mod view;

pub use app::{AbortFn, TuiHandle, TuiSink, UiStats};
pub use state::{Mode, UiState};
