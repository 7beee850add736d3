//! Whether a streamed prune's evaluation runs inside it
//! (`model::inline_eval`), as the run decides it: which workloads can, and
//! which do by the run's own rule where the memory is unknown.

use super::{Arch, Engine, Task, Workload, prunemem};

impl Workload {
    /// Whether the evaluation can run inside the prune: a streamed prune
    /// by one of prunemem's layer-by-layer methods, with windows to
    /// evaluate (`--keep-pruned inline` asks for it).
    pub fn can_evaluate_inline(&self) -> bool {
        // GradProbe's step 6 hands its decoder layers to the evaluation
        // (`jobs::gradprobe`), not with its embeddings probed.
        let layers_only = match self.task {
            Task::GradProbe => !self.include_embeddings,
            _ => prunemem::method(self).is_some(),
        };
        self.engine == Engine::Prunemem && layers_only && !self.resident && self.eval_windows > 0
    }

    /// Whether a streamed prune of this workload evaluates inside the
    /// prune by the run's own rule where the memory is unknown
    /// (`kept::Place::choose` on a device, `choose_on_host` on the CPU):
    /// where it can, when the windows' hidden states are no larger than
    /// the decoder layers.
    pub fn inline_by_default(&self, a: &Arch) -> bool {
        use crate::model::kept::Place;
        let bytes = |factors: [u64; 4]| factors.into_iter().fold(1u64, u64::saturating_mul);
        let c = self.dtype.size();
        let states = bytes([self.eval_windows, self.seqlen, a.hidden, c]);
        let layers = bytes([a.layers, a.layer_params(), c, 1]);
        let place = match self.device.is_gpu() {
            true => Place::choose(layers, Some(states), 0, None, None),
            false => Place::choose_on_host(layers, states, 0, None),
        };
        self.can_evaluate_inline() && place == Place::Inline
    }
}
