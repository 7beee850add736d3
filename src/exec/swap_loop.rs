//! DSnoT's swap loop as one request to a backend
//! ([`super::Compute::dsnot_swaps`]): the lists the pruning engine's
//! cursors walk and the state they start from, so a device backend runs
//! every cycle of every output in one kernel launch (`exec::kernels`)
//! where Burn's ops take about a hundred launches a cycle
//! (`prune::dsnot_device`, which builds the request and runs those ops
//! where a backend hands it back).
//!
//! Layout: Burn's `[in, out]`; a list is `[len, out]`, one column an
//! output, and an entry's input runs down dim 0.

use burn::prelude::*;

static ENV: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();

/// Whether the loop is asked of the backend in one launch:
/// `PRUNEMEM_DSNOT=ops` steps it with Burn's ops instead (a comparison,
/// or a way round a device whose compiler rejects the kernel); `kernel`,
/// unset or anything else, the launch.
pub fn one_launch() -> bool {
    super::defaults::env_or(&ENV, "PRUNEMEM_DSNOT", &["ops", "kernel"], || true)
}

/// The plan's `dsnot` setting: `kernel` or `ops` ([`one_launch`]).
pub fn name() -> &'static str {
    match one_launch() {
        true => "kernel",
        false => "ops",
    }
}

/// A list one cursor walks, `[len, cols]`.
#[derive(Clone)]
pub struct SwapList<B: Backend> {
    /// The order's keys (the lexicographic order of `(key, input)`).
    pub keys: Tensor<B, 2, Int>,
    /// Each entry's input; `None`: its own position (a whole column).
    pub rows: Option<Tensor<B, 2, Int>>,
    /// Which entries count (1) and which do not (0); `None`: all.
    pub among: Option<Tensor<B, 2, Int>>,
}

/// What a swap prunes.
#[derive(Clone)]
pub enum SwapPrune<B: Backend> {
    /// Unstructured: the prune order's two ends, end 0 walked where the
    /// error is not negative, end 1 where it is, each from its own list's
    /// front. Where `whole`, both lists are whole columns of one key
    /// matrix filtered by `among`, and an end past its own entries takes
    /// the smallest kept weight once per zero, then the other end's list
    /// from its back. `ends` (`[7, cols]`): per end its own entries'
    /// count, where its zeros end and where it ends; then the smallest
    /// kept weight's input.
    Ends {
        own: [SwapList<B>; 2],
        whole: bool,
        ends: Tensor<B, 2, Int>,
    },
    /// N:M: the first metric's keys (`[rows, cols]`, the pruned ones
    /// raised) — the regrown weight's group gives up its first smallest,
    /// whose key becomes `max_value` (`[1, cols]`) — and `m`.
    Groups {
        metric: Tensor<B, 2, Int>,
        max_value: Tensor<B, 2, Int>,
        m: usize,
    },
}

/// One linear's loop: the products `W·x̄` (`d`, f32), the first mask
/// (`mask`, 1 pruned), each output's first error (`err`, `[1, cols]`),
/// the regrowing order's front and back lists, the prune side, the
/// cycles and the error threshold.
#[derive(Clone)]
pub struct SwapLoop<B: Backend> {
    pub d: Tensor<B, 2>,
    pub mask: Tensor<B, 2, Int>,
    pub err: Tensor<B, 2>,
    pub regrow: [SwapList<B>; 2],
    pub prune: SwapPrune<B>,
    pub cycles: usize,
    pub threshold: f32,
}

/// The loop's result: the mask (1 pruned) and each output's swaps
/// (`[1, cols]`).
pub struct Swapped<B: Backend> {
    pub mask: Tensor<B, 2, Int>,
    pub swaps: Tensor<B, 2, Int>,
}
