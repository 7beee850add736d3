//! What one micro-batch is and what it trains: the autodiff backend, the
//! model on it, and a micro-batch's windows — the types the step, the
//! head and the gradient accumulator share, kept below all three so that
//! they name each other one way only (step → head → grads).

use burn::backend::Autodiff;

use crate::exec::Cpu;
use crate::model::llama::Llama;

/// The autodiff backend over `B` (Burn's CPU backend unless named).
pub type Ad<B = Cpu> = Autodiff<B>;
/// The model under training on `B`.
pub type Model<B = Cpu> = Llama<Ad<B>>;

/// `b` windows of `seqlen` inputs and their next tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct MicroBatch {
    pub inputs: Vec<Vec<u32>>,
    pub targets: Vec<u32>,
}

impl MicroBatch {
    /// From windows of `seqlen + 1` tokens.
    pub fn from_windows(windows: &[Vec<u32>]) -> Self {
        Self {
            inputs: windows.iter().map(|w| w[..w.len() - 1].to_vec()).collect(),
            targets: windows
                .iter()
                .flat_map(|w| w[1..].iter().copied())
                .collect(),
        }
    }
    pub fn tokens(&self) -> usize {
        self.targets.len()
    }
}
