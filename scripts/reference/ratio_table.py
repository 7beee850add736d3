"""Prints the side-by-side table of scripts/reference/bench_all.sh's JSON
lines: per configuration and round, the reference's and prunemem's prune
seconds and their ratio (prunemem / reference; the targets are <= 0.9 for
Wanda and SparseGPT, <= 1.0 for GradProbe), evaluation throughput (40 x 512
tokens over the evaluation's seconds; target >= 1.0x), perplexity and peak
RSS.

    python scripts/reference/ratio_table.py OUT.jsonl
"""
import json
import sys


def main(path):
    runs = {}
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        if "config" not in r:
            continue
        runs.setdefault((r["config"], r.get("round", 1)), {})[r["tool"]] = r
    print("| config | round | reference prune s | prunemem prune s | ratio | "
          "eval tok/s (ref / prunemem) | eval ratio | perplexity (ref / prunemem) | "
          "peak RSS MB (ref / prunemem) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (config, rnd), pair in runs.items():
        ref, ours = pair.get("reference"), pair.get("prunemem")
        if not ref or not ours:
            continue
        rs, ps = ref["prune_seconds"], ours["prune_seconds"]
        tps = [tokens_per_s(x) for x in (ref, ours)]
        eval_ratio = f"{tps[1] / tps[0]:.2f}x" if None not in tps else "-"
        ppl = [x.get("perplexity") for x in (ref, ours)]
        print(f"| {config} | {rnd} | {rs:.1f} | {ps:.1f} | {ps / rs:.2f}x | "
              f"{fmt(tps[0], 0)} / {fmt(tps[1], 0)} | {eval_ratio} | "
              f"{fmt(ppl[0], 4)} / {fmt(ppl[1], 4)} | "
              f"{ref['rss_peak'] / 1e6:.0f} / {ours['rss_peak'] / 1e6:.0f} |")


def tokens_per_s(r):
    if not r.get("eval_seconds") or not r.get("eval_windows"):
        return None
    seqlen = r.get("eval_seqlen") or r.get("seqlen", 512)
    return r["eval_windows"] * seqlen / r["eval_seconds"]


def fmt(v, digits):
    return "-" if v is None else f"{v:.{digits}f}"


if __name__ == "__main__":
    main(sys.argv[1])
