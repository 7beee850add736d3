//! The CPU engine's evaluation phase: the streamed layers, the windows'
//! hidden states and, after the layers, the head's table and its logits
//! chunk (or the resident model), in `prunemem`'s terms; the head's alone
//! when the layers ran inside the prune (`model::inline_eval`).

use super::{LOGIT_CHUNK_ELEMS, Shape, compute_workspace, forward, load_transient, rope_tables};
use crate::estimate::{Arch, Phase, Workload};

/// An evaluation phase: weights (resident, or the layer streamed with the
/// embeddings and head), the hidden states of every window, rotary tables,
/// and the largest of a layer's forward, a layer's load and a logits chunk
/// (streamed, the logits come without a layer).
pub(super) fn eval_phase(
    a: &Arch,
    w: &Workload,
    sh: &Shape,
    name: &str,
    stages: &[&str],
    resident: bool,
    text: u64,
) -> Phase {
    let c = w.dtype.size();
    let eval_batch = w.batch_size.min(w.eval_windows);
    let embed = a.embedding_params() * c;
    let head = if a.tied { 0 } else { embed };
    // The tables held for the whole phase, and the head's table that
    // arrives after the layers (`embedding_rows`: the embedding reads only
    // the windows' rows).
    let (tables, at_head) = match (resident, w.embedding_rows) {
        (true, _) => (0, 0),
        (false, false) => (embed + head, 0),
        (false, true) => (0, embed),
    };
    let logits = logits_chunk(a, w);
    // Streamed, a batch's residual input is one of the hidden states
    // already counted (the batches go through a layer one after the other,
    // each output replacing its input); resident, the windows' hidden
    // states are not held apart.
    let tokens = eval_batch * w.seqlen;
    let residual = if resident { 0 } else { tokens * a.hidden * c };
    let (t_name, t) = [
        ("activations", forward(a, tokens) - residual),
        ("load transient", load_transient(a, w)),
        ("text and tokens", text),
    ]
    .into_iter()
    .max_by_key(|(_, b)| *b)
    .unwrap_or(("activations", 0));
    // Streamed, the head's logits run after the last layer is freed
    // (`model::perplexity`'s `Run::streamed`): the phase peaks either at a
    // layer (its weights and the largest of its transients) or at the head
    // (a logits chunk, no layer). Resident, the weights are there for both.
    let layer = match resident {
        true => ("weights (resident)", a.params * c),
        false => ("weights (one layer)", a.layer_params() * c),
    };
    // The layers ran inside the prune (`model::inline_eval`): the head is
    // the phase.
    let inline = super::evaluates_inline(w) && !resident && name == "eval";
    // At the head, the larger of a logits chunk and the head's load: an
    // untied head is a linear, loaded as a layer's are (its stored bytes
    // and its transposed copy beside it: 60 MiB of weights for a 20 MiB
    // f32 head at sparsegpt-eval-h640-l3's evaluation peak, 2026-11-29).
    let head_load = head_load(a, w, resident);
    let head = match head_load > logits {
        true => ("head load transient", head_load),
        false => ("logits chunk", logits),
    };
    let ((weights_name, weights), (t_name, t), at_the_head) = if resident {
        let t = if logits > t {
            ("logits chunk", logits)
        } else {
            (t_name, t)
        };
        (layer, t, false)
    } else if inline || at_head + head.1 > layer.1 + t {
        (("weights (one layer)", 0), head, true)
    } else {
        (layer, (t_name, t), false)
    };
    let at_head = if at_the_head { at_head } else { 0 };
    sh.base(Phase::new(name, stages))
        .add(weights_name, weights)
        .add("embeddings and head", tables + at_head)
        .add(
            "hidden states",
            if resident {
                0
            } else {
                w.eval_windows * w.seqlen * a.hidden * c
            },
        )
        .add(
            "rotary tables",
            rope_tables(a, w, eval_batch, w.eval_windows),
        )
        .add("compute workspace", compute_workspace(w))
        .add(t_name, t)
}

/// A chunk's f32 logits twice (the tensor and the host vector
/// `window_nll` reads it into: 2 × 31.9 MiB measured on SmolLM2, `eval
/// --seqlen 512`, 2026-11-25), and in a 16-bit dtype the chunk before its
/// cast.
fn logits_chunk(a: &Arch, w: &Workload) -> u64 {
    let chunk = LOGIT_CHUNK_ELEMS.min(w.seqlen * a.vocab);
    chunk * 8
        + if w.dtype.size() == 4 {
            0
        } else {
            chunk * w.dtype.size()
        }
}

/// An untied head read from the checkpoint after the layers (streamed,
/// with `embedding_rows`): a linear, loaded as a layer's are, its stored
/// bytes and its transposed copy beside it.
fn head_load(a: &Arch, w: &Workload, resident: bool) -> u64 {
    match !a.tied && w.embedding_rows && !resident {
        true => a.embedding_params() * (w.stored_bytes + w.dtype.size()),
        false => 0,
    }
}

/// The evaluation inside a prune (`model::inline_eval`): the layers ran in
/// the prune, and the evaluation trims before its head, so its phase is the
/// head alone, with only what the head step frees in the allocator's cache
/// (`memory::mapping`): its load transient, and each batch's hidden states
/// once their normed copy replaces them. Both stay cached beside the logits
/// chunks, within the room the heap's high-water mark (`high`, the phases
/// before) leaves. Measured on sparsegpt-eval-h640-l3 (2026-12-07): 59.8 MiB
/// cached beside 52.5 MiB live while the logits ran (the 40 MiB load
/// transient, a 7.5 MiB batch, a 12 MiB logits copy); the phase had been
/// estimated with the layers' cached blocks, which the trim gives back
/// (+13.6%).
pub(super) fn inline_eval_phase(
    a: &Arch,
    w: &Workload,
    sh: &Shape,
    stages: &[&str],
    high: u64,
) -> Phase {
    let p = eval_phase(a, w, sh, "eval", stages, false, 0);
    let batch = w.batch_size.min(w.eval_windows) * w.seqlen * a.hidden * w.dtype.size();
    let freed = head_load(a, w, false).min(logits_chunk(a, w)) + batch;
    let heap = super::heap(&p);
    p.add(
        "runtime: the head step's freed blocks (its load, each batch's input) cached beside the logits",
        freed.min(high.max(heap) - heap),
    )
}
