"""Traces the CUDA memory the reference pruning scripts allocate, without
weights and without a GPU.

The authors' own code runs unmodified (the Wanda repository's
`prune_wanda`, `prune_sparsegpt`, `prune_magnitude` and `eval_ppl_wikitext`,
with their `WrappedGPT` and `SparseGPT` classes) on a transformers model of
the real architecture whose tensors are PyTorch fake tensors on a faked
`cuda:0`: every op computes shapes, dtypes and strides, none computes values.
A dispatch mode above the fake mode counts live bytes on that device the way
the CUDA caching allocator's `memory_allocated` does: each storage rounded up
to its 512-byte block, freed when the storage dies.

    python scripts/reference/trace_peak.py --wanda-repo PATH_TO_WANDA \
        --config profiles/models/llama-2-7b.json --method wanda \
        --nsamples 128 --seqlen 2048 [--sparsity-type 2:4] --json

prints one JSON object: `peak_allocated_bytes`, the phase it happened in,
each phase's peak, and every place where a value was needed and had to be
assumed (`assumptions`).

Where values are needed:
- a boolean mask turned into indices (`W[mask] = 0` on a path that calls
  `nonzero`): the count of true entries is assumed to be the sparsity
  ratio's share (the masks are built to hold exactly that); masks from
  `== 0` on a Hessian diagonal (SparseGPT's dead columns) are assumed empty;
- `.item()` answers 0 (only the final perplexity and sparsity prints use it).

What it does not see (added by `prunemem estimate` as named constants,
measured on an H100 with `--tensors real`): the CUDA context, cuBLAS'
workspace, ops' own transient buffers (CUDA's row sort: 20 bytes per
element in Wanda), and the caching allocator's reserve above
`memory_allocated`. Blocks the allocator leaves unsplit (a cached
block used for a request up to 1 MiB smaller) are counted at the request's
size.

On a real GPU (`--tensors real --device cuda`) the same code runs on
random weights of the same shape (memory does not depend on the values),
the counter counts the real storages, and the JSON adds what the CUDA
caching allocator itself says (`cuda`): `torch.cuda.max_memory_allocated`
and `max_memory_reserved` per phase and overall, and the device memory the
process holds outside the allocator (the CUDA context) — the figures the
fake run is checked against (`scripts/reference/cuda_check.py`).

Layers: every layer of the model is built and resident, but the pruning
loop runs over the first `--trace-layers` (default 2): the layers have the
same shapes, so each one repeats the same allocations on the same live
set; the JSON gives each traced layer's peak so the repetition can be
checked (`layer_peaks`). `--trace-layers 0` runs them all.
"""
import argparse
import contextlib
import gc
import json
import os
import sys
import time
import types

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch._subclasses.fake_tensor import FakeTensorMode

BLOCK = 512
aten = torch.ops.aten
# The sibling helpers (refshim, trace_gradprobe) import from this folder.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def block_bytes(n):
    return 0 if n == 0 else -(-n // BLOCK) * BLOCK


class Counter(TorchDispatchMode):
    """Live bytes of cuda storages, as `memory_allocated` counts them.

    A storage's death is seen through a weak reference; checking every live
    storage after every op would dominate the run, so storages that survive
    a few ops move to an `old` set swept only when a new peak is about to be
    recorded (the total is then exact) or a phase starts."""

    YOUNG_OPS = 64

    def __init__(self, sparsity, device_type="cuda", real=False, blocks=True):
        super().__init__()
        self.blocks = blocks
        self.sparsity = sparsity
        self.device_type = device_type
        self.real = real
        self.at_peak = []
        self.op_name = "parameters"
        self.young = {}
        self.old = {}
        self.allocated = 0
        self.peak = 0
        self.peak_phase = None
        self.phase = "load"
        self.phase_peaks = {}
        self.layer = None
        self.layer_peaks = {}
        self.ops = 0
        self.assumptions = {}
        self.dead_masks = set()
        self.gpu = None  # CudaReadings on a real GPU

    # -- bookkeeping ---------------------------------------------------
    def track(self, t):
        if not isinstance(t, torch.Tensor) or t.device.type != self.device_type:
            return
        st = t.untyped_storage()
        key = st._cdata
        if key in self.young or key in self.old:
            return
        n = block_bytes(st.nbytes()) if self.blocks else st.nbytes()
        self.young[key] = (StorageWeakRef(st), n, self.ops, self.op_name)
        self.allocated += n

    def sweep(self, table):
        dead = []
        for key, entry in table.items():
            ref, n, born, _ = entry
            if ref.expired():
                dead.append(key)
                self.allocated -= n
            elif table is self.young and self.ops - born > self.YOUNG_OPS:
                self.old[key] = entry
                dead.append(key)
        for key in dead:
            del table[key]

    def full_sweep(self):
        self.sweep(self.young)
        self.sweep(self.old)

    def observe(self):
        self.sweep(self.young)
        if self.allocated > self.phase_peaks.get(self.phase, 0) or (
            self.layer is not None and self.allocated > self.layer_peaks.get(self.layer, 0)
        ):
            self.sweep(self.old)
            a = self.allocated
            if a > self.phase_peaks.get(self.phase, 0):
                self.phase_peaks[self.phase] = a
            if self.layer is not None and a > self.layer_peaks.get(self.layer, 0):
                self.layer_peaks[self.layer] = a
            if a > self.peak:
                self.peak, self.peak_phase = a, self.phase
                self.at_peak = self.live_by_op()

    def live_by_op(self):
        """Live bytes by the op that allocated them, largest first."""
        by = {}
        for table in (self.young, self.old):
            for _, n, _, op in table.values():
                c, b = by.get(op, (0, 0))
                by[op] = (c + 1, b + n)
        rows = sorted(by.items(), key=lambda kv: -kv[1][1])
        return [{"op": op, "tensors": c, "bytes": b} for op, (c, b) in rows]

    def enter(self, phase):
        if self.gpu:
            self.gpu.enter(phase)
        self.full_sweep()
        self.phase = phase
        self.phase_peaks.setdefault(phase, self.allocated)
        self.observe()

    def assume(self, what, detail):
        key = (what, detail)
        self.assumptions[key] = self.assumptions.get(key, 0) + 1

    # -- dispatch ------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        self.op_name = func.__name__
        if self.real:
            out = self.gpu.around(func, args, kwargs) if self.gpu else func(*args, **kwargs)
        elif func is aten._local_scalar_dense.default:
            self.assume(".item()", "answers 0")
            return 0
        else:
            out = self.fake_call(func, args, kwargs)
        for t in out if isinstance(out, (tuple, list)) else (out,):
            self.track(t)
        self.observe()
        return out

    def fake_call(self, func, args, kwargs):
        """Runs an op on fake tensors, giving value-dependent ops the index
        counts they would have had."""
        if func is aten.nonzero.default:
            return self.nonzero(args[0])
        if func is aten._to_copy.default and args[0].device.type == "meta" \
                and kwargs.get("device") not in (None, args[0].device):
            # `.cpu()` of a meta tensor (magnitude's threshold): a host copy
            # of the shape, outside the counted device.
            return torch.empty(args[0].shape, dtype=kwargs.get("dtype") or args[0].dtype,
                               device=kwargs["device"])
        if func in (aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default) \
                and any(i is not None and i.dtype == torch.bool for i in args[1]):
            return func(args[0], self.bool_indices(args[1]), *args[2:], **kwargs)
        if func is aten.index.Tensor and any(i is not None and i.dtype == torch.bool for i in args[1]):
            return func(args[0], self.bool_indices(args[1]))
        out = func(*args, **kwargs)
        if func is aten.eq.Scalar and args[1] == 0 and args[0].dim() == 1:
            self.dead_masks.add(out.untyped_storage()._cdata)
        return out

    def true_count(self, mask):
        if mask.untyped_storage()._cdata in self.dead_masks:
            self.assume("nonzero", "a '== 0' mask on a diagonal: assumed empty (no dead inputs)")
            return 0
        self.assume("nonzero", f"a mask: assumed {self.sparsity:g} of its entries true")
        return int(mask.numel() * self.sparsity)

    def nonzero(self, mask):
        k = self.true_count(mask)
        return torch.empty((k, mask.dim()), dtype=torch.long, device=mask.device)

    def bool_indices(self, indices):
        """Boolean indices as the long indices `nonzero` would give (the
        kernel path CUDA takes: `expandTensors` calls `nonzero`)."""
        out = []
        for i in indices:
            if i is not None and i.dtype == torch.bool:
                nz = self.nonzero(i)
                self.track(nz)
                self.observe()
                out.extend(nz.select(1, d) for d in range(i.dim()))
            else:
                out.append(i)
        return out


def flash_attention(counter):
    """`scaled_dot_product_attention` as CUDA runs it for f16/bf16 without a
    mask: the flash kernel (output and an f32 log-sum-exp, no score matrix).
    Fake CUDA tensors have no device to ask, and PyTorch's choice would fall
    back to the math path, which materialises the scores."""
    original = torch.nn.functional.scaled_dot_product_attention

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if attn_mask is None and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256:
            counter.assume("attention", "the flash kernel (CUDA's choice for f16/bf16 without a mask)")
            return torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, dropout_p, is_causal, scale=scale)[0]
        if q.dtype in (torch.float16, torch.bfloat16, torch.float32) and not enable_gqa \
                and k.shape[1] == q.shape[1]:
            # The memory-efficient kernel (CUDA's choice with a mask): a
            # boolean mask becomes an additive bias of the query's dtype first.
            counter.assume("attention", "the memory-efficient kernel (CUDA's choice with a mask or in f32)")
            bias = attn_mask
            if bias is not None and bias.dtype == torch.bool:
                bias = torch.where(bias, torch.zeros((), dtype=q.dtype, device=q.device),
                                   torch.full((), float("-inf"), dtype=q.dtype, device=q.device))
            if bias is not None:
                bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, bias, False, dropout_p, is_causal and bias is None, scale=scale)[0]
        counter.assume("attention", "PyTorch's math path")
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa)

    torch.nn.functional.scaled_dot_product_attention = sdpa


class CudaReadings:
    """What the CUDA caching allocator says during a real run, per phase of
    the counter, and the device memory the process holds outside the
    allocator. Around every op the allocator's peak is read and reset, so
    each op's transient allocations beyond its outputs (sort buffers, solver
    workspaces: what a trace of op outputs cannot see) are listed too."""

    def __init__(self):
        torch.cuda.init()
        torch.empty(0, device="cuda")  # the context, before any tensor
        self.context_at_start = self.outside_allocator()
        self.phase = None
        self.allocated = {}
        self.reserved = {}
        self.running = self.running_reserved = 0
        self.workspaces = {}

    @staticmethod
    def outside_allocator():
        free, total = torch.cuda.mem_get_info()
        return total - free - torch.cuda.memory_reserved()

    def built(self):
        # Random initialisation's temporaries are not part of a run that
        # loads weights: the statistics start from the resident model.
        self.build_peak = torch.cuda.max_memory_allocated()
        self.reset()

    def reset(self):
        torch.cuda.reset_peak_memory_stats()
        self.running = torch.cuda.memory_allocated()
        self.running_reserved = torch.cuda.memory_reserved()

    def fold_peaks(self):
        self.running = max(self.running, torch.cuda.max_memory_allocated())
        self.running_reserved = max(self.running_reserved, torch.cuda.max_memory_reserved())

    def around(self, func, args, kwargs):
        """Runs one op, noting its transient bytes (peak during the op above
        what is live before and after it)."""
        self.fold_peaks()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = func(*args, **kwargs)
        peak, after = torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()
        self.fold_peaks()
        transient = peak - max(before, after)
        if transient >= 1 << 20:
            inputs = [(tuple(t.shape), str(t.dtype).replace("torch.", "")) for t in args
                      if isinstance(t, torch.Tensor)]
            key = (func.__name__, str(inputs))
            if transient > self.workspaces.get(key, (0,))[0]:
                numel = max((t.numel() for t in args if isinstance(t, torch.Tensor)), default=0)
                self.workspaces[key] = (transient, numel)
        return out

    def close_phase(self):
        if self.phase is not None:
            self.fold_peaks()
            self.allocated[self.phase] = max(self.allocated.get(self.phase, 0), self.running)
            self.reserved[self.phase] = max(self.reserved.get(self.phase, 0), self.running_reserved)

    def enter(self, phase):
        self.close_phase()
        self.reset()
        self.phase = phase

    def finish(self, counter):
        self.close_phase()
        counter.full_sweep()
        peak_phase = max(self.allocated, key=self.allocated.get)
        rows = sorted(self.workspaces.items(), key=lambda kv: -kv[1][0])
        return {
            "device_name": torch.cuda.get_device_name(),
            "max_memory_allocated": max(self.allocated.values()),
            "max_memory_reserved": max(self.reserved.values()),
            "peak_phase": peak_phase,
            "phase_max_allocated": self.allocated,
            "phase_max_reserved": self.reserved,
            # Allocated now that no tensor of the run is alive beyond the
            # counter's own: the allocator's own blocks (cuBLAS workspaces).
            "allocated_outside_tensors": torch.cuda.memory_allocated() - counter.allocated,
            "outside_allocator_at_start": self.context_at_start,
            "outside_allocator_at_end": self.outside_allocator(),
            "build_peak": self.build_peak,
            "op_workspaces": [{"op": k[0], "inputs": k[1], "bytes": b, "largest_input_numel": n}
                              for k, (b, n) in rows[:24]],
            "cuda": torch.version.cuda,
        }


def rss_bytes(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return None


def load_config(path):
    from transformers import AutoConfig
    raw = json.load(open(path))
    clean = {k: v for k, v in raw.items() if not k.startswith("_")}
    kind = clean.pop("model_type", "llama")
    return raw.get("_name", os.path.basename(path)), AutoConfig.for_model(kind, **clean)


def build_model(config, dtype, device):
    from transformers import AutoModelForCausalLM
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="a config.json (profiles/models/*.json)")
    ap.add_argument("--method", required=True, choices=["wanda", "sparsegpt", "magnitude", "gradprobe"])
    ap.add_argument("--nsamples", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("--sparsity-type", default="unstructured")
    ap.add_argument("--eval-windows", type=int, default=2,
                    help="perplexity windows traced after pruning (0: none); each repeats the last")
    ap.add_argument("--trace-layers", type=int, default=2)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--wanda-repo", default=os.environ.get("WANDA_REPO"))
    ap.add_argument("--gradprobe-repo", default=os.environ.get("GRADPROBE_REPO"))
    ap.add_argument("--include-embeddings", action="store_true",
                    help="GradProbe: the embeddings get gradients and are pruned too")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="the device faked and counted (cpu: no 512-byte blocks)")
    ap.add_argument("--tensors", default="fake", choices=["fake", "meta", "real"],
                    help="fake: fake tensors on the faked device; meta: meta tensors counted "
                    "as that device (the same shapes, about 6x faster: for SparseGPT's column loop); "
                    "real: random weights on the real device (a CUDA GPU), checked by its allocator")
    ap.add_argument("--layers", type=int,
                    help="build the model with this many layers (a shape whose whole model does "
                    "not fit the GPU at hand; the traced layers are the same)")
    ap.add_argument("--real-model", help="a checkpoint directory: run on real weights on the CPU "
                    "with the same counter (checks the fake run; needs --device cpu)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.real_model and a.device != "cpu":
        sys.exit("--real-model runs on the CPU: add --device cpu")
    real_gpu = a.tensors == "real" and a.device == "cuda"
    if a.tensors == "real" and not (real_gpu or a.real_model):
        sys.exit("--tensors real needs --device cuda (a GPU) or --real-model on the CPU")
    if real_gpu and not torch.cuda.is_available():
        sys.exit("--tensors real --device cuda: PyTorch sees no CUDA device")
    torch.set_num_threads(2)
    # Reference cycles (the authors' Catcher class closes over a calibration
    # buffer) are freed only when Python's cyclic collector happens to run:
    # on real weights that buffer outlived pruning, while the fake run's
    # extra garbage triggered collections earlier. Without automatic
    # collection the trace is deterministic and matches the real run.
    gc.disable()
    t0 = time.time()
    name, config = load_config(a.config)
    if a.layers:
        config.num_hidden_layers = a.layers
        name = f"{name} ({a.layers} layers)"
    gpu = CudaReadings() if real_gpu else None
    dtype = getattr(torch, a.dtype)
    rss_imports = rss_bytes("VmRSS:")
    meta = a.tensors == "meta" and not a.real_model
    counter = Counter(a.sparsity, device_type="meta" if meta else a.device,
                      real=bool(a.real_model) or real_gpu, blocks=a.device == "cuda")
    fake = FakeTensorMode(allow_non_fake_inputs=True) if not (a.real_model or meta or real_gpu) \
        else contextlib.nullcontext()
    with fake:
        if a.real_model:
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained(
                a.real_model, dtype=dtype, attn_implementation="sdpa").eval()
        else:
            model = build_model(config, dtype, "meta" if meta else a.device)
        model.seqlen = a.seqlen
        model.hf_device_map = {}
        rss_loaded = rss_bytes("VmRSS:")
        if a.device == "cuda" and not real_gpu:
            flash_attention(counter)
        if gpu:
            gpu.built()
            counter.gpu = gpu
        with counter:
            for t in list(model.parameters()) + list(model.buffers()):
                counter.track(t)
            counter.enter("load")
            if a.method == "gradprobe":
                import trace_gradprobe
                trace_gradprobe.run(a, model, counter)
            else:
                trace_wanda_repo(a, model, counter)
    result = {
        "model": name, "method": a.method, "sparsity_type": a.sparsity_type,
        "sparsity": a.sparsity, "include_embeddings": a.include_embeddings,
        "eval_windows": a.eval_windows if a.method != "gradprobe" else 0,
        "nsamples": a.nsamples, "seqlen": a.seqlen, "dtype": a.dtype,
        "params": sum(p.numel() for p in model.parameters()),
        "peak_allocated_bytes": counter.peak, "peak_phase": counter.peak_phase,
        "phase_peaks": counter.phase_peaks, "at_peak": counter.at_peak[:8],
        "device": a.device, "tensors": "real" if a.real_model else a.tensors,
        "layer_peaks": [counter.layer_peaks[k] for k in sorted(counter.layer_peaks)],
        "traced_layers": len(counter.layer_peaks), "layers": config.num_hidden_layers,
        "ops": counter.ops, "seconds": round(time.time() - t0, 2),
        "assumptions": [{"op": k[0], "how": k[1], "calls": v} for k, v in counter.assumptions.items()],
        "torch": torch.__version__,
    }
    if gpu:
        result["cuda"] = gpu.finish(counter)
    if a.real_model:
        # Where the process's memory went, beside the counter's figure.
        result["rss"] = {"after_imports": rss_imports, "after_load": rss_loaded,
                         "peak": rss_bytes("VmHWM:")}
    import transformers
    result["transformers"] = transformers.__version__
    if a.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k}: {v}")


def trace_wanda_repo(a, model, counter):
    """The Wanda repository's prune_* and eval_ppl_wikitext on the fake model."""
    if not a.wanda_repo:
        sys.exit("--wanda-repo (or WANDA_REPO) must name a checkout of locuslab/wanda")
    import refshim
    P = refshim.import_reference(a.wanda_repo)
    import lib.eval as E
    refshim.prepare_model(model, a.seqlen)
    windows = [[0] * a.seqlen] * a.nsamples
    P.get_loaders = refshim.loader_from_windows(windows)
    layers_all = model.model.layers
    if a.trace_layers:
        model.model.layers = torch.nn.ModuleList(list(layers_all)[: a.trace_layers])
        model._prunemem_rest = list(layers_all)[a.trace_layers:]  # stay resident
    find_layers = P.find_layers
    seen = {"n": 0}

    def marking_find_layers(module, *rest, **kw):
        if module is not model and isinstance(module, type(layers_all[0])):
            counter.layer = seen["n"]
            seen["n"] += 1
            counter.enter("prune")
        return find_layers(module, *rest, **kw)

    P.find_layers = marking_find_layers
    args = types.SimpleNamespace(nsamples=a.nsamples, seed=0, sparsity_ratio=a.sparsity,
                                 use_variant=False, prune_method=a.method)
    n, m = (0, 0) if a.sparsity_type == "unstructured" else map(int, a.sparsity_type.split(":"))
    dev = next(model.parameters()).device
    counter.enter("calibration" if a.method != "magnitude" else "prune")
    with torch.no_grad():
        {"wanda": P.prune_wanda, "sparsegpt": P.prune_sparsegpt,
         "magnitude": P.prune_magnitude}[a.method](args, model, None, dev, prune_n=n, prune_m=m)
    counter.layer = None
    if a.eval_windows:
        model.model.layers = layers_all
        counter.enter("eval")
        ids = torch.zeros((1, a.seqlen * a.eval_windows), dtype=torch.long)
        with torch.no_grad():
            E.eval_ppl_wikitext(model, types.SimpleNamespace(input_ids=ids), 1, dev)


if __name__ == "__main__":
    main()
