"""Checks the fake-tensor trace against a real GPU: each case runs
`trace_peak.py` twice, once as the fixtures are made (fake or meta tensors
on a faked device, no GPU) and once on the real CUDA device with random
weights of the same shape (`--tensors real`), where PyTorch's caching
allocator reports `max_memory_allocated` itself.

    python scripts/reference/cuda_check.py --wanda-repo WANDA \
        --gradprobe-repo GRADPROBE --out reference_cuda.jsonl [--cases a,b]

The fake runs use the CPU only, so they run beside the real ones (`--jobs`
at a time). Writes one JSON object per case (`case`, `args`, `fake`, `real`)
and prints a table: traced peak, the real run's counter, the allocator's
`max_memory_allocated` and `max_memory_reserved`, and the memory the
process held outside the allocator (the CUDA context). The committed result
is `tests/fixtures/reference_cuda.jsonl` (2026-11-24, H100: the first
twelve cases of one call, whose 70B SparseGPT fake run passed its time
limit, and smollm2-gradprobe from a second call with per-op readings),
which `cargo test --test reference_traces` checks the estimator against.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
M = os.path.join(HERE, "..", "..", "profiles", "models")

# name: (config, extra trace_peak.py arguments). SparseGPT's fake runs use
# meta tensors, as trace_grid.sh does; 70B's whole model does not fit one
# 80 GiB GPU, so both runs build it with 8 layers (the traced layers and the
# vocabulary are the real ones).
CASES = {
    "1b-wanda": ("llama-3.2-1b", ["--method", "wanda", "--nsamples", "128", "--seqlen", "2048"]),
    "1b-sparsegpt": ("llama-3.2-1b", ["--method", "sparsegpt", "--nsamples", "128", "--seqlen", "2048"]),
    "1b-magnitude": ("llama-3.2-1b", ["--method", "magnitude", "--nsamples", "128", "--seqlen", "2048"]),
    "7b-wanda": ("llama-2-7b", ["--method", "wanda", "--nsamples", "128", "--seqlen", "2048"]),
    "7b-wanda-2:4": ("llama-2-7b", ["--method", "wanda", "--nsamples", "128", "--seqlen", "2048",
                                    "--sparsity-type", "2:4"]),
    "7b-sparsegpt": ("llama-2-7b", ["--method", "sparsegpt", "--nsamples", "128", "--seqlen", "2048"]),
    "7b-magnitude": ("llama-2-7b", ["--method", "magnitude", "--nsamples", "128", "--seqlen", "2048"]),
    "mistral-sparsegpt-2:4": ("mistral-7b", ["--method", "sparsegpt", "--nsamples", "128",
                                             "--seqlen", "2048", "--sparsity-type", "2:4"]),
    "8b-wanda-32x4096": ("llama-3.1-8b", ["--method", "wanda", "--nsamples", "32", "--seqlen", "4096"]),
    "8b-sparsegpt-32x4096": ("llama-3.1-8b", ["--method", "sparsegpt", "--nsamples", "32",
                                              "--seqlen", "4096"]),
    "13b-wanda": ("llama-2-13b", ["--method", "wanda", "--nsamples", "128", "--seqlen", "2048"]),
    "70b8l-wanda": ("llama-2-70b", ["--method", "wanda", "--nsamples", "128", "--seqlen", "2048",
                                    "--layers", "8"]),
    "70b8l-sparsegpt": ("llama-2-70b", ["--method", "sparsegpt", "--nsamples", "128", "--seqlen", "2048",
                                        "--layers", "8"]),
    "smollm2-gradprobe": ("smollm2-135m", ["--method", "gradprobe", "--nsamples", "2", "--seqlen", "128",
                                           "--sparsity", "0.1", "--dtype", "float32"]),
    "1b-gradprobe": ("llama-3.2-1b", ["--method", "gradprobe", "--nsamples", "2", "--seqlen", "128",
                                      "--sparsity", "0.1", "--dtype", "float32"]),
}


def run(args, timeout):
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, os.path.join(HERE, "trace_peak.py"), "--json"] + args,
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over {timeout} s", "seconds": time.time() - t0}
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip().splitlines()[-3:], "seconds": time.time() - t0}
    return json.loads(p.stdout.strip().splitlines()[-1])


def gib(b):
    return f"{b / 2**30:.2f}" if isinstance(b, (int, float)) else "-"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wanda-repo", default=os.environ.get("WANDA_REPO"), required=False)
    ap.add_argument("--gradprobe-repo", default=os.environ.get("GRADPROBE_REPO"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", help="comma-separated case names (default: all)")
    ap.add_argument("--jobs", type=int, default=6, help="fake runs at a time")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per real run")
    ap.add_argument("--fake-timeout", type=int, default=900, help="seconds per fake run")
    ap.add_argument("--real-only", action="store_true", help="skip the fake runs")
    a = ap.parse_args()
    names = a.cases.split(",") if a.cases else list(CASES)
    repos = ["--wanda-repo", a.wanda_repo or ""]
    if a.gradprobe_repo:
        repos += ["--gradprobe-repo", a.gradprobe_repo]
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(a.jobs) as pool:
        for n in names:
            cfg, extra = CASES[n]
            base = ["--config", os.path.join(M, cfg + ".json")] + extra + repos
            fake = ["--tensors", "meta"] if "sparsegpt" in extra else []
            jobs[n] = (base, None if a.real_only else pool.submit(run, base + fake, a.fake_timeout))
        results = []
        with open(a.out, "w") as out:
            for n in names:
                base, fake = jobs[n]
                real = run(base + ["--tensors", "real"], a.timeout)
                row = {"case": n, "args": base, "real": real, "fake": fake.result() if fake else {}}
                results.append(row)
                out.write(json.dumps(row) + "\n")
                out.flush()
                print(f"{n}: real {gib(real.get('cuda', {}).get('max_memory_allocated'))} GiB "
                      f"({real.get('seconds', '-')} s) {real.get('error', '')}", file=sys.stderr)
    print("| case | traced (fake) | real counter | max_memory_allocated | trace error | phase "
          "(fake / real) | max_memory_reserved | outside allocator |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        f, x = r["fake"], r["real"]
        c = x.get("cuda", {})
        alloc = c.get("max_memory_allocated")
        fp = f.get("peak_allocated_bytes")
        err = f"{(fp / alloc - 1) * 100:+.1f}%" if fp and alloc else "-"
        print(f"| {r['case']} | {gib(fp)} | {gib(x.get('peak_allocated_bytes'))} | {gib(alloc)} | {err} "
              f"| {f.get('peak_phase', f.get('error'))} / {c.get('peak_phase', x.get('error'))} "
              f"| {gib(c.get('max_memory_reserved'))} | {gib(c.get('outside_allocator_at_end'))} |")


if __name__ == "__main__":
    main()
