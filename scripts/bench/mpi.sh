#!/usr/bin/env bash
# Wanda and SparseGPT on SmolLM2-135M as one process and across MPI ranks
# (`mpirun -np RANKS`, default 2), one run at a time, with the benchmark
# protocol's text split (calibration windows from the second half of
# wiki.test.raw, evaluation windows from the first half). Prints, per run:
# wall seconds, prune seconds, each rank's peak RSS, bytes each rank moved
# in reductions per layer and the seconds it spent in them, perplexity;
# appends each run's --json line (plus "run") to OUT. Needs a build with
# the mpi feature and OpenMPI's mpirun:
#
#   cargo build --release --features mpi
#   scripts/bench/mpi.sh reports/bench/mpi.jsonl
#
# NSAMPLES (32), SEQLEN (512), EVAL_WINDOWS (40), BATCH (8) and RANKS
# override the protocol. On a machine with fewer cores than ranks the ranks
# share cores: the wall time then says nothing about scaling.
set -euo pipefail
# shellcheck source=scripts/bench/env.sh
source "$(dirname "$0")/env.sh" reports/bench/mpi.jsonl "$@"
BIN=${PRUNEMEM:-target/release/prunemem}
NSAMPLES=${NSAMPLES:-32}
EVAL_WINDOWS=${EVAL_WINDOWS:-40}
SEQLEN=${SEQLEN:-512}
BATCH=${BATCH:-8}
RANKS=${RANKS:-2}
COMMON=(--model "$MODEL" --nsamples "$NSAMPLES" --seqlen "$SEQLEN" --batch-size "$BATCH"
        --calib-text "$TEXT" --calib-lines second-half --eval-text "$TEXT" --eval-lines first-half
        --eval-windows "$EVAL_WINDOWS" --ui none --json)
for method in wanda sparsegpt; do
  for ranks in 1 "$RANKS"; do
    name="$method-$ranks-rank"
    echo "== $name" >&2
    start=$(date +%s.%N)
    if [ "$ranks" = 1 ]; then
      line=$("$BIN" prune "${COMMON[@]}" --method "$method" | tail -1)
    else
      line=$(mpirun -np "$ranks" --oversubscribe --allow-run-as-root \
        "$BIN" prune "${COMMON[@]}" --method "$method" | tail -1)
    fi
    wall=$(echo "$(date +%s.%N) - $start" | bc)
    echo "$line" | sed "s/^{/{\"run\":\"$name\",\"wall_s\":$wall,/" >> "$OUT"
  done
done
"$PY" - "$OUT" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
mib = lambda b: f"{b / 2**20:.1f}"
print(f"{'run':<18} {'wall s':>7} {'prune s':>8} {'RSS peak per rank (MiB)':>24} "
      f"{'reduced/layer':>14} {'in reductions s':>16} {'perplexity':>11}")
for r in rows:
    res = {**r, **r.get("results", {})}
    ranks = res.get("ranks") or {}
    peaks = ranks.get("rss_peaks") or [res.get("rss_peak")]
    layers = res.get("layers") or 1
    moved = ranks.get("reduced_bytes")
    per_layer = "—" if not moved else " / ".join(f"{b / layers / 2**20:.2f} MiB" for b in moved)
    waits = ranks.get("reduction_seconds")
    wait = "—" if not waits else " / ".join(f"{s:.2f}" for s in waits)
    print(f"{r['run']:<18} {r['wall_s']:>7.1f} {res.get('prune_seconds', float('nan')):>8.1f} "
          f"{' / '.join(mib(p) for p in peaks if p):>24} {per_layer:>14} {wait:>16} "
          f"{res.get('perplexity', float('nan')):>11.4f}")
PYEOF
