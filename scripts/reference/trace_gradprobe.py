"""GradProbe's own `GradProbe.prune()` (dcifrian/GradProbe, gradprobe/pruner.py,
unmodified, its default full-memory path) under trace_peak.py's counter.

Run through `trace_peak.py --method gradprobe --gradprobe-repo PATH`: the
model is built as there (fake tensors on the faked device, or real weights
on the CPU with `--real-model`), with the magnitude strategy, reduction
factor 0.1 and gradient threshold 2.0 of prunemem's GradProbe benchmark,
`--nsamples` batches of one `--seqlen` window, and the embeddings frozen
unless `--include-embeddings`. GradProbe keeps its gradient dictionaries and
masks on the CPU: on a CUDA trace they are outside the counted device, as
they are outside `memory_allocated` on a GPU.
"""
import os
import sys

import torch


def run(a, model, counter):
    if not a.gradprobe_repo:
        sys.exit("--gradprobe-repo (or GRADPROBE_REPO) must name a checkout of dcifrian/GradProbe")
    sys.path.insert(0, os.path.abspath(a.gradprobe_repo))
    from gradprobe import GradProbe
    from gradprobe.strategies.magnitude import MagnitudePruning

    if a.dtype != "float32":
        sys.exit("GradProbe's reference runs in float32: add --dtype float32")
    # GradProbe moves the model to its device; it is there already, and
    # fake parameters cannot be swapped by Module.to.
    model.to = lambda *args, **kw: model
    if not a.include_embeddings:
        model.get_input_embeddings().weight.requires_grad_(False)
    device = next(model.parameters()).device
    batches = [(torch.zeros((1, a.seqlen), dtype=torch.long),
                torch.zeros((1, a.seqlen), dtype=torch.long)) for _ in range(a.nsamples)]

    def loss_fn(outputs, tgt):
        logits = outputs.logits if hasattr(outputs, "logits") else outputs
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))

    strategy = MagnitudePruning()
    pruner = GradProbe(model, strategy, device=str(device) if device.type != "meta" else "meta")
    calls = {"n": 0}
    compute = pruner._compute_gradients

    def phased(*args, **kw):
        counter.enter("original gradients" if calls["n"] == 0 else "modified gradients")
        calls["n"] += 1
        return compute(*args, **kw)

    select = strategy.select_weights_to_prune

    def selecting(*args, **kw):
        counter.enter("select")
        return select(*args, **kw)

    decide = pruner._compare_gradients_and_decide

    def deciding(*args, **kw):
        counter.enter("decide")
        return decide(*args, **kw)

    pruner._compute_gradients = phased
    strategy.select_weights_to_prune = selecting
    pruner._compare_gradients_and_decide = deciding
    counter.enter("save original state")
    pruner.prune(batches, loss_fn, sparsity=a.sparsity, num_batches=a.nsamples,
                 reduction_factor=0.1, gradient_threshold=2.0, verbose=False)
