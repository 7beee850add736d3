//! The evaluation's device pool: its own phase (the head, and the layers
//! when they are streamed or kept), and the part of it that runs inside
//! the prune (`model::inline_eval`).

use super::super::device_pool::{self, Beside};
use super::super::{Arch, Phase, Workload};
use super::{Sizes, rope, rope_base};

/// The evaluation run inside the prune (`model::inline_eval`), where it
/// is: every window's hidden states held from the first layer on, a
/// forward of one evaluation batch after each layer's output pass (the
/// residual added in place, and the statistics gone by then), its pages in
/// the pool, and the rotary tables of every batch shape the two passes
/// ran (one set of tables: the prune's).
pub(super) struct Inline {
    pub(super) hidden_states: u64,
    pub(super) forward: u64,
    pub(super) pages: u64,
    pub(super) rope: u64,
}

pub(super) fn inline_eval(a: &Arch, w: &Workload, s: &Sizes, n: u64) -> Option<Inline> {
    if !super::super::prunemem::evaluates_inline(w) {
        return None;
    }
    let eval_batch = w.batch_size.min(w.eval_windows);
    let rows = super::super::prunemem::inline_rope_rows(w, n);
    Some(Inline {
        hidden_states: s.hidden_states(w.eval_windows),
        forward: evaluation_forward(s, eval_batch),
        pages: device_pool::forward(a, w, eval_batch, Beside::Nothing),
        rope: rope_base(a, w) + super::super::prunemem::rope_table_rows(a, w, rows),
    })
}

/// A layer's forward of one evaluation batch of `batch` windows: each
/// batch's hidden states are moved through the layers, held by nothing
/// else, so the residual stream is added in place.
pub(super) fn evaluation_forward(s: &Sizes, batch: u64) -> u64 {
    s.forward(batch * s.seqlen) - s.hidden_states(batch)
}

/// An evaluation on the device: the embedding table (and an untied head),
/// one layer (or the whole model), every window's hidden states, the rotary
/// tables, and the larger of a layer's forward and the head's logits chunk.
pub(super) fn eval_phase(
    a: &Arch,
    w: &Workload,
    s: &Sizes,
    name: &str,
    stages: [&str; 2],
    resident: bool,
) -> Phase {
    let eval_batch = w.batch_size.min(w.eval_windows);
    let embed = a.embedding_params() * s.c;
    let head = if a.tied { 0 } else { embed };
    // The tables on the device for the whole phase, and the head's table
    // uploaded after the layers (`embedding_rows`: the embedding reads only
    // the windows' rows on the host; before it, the embedding and an untied
    // head went up first).
    let (tables_always, at_head) = match (resident, w.embedding_rows) {
        (true, _) => (0, 0),
        (false, false) => (embed + head, 0),
        (false, true) => (0, embed),
    };
    let rows =
        (crate::model::perplexity::device_chunk_rows(a.vocab as usize) as u64).min(w.seqlen - 1);
    // The head runs after the last layer: the normed batch and its chunk
    // (each row's loss is one kernel over the chunk in its own dtype, with
    // no f32 copy: `Compute::row_nll`).
    let logits = s.hidden_states(eval_batch) + rows * a.vocab * s.c;
    // Streamed, the layer is gone by the time the head runs; kept on the
    // device, every layer stays and none is uploaded; run inside the
    // prune, only the head is left.
    let kept = w.kept_on_device && !resident && name == "eval";
    let inline = w.eval_inline && !resident && name == "eval";
    let forward = match inline {
        true => 0,
        false => evaluation_forward(s, eval_batch),
    };
    let streamed = if resident || kept || inline {
        0
    } else {
        a.layer_params() * s.c
    };
    let (layer, t_name, t) = if streamed + forward >= at_head + logits {
        (streamed, "activations", forward)
    } else {
        (0, "logits chunk", logits)
    };
    let (weights_name, weights) = match (resident, t_name) {
        (true, _) => ("weights (resident)", a.params * s.c),
        (false, "logits chunk") => ("embeddings and head", tables_always + at_head),
        (false, _) => ("embeddings and head", tables_always),
    };
    let always = if resident { weights } else { tables_always };
    let kept_bytes = if kept {
        a.layers * a.layer_params() * s.c
    } else {
        0
    };
    // Inline, the prune's rotary tables went with it.
    let tables = match inline {
        true => 0,
        false => rope(a, w, eval_batch, w.eval_windows),
    };
    // Reserved: the layers' pass (every window's hidden states, a layer,
    // a forward's pages) or the head's after the pool is emptied (the
    // batches still waiting, the head's pages).
    let base = always + kept_bytes + tables;
    let layers_pass = match inline {
        true => 0,
        false => {
            base + s.hidden_states(w.eval_windows)
                + streamed
                + device_pool::forward(a, w, eval_batch, Beside::Nothing)
        }
    };
    let reserved = layers_pass.max(
        base + at_head
            + s.hidden_states(w.eval_windows - eval_batch)
            + device_pool::head(a, w, eval_batch, rows),
    );
    Phase::new(name, &stages)
        .add(weights_name, weights)
        .add("weights (pruned layers kept)", kept_bytes)
        .add("weights (one layer)", layer)
        .add(
            "hidden states",
            match (resident, t_name) {
                (true, "logits chunk") => 0,
                (true, _) => s.hidden_states(eval_batch),
                // At the head, the first batch has been normed (counted in
                // the logits) and the rest wait.
                (false, "logits chunk") => s.hidden_states(w.eval_windows - eval_batch),
                (false, _) => s.hidden_states(w.eval_windows),
            },
        )
        .add("rotary tables", tables)
        .add(t_name, t)
        .reserving(reserved)
}
