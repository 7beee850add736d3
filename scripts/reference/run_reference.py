"""Runs the Wanda authors' pruning code (locuslab/wanda, lib/prune.py, which
also carries SparseGPT's sparsegpt.py) on CPU under prunemem's benchmark
protocol, and prints one JSON line comparable to `prunemem prune --json`.

    python scripts/reference/run_reference.py --wanda-repo PATH_TO_WANDA_CHECKOUT \
        --model models/smollm2-135m --method wanda --sparsity 0.5 --sparsity-type unstructured \
        --nsamples 32 --seqlen 512 --seed 0 \
        --calib-text wiki.test.raw --calib-lines second-half \
        --eval-text wiki.test.raw --eval-lines first-half --eval-windows 40

With `--dsnot-repo PATH_TO_DSNOT_CHECKOUT --dsnot` it runs DSnoT's
`prune_DSnoT` (zyxxmu/DSnoT lib/prune.py) with `--method` as its initial
method and its defaults (50 cycles, threshold 0.1, skip mlp) instead.

The authors' code is imported from the checkout given, unmodified; the
shims in refshim.py only let it run on CPU with current transformers, and
`get_loaders` is replaced by the same calibration sampling on a local text
(`random.seed(seed)`, `randint(0, n - seqlen - 1)`, as their
`get_wikitext2`), so both tools see identical windows.
Perplexity uses prunemem's protocol (scripts/reference/eval_ppl.py).
"""
import argparse
import json
import math
import os
import random
import sys
import threading
import time
import types

import torch


def select(text, spec):
    lines = text.split("\n")
    lines = [l + "\n" for l in lines[:-1]] + ([lines[-1]] if lines[-1] else [])
    n = len(lines)
    if spec == "all":
        return text
    if spec == "first-half":
        return "".join(lines[: n // 2])
    if spec == "second-half":
        return "".join(lines[n // 2:])
    a, b = spec.split(":")
    return "".join(lines[int(a or 0): int(b) if b else n])


def rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--wanda-repo", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--method", default="wanda", choices=["wanda", "magnitude", "sparsegpt"])
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("--sparsity-type", default="unstructured")
    ap.add_argument("--nsamples", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calib-text", required=True)
    ap.add_argument("--calib-lines", default="all")
    ap.add_argument("--eval-text")
    ap.add_argument("--eval-lines", default="all")
    ap.add_argument("--eval-windows", type=int)
    ap.add_argument("--use-variant", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--attn-implementation", default="sdpa", choices=["sdpa", "eager"],
                    help="transformers' attention path (both compute the same softmax attention)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: the model in --dtype on the GPU, as the authors run it; the JSON adds "
                    "torch.cuda.max_memory_allocated / max_memory_reserved")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    ap.add_argument("--save-model")
    ap.add_argument("--memory-checkpoints", action="store_true",
                    help="print prunemem's Memory Checkpoint blocks at prunemem's stage names "
                         "(the probe: python/prunemem; for `prunemem watch` and `report compare`)")
    ap.add_argument("--dsnot", action="store_true")
    ap.add_argument("--dsnot-repo")
    a = ap.parse_args()
    if a.memory_checkpoints:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
        from prunemem import checkpoint
    else:
        def checkpoint(name):
            pass
    torch.set_num_threads(a.threads)
    t_start = time.time()

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    import refshim
    P = refshim.import_reference(a.dsnot_repo if a.dsnot else a.wanda_repo)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        a.model, dtype=getattr(torch, a.dtype), attn_implementation=a.attn_implementation).eval()
    device = torch.device(a.device)
    model.to(device)
    sync()
    refshim.prepare_model(model, a.seqlen)
    tok = AutoTokenizer.from_pretrained(a.model)
    t_loaded = time.time()
    rss_loaded = rss_kib("VmRSS:")
    checkpoint("02_model_loaded")

    def get_loaders(name, nsamples=128, seed=0, seqlen=2048, tokenizer=None):
        text = select(open(a.calib_text, encoding="utf-8", newline="").read(), a.calib_lines)
        enc = tokenizer(text, return_tensors="pt").input_ids
        seqlen = a.seqlen  # DSnoT asks for 2048 whatever the model's window
        random.seed(seed)
        loader = []
        for _ in range(nsamples):
            i = random.randint(0, enc.shape[1] - seqlen - 1)
            inp = enc[:, i:i + seqlen]
            tar = inp.clone()
            tar[:, :-1] = -100
            loader.append((inp, tar))
        return loader, None

    P.get_loaders = get_loaders
    args = types.SimpleNamespace(nsamples=a.nsamples, seed=a.seed, sparsity_ratio=a.sparsity,
                                 use_variant=a.use_variant, prune_method=a.method,
                                 initial_method=a.method, max_cycle_time=50, without_DSnoT=False,
                                 update_threshold=0.1, pow_of_var_regrowing=1.0, pow_of_var_pruning=1.0,
                                 skip_layer="mlp", skip_sub_layer="no_skip", without_same_sign=True,
                                 get_time_overhead=False)
    prune_n, prune_m = (0, 0) if a.sparsity_type == "unstructured" else map(int, a.sparsity_type.split(":"))

    # Sample RSS while pruning (VmHWM also counts model loading).
    peak = {"rss": 0}
    done = threading.Event()

    def sampler():
        while not done.is_set():
            peak["rss"] = max(peak["rss"], rss_kib("VmRSS:"))
            time.sleep(0.05)

    th = threading.Thread(target=sampler, daemon=True)
    th.start()
    if a.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    checkpoint("03_before_pruning")
    t0 = time.time()
    with torch.no_grad():
        if a.dsnot:
            P.prune_DSnoT(args, model, tok, device, prune_n=prune_n, prune_m=prune_m)
        elif a.method == "wanda":
            P.prune_wanda(args, model, tok, device, prune_n=prune_n, prune_m=prune_m)
        elif a.method == "magnitude":
            P.prune_magnitude(args, model, tok, device, prune_n=prune_n, prune_m=prune_m)
        else:
            P.prune_sparsegpt(args, model, tok, device, prune_n=prune_n, prune_m=prune_m)
    sync()
    prune_seconds = time.time() - t0
    checkpoint("04_after_pruning")
    done.set()
    th.join()
    prune_rss_peak = max(peak["rss"], rss_kib("VmRSS:"))
    sparsity = P.check_sparsity(model)

    result = {"tool": "reference", "method": a.method, "dsnot": a.dsnot, "type": a.sparsity_type, "sparsity_target": a.sparsity,
              "sparsity": sparsity, "prune_seconds": prune_seconds, "load_seconds": t_loaded - t_start,
              "rss_after_load": rss_loaded * 1024, "rss_peak_pruning": prune_rss_peak * 1024,
              "nsamples": a.nsamples, "seqlen": a.seqlen}
    if a.eval_text:
        text = select(open(a.eval_text, encoding="utf-8", newline="").read(), a.eval_lines)
        ids = tok(text, return_tensors="pt").input_ids
        n = ids.shape[1] // a.seqlen
        if a.eval_windows:
            n = min(n, a.eval_windows)
        checkpoint("05_before_eval")
        t = time.time()
        losses = []
        with torch.no_grad():
            for i in range(n):
                x = ids[:, i * a.seqlen:(i + 1) * a.seqlen].to(device)
                logits = model(x).logits
                losses.append(torch.nn.functional.cross_entropy(logits[0, :-1].float(), x[0, 1:]).item())
        result["perplexity"] = math.exp(sum(losses) / len(losses))
        result["eval_seconds"] = time.time() - t
        result["eval_windows"] = n
        checkpoint("06_after_eval")
    if a.save_model:
        model.save_pretrained(a.save_model)
        tok.save_pretrained(a.save_model)
    result["rss_peak"] = rss_kib("VmHWM:") * 1024
    if a.device == "cuda":
        result["device"] = torch.cuda.get_device_name()
        result["max_memory_allocated"] = torch.cuda.max_memory_allocated()
        result["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    result["wall_seconds"] = time.time() - t_start
    print(json.dumps(result))


if __name__ == "__main__":
    main()
