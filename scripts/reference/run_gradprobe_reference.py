"""Runs GradProbe's own pruner (dcifrian/GradProbe, gradprobe/pruner.py,
unmodified) on the CPU or a CUDA GPU (--device) under the configuration of
the prunemem GradProbe benchmark, logs memory at its stages in the Python memory_log.csv format
that `prunemem report` reads, saves the pruned model (Hugging Face layout)
and its final masks, and prints one JSON line.

    python scripts/reference/run_gradprobe_reference.py --gradprobe-repo PATH \
        --model models/smollm2-135m --calib-text wiki.test.raw --calib-lines second-half \
        --seqlen 128 --num-batches 2 --sparsity 0.1 --gradient-threshold 2.0 \
        --out /tmp/gradprobe-ref [--strategy magnitude] [--include-embeddings] \
        [--device cuda] [--no-save]

On CUDA the model is moved to the GPU and the pruner given device="cuda",
its other settings left at their defaults (its gradients are kept on the
host, as its own code does); the CSV's GPU columns and the JSON's
max_memory_allocated / max_memory_reserved are torch.cuda's, and the prune
seconds end after a synchronize. --no-save skips writing the pruned model
and masks (a 1B shape's f32 model is 5 GB), as a timed benchmark wants.

Calibration windows are cut like its examples/prune_hf_llm.py
(`prepare_calibration_data`: seqlen+1 consecutive tokens every seqlen/2,
batch size 1), which is what `prunemem prune --method gradprobe` does. The
reference prunes every parameter of two or more dimensions; without
--include-embeddings the embeddings are frozen (requires_grad=False), so its
strategy and gradients cover the decoder linears only, like prunemem's
default. Evaluate the saved model with `prunemem eval` for the same
perplexity protocol.
"""
import argparse
import csv
import json
import os
import sys
import threading
import time

import torch

# Same line selection and /proc reading as the Wanda reference runner.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_reference import rss_kib, select  # noqa: E402


class Log:
    """memory_log.csv rows at named stages, plus a 20 Hz RSS sampler."""

    def __init__(self, path):
        self.f = open(path, "w", newline="")
        self.w = csv.writer(self.f)
        self.w.writerow(["Timestamp", "Checkpoint", "GPU_Allocated_GB", "GPU_Reserved_GB",
                         "GPU_Peak_GB", "CPU_Used_GB", "CPU_Percent"])
        self.t0 = time.time()
        self.peak = 0
        self.done = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self):
        while not self.done.is_set():
            self.peak = max(self.peak, rss_kib("VmRSS:"))
            time.sleep(0.05)

    def stage(self, name):
        rss = rss_kib("VmRSS:")
        self.peak = max(self.peak, rss)
        gpu = [0, 0, 0]
        if torch.cuda.is_initialized():
            gpu = [torch.cuda.memory_allocated() / 2**30, torch.cuda.memory_reserved() / 2**30,
                   torch.cuda.max_memory_allocated() / 2**30]
        self.w.writerow([f"{time.time() - self.t0:.3f}", name, *gpu, rss / 2**20, ""])
        self.f.flush()
        print(f"[{time.time() - self.t0:7.1f}s] {name:36s} RSS {rss / 1024:8.1f} MiB", file=sys.stderr)


def import_gradprobe():
    """GradProbe's classes. Its strategies import psutil only to log their
    own memory (Process().memory_info().rss / .vms); a machine without
    psutil and without a network (the lent GPU's) gets a stand-in reading
    /proc while GradProbe is imported, so the reference's code runs
    unmodified. The stand-in leaves sys.modules afterwards, so no other
    library takes it for psutil."""
    try:
        import psutil  # noqa: F401
        stand_in = None
    except ImportError:
        import importlib.machinery
        import types

        class Info:
            def __init__(self):
                self.rss = rss_kib("VmRSS:") * 1024
                self.vms = rss_kib("VmSize:") * 1024

        class Process:
            def memory_info(self):
                return Info()

        stand_in = types.ModuleType("psutil")
        stand_in.__spec__ = importlib.machinery.ModuleSpec("psutil", None)
        stand_in.Process = Process
        sys.modules["psutil"] = stand_in
    try:
        from gradprobe import GradProbe
        from gradprobe.strategies.magnitude import MagnitudePruning
        from gradprobe.strategies.wanda import WANDAPruning
    finally:
        if stand_in is not None:
            del sys.modules["psutil"]
    return GradProbe, MagnitudePruning, WANDAPruning


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gradprobe-repo", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--calib-text", required=True)
    ap.add_argument("--calib-lines", default="all")
    ap.add_argument("--seqlen", type=int, default=128)
    ap.add_argument("--num-batches", type=int, default=2)
    ap.add_argument("--sparsity", type=float, default=0.1)
    ap.add_argument("--reduction-factor", type=float, default=0.1)
    ap.add_argument("--gradient-threshold", type=float, default=2.0)
    ap.add_argument("--strategy", default="magnitude")
    ap.add_argument("--include-embeddings", action="store_true")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--no-save", action="store_true")
    a = ap.parse_args()
    t_start = time.time()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("run_gradprobe_reference: --device cuda, but torch finds no CUDA device")
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(os.cpu_count() or 1)

    log = Log(os.path.join(a.out, "memory_log.csv"))
    log.stage("00_initial")
    sys.path.insert(0, os.path.abspath(a.gradprobe_repo))
    GradProbe, MagnitudePruning, WANDAPruning = import_gradprobe()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(a.model)
    if not a.include_embeddings:
        model.get_input_embeddings().weight.requires_grad_(False)
    log.stage("01_model_loaded")

    text = select(open(a.calib_text, encoding="utf-8", newline="").read(), a.calib_lines)
    ids = tok(text, return_tensors="pt").input_ids
    stride = a.seqlen // 2
    inputs, targets = [], []
    for i in range(0, ids.shape[1] - a.seqlen - 1, stride):
        inputs.append(ids[:, i:i + a.seqlen])
        targets.append(ids[:, i + 1:i + a.seqlen + 1])
        if len(inputs) == a.num_batches:
            break
    data = torch.utils.data.TensorDataset(torch.cat(inputs), torch.cat(targets))
    loader = torch.utils.data.DataLoader(data, batch_size=1, shuffle=False)
    log.stage("02_data_prepared")

    def loss_fn(outputs, tgt):
        logits = outputs.logits if hasattr(outputs, "logits") else outputs
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1))

    strategy = MagnitudePruning() if a.strategy == "magnitude" else WANDAPruning(loader, num_batches=a.num_batches)
    pruner = GradProbe(model, strategy, device=a.device)
    sync()
    log.stage("03_model_on_device")

    # Stage rows at the reference's own profiling stages.
    def after(obj, name, stage):
        fn = getattr(obj, name)

        def wrapped(*args, **kw):
            out = fn(*args, **kw)
            log.stage(stage)
            return out
        setattr(obj, name, wrapped)

    calls = {"n": 0}
    grads = pruner._compute_gradients

    def compute(*args, **kw):
        out = grads(*args, **kw)
        calls["n"] += 1
        log.stage("08_original_gradients_computed" if calls["n"] == 1 else "14_modified_gradients_computed")
        return out
    pruner._compute_gradients = compute
    after(strategy, "select_weights_to_prune", "09_tentative_masks_created")
    after(pruner, "_apply_tentative_reduction", "10_weights_reduced")
    after(pruner, "_compare_gradients_and_decide", "15_final_masks_computed")
    after(pruner, "_apply_final_pruning", "16_final_pruning_applied")

    t0 = time.time()
    masks = pruner.prune(loader, loss_fn, sparsity=a.sparsity, num_batches=a.num_batches,
                         reduction_factor=a.reduction_factor,
                         gradient_threshold=a.gradient_threshold, verbose=False)
    sync()
    seconds = time.time() - t0
    peak = max(log.peak, rss_kib("VmHWM:"))
    log.done.set()

    if not a.no_save:
        model.save_pretrained(os.path.join(a.out, "model"), safe_serialization=True)
        tok.save_pretrained(os.path.join(a.out, "model"))
        from safetensors.torch import save_file
        save_file({k: v.to(torch.uint8).contiguous() for k, v in masks.items() if v.any()},
                  os.path.join(a.out, "masks.safetensors"))
    linears = [n for n, p in model.named_parameters() if p.dim() >= 2 and "layers." in n]
    zeros = sum(int((dict(model.named_parameters())[n] == 0).sum()) for n in linears)
    total = sum(dict(model.named_parameters())[n].numel() for n in linears)
    params = sum(p.numel() for p in model.parameters())
    result = {
        "tool": "gradprobe-reference", "strategy": a.strategy, "sparsity_target": a.sparsity,
        "decoder_sparsity": zeros / total, "pruned": int(sum(int(m.sum()) for m in masks.values())),
        "prune_seconds": seconds, "rss_peak": peak * 1024, "fp32_model_bytes": params * 4,
        "peak_over_model": peak * 1024 / (params * 4), "include_embeddings": a.include_embeddings,
        "device": a.device,
    }
    if a.device == "cuda":
        result["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        result["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    result["wall_seconds"] = time.time() - t_start
    print(json.dumps(result))


if __name__ == "__main__":
    main()
