"""The table of a `scripts/bench/cuda.sh OUTDIR` run: for every run in
OUTDIR (prunemem's `RUN.json` from `prune --json`, the reference's from
run_reference.py or run_gradprobe_reference.py), prune and evaluation
seconds, wall seconds, the mean GPU utilisation nvidia-smi reported while
the step ran (sampled every 200 ms into RUN.util.csv), nvidia-smi's
memory.used peak above its lowest reading in the step, and each tool's own
device figures. Prints a markdown table, then each reference/prunemem ratio.

    python3 scripts/bench/cuda_table.py OUTDIR
"""
import datetime
import glob
import json
import os
import sys


def load_json(path):
    try:
        with open(path) as f:
            lines = [l for l in f.read().splitlines() if l.strip().startswith("{")]
        return json.loads(lines[-1]) if lines else None
    except (OSError, ValueError):
        return None


def samples(path):
    """(unix seconds, utilisation %) of every nvidia-smi sample."""
    out = []
    try:
        with open(path) as f:
            for line in f:
                parts = [p.strip() for p in line.split(",")]
                try:
                    t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                    out.append((t, float(parts[1])))
                except (ValueError, IndexError):
                    pass
    except OSError:
        pass
    return out


def pass_window(out, name, j):
    """The seconds (unix) the pruning and evaluation passes ran: prunemem's
    from its log's stage snapshots (before pruning → after the evaluation);
    the reference's as its last prune + eval seconds before the step ended."""
    events = os.path.join(out, name, "events.jsonl")
    if os.path.exists(events):
        marks = {}
        for line in open(events):
            e = json.loads(line)
            if e.get("event") == "stage":
                s = e["snapshot"]
                marks[s["label"]] = s["unix_ms"] / 1000
        start = marks.get("03_before_pruning") or marks.get("gp_01_initial")
        end = marks.get("06_after_eval") or marks.get("04_after_pruning")
        return (start, end) if start and end else None
    try:
        end = float(open(os.path.join(out, name + ".end")).read())
    except (OSError, ValueError):
        return None
    secs = (j.get("prune_seconds") or 0) + (j.get("eval_seconds") or 0)
    return (end - secs - 1.0, end) if secs else None


def util_during(out, name, j):
    w = pass_window(out, name, j)
    if not w:
        return None
    inside = [u for t, u in samples(os.path.join(out, name + ".util.csv")) if w[0] <= t <= w[1]]
    return sum(inside) / len(inside) if inside else None


def util(path):
    """Mean utilisation (%) and memory.used rise (MiB) over the samples."""
    rows = []
    try:
        with open(path) as f:
            for line in f:
                parts = [p.strip() for p in line.split(",")]
                if len(parts) >= 3:
                    try:
                        rows.append((float(parts[1]), float(parts[2])))
                    except ValueError:
                        pass
    except OSError:
        return None, None, 0
    if not rows:
        return None, None, 0
    mean = sum(u for u, _ in rows) / len(rows)
    # Above the lowest reading of the step: the card as the step found it
    # (a killed predecessor's memory may still be going when it starts).
    rise = max(m for _, m in rows) - min(m for _, m in rows)
    return mean, rise, len(rows)


def gib(b):
    return None if b is None else b / 2**30


def fmt(v, spec="{:.2f}"):
    return "—" if v is None else spec.format(v)


def main(out):
    rows = {}
    for path in sorted(glob.glob(os.path.join(out, "*.json"))):
        name = os.path.basename(path)[:-5]
        if name.endswith(".estimate"):
            continue
        j = load_json(path)
        if j is None:
            continue
        mean, rise, n = util(os.path.join(out, name + ".util.csv"))
        # run_reference.py's "reference", run_gradprobe_reference.py's
        # "gradprobe-reference": torch.cuda's figures.
        ref = str(j.get("tool", "")).endswith("reference")
        reserved = j.get("max_memory_reserved") if ref else j.get("device_reserved_peak")
        in_use = j.get("max_memory_allocated") if ref else j.get("device_peak")
        rows[name] = {
            "prune": j.get("prune_seconds"),
            "eval": j.get("eval_seconds"),
            "wall": j.get("wall_seconds"),
            "util": mean,
            "util_passes": util_during(out, name, j),
            "smi_rise": rise,
            "samples": n,
            "in_use": gib(in_use),
            "reserved": gib(reserved),
            "ppl": j.get("perplexity"),
            "kept": j.get("pruned_layers_kept"),
            "transfers": j.get("transfers"),
            "work": j.get("seconds_by_work"),
            "kernels": j.get("device_kernels"),
            # prunemem's own NVML readings (10 a second), by phase.
            "busy": (j.get("gpu_util") or {}).get("by_phase"),
        }
    print("| run | prune s | eval s | wall s | GPU util % over the step (samples) | GPU util % during the passes | "
          "nvidia-smi rise GiB | in use peak GiB | reserved peak GiB | pruned layers kept |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        rise = None if r["smi_rise"] is None else r["smi_rise"] / 1024
        print(f"| {name} | {fmt(r['prune'])} | {fmt(r['eval'])} | {fmt(r['wall'])} | "
              f"{fmt(r['util'], '{:.1f}')} ({r['samples']}) | {fmt(r['util_passes'], '{:.1f}')} | {fmt(rise)} | "
              f"{fmt(r['in_use'])} | {fmt(r['reserved'])} | {r['kept'] or '—'} |")
    for name, r in rows.items():
        if name.startswith("ref-"):
            continue
        ref = rows.get("ref-" + name.removesuffix("-warm"))
        if not ref:
            continue
        for k in ("prune", "eval", "wall"):
            if r[k] and ref[k]:
                print(f"{name} {k}: prunemem / reference = {r[k] / ref[k]:.2f}x")
        if r["smi_rise"] and ref["smi_rise"]:
            print(f"{name} nvidia-smi rise: prunemem / reference = {r['smi_rise'] / ref['smi_rise']:.2f}x")
    for name, r in rows.items():
        if r["transfers"]:
            print(f"{name} transfers: {json.dumps(r['transfers'])}")
            # A cold run's compiles against a warm run's cache loads.
            counts = [sum(p.get(k) or 0 for p in r["transfers"].values()) for k in ("compiled", "from_cache")]
            print(f"{name} kernels compiled / loaded from the cache: {counts[0]} / {counts[1]}")
        # Where the computing thread waited on the host (upload,
        # waiting_for_reader) beside the device's work, and which of
        # prunemem's paths ran or handed back (pinned_upload included).
        if r["work"]:
            print(f"{name} seconds_by_work: {json.dumps(r['work'])}")
        if r["kernels"]:
            print(f"{name} device_kernels: {json.dumps(r['kernels'])}")
        # The GPU busy in each phase, as the run's own NVML readings say
        # (beside nvidia-smi's over the step and during the passes above).
        if r["busy"]:
            phases = ", ".join(f"{p} {v['mean_percent']:.0f}% ({v['samples']})" for p, v in r["busy"].items())
            print(f"{name} gpu_util by phase: {phases}")


if __name__ == "__main__":
    main(sys.argv[1])
