#!/usr/bin/env bash
# Runs the pruning benchmark (examples/bench_prune.rs protocol) for prunemem
# (streaming and --resident) and for the Wanda authors' code
# (scripts/reference/run_reference.py), interleaved, appending JSON lines to
# OUT. Needs a release build of the example, the model, the text, a Python
# with torch + transformers, and a checkout of locuslab/wanda.
#
#   WANDA_REPO=/path/to/wanda PYTHON=/path/to/python scripts/reference/bench_all.sh OUT.jsonl
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-reports/bench/prune.jsonl}
mkdir -p "$(dirname "$OUT")"
TEXT=${PRUNEMEM_TEXT:-../shared/data/wikitext-2-raw/wiki.test.raw}
MODEL=${PRUNEMEM_MODEL:-models/smollm2-135m}
PY=${PYTHON:-python3}
BENCH=target/release/examples/bench_prune
# Also needs target/release/prunemem (cargo build --release) for the reference eval.
for cfg in "wanda unstructured" "wanda 2:4" "magnitude unstructured" "sparsegpt unstructured"; do
  set -- $cfg
  echo "== $1 $2" >&2
  $BENCH "$1" "$2" | sed 's/^{/{"tool":"prunemem","mode":"streaming",/' >> "$OUT"
  $BENCH "$1" "$2" --resident | sed 's/^{/{"tool":"prunemem","mode":"resident",/' >> "$OUT"
  "$PY" scripts/reference/run_reference.py --wanda-repo "$WANDA_REPO" --model "$MODEL" --method "$1" \
    --sparsity 0.5 --sparsity-type "$2" --nsamples 32 --seqlen 512 --seed 0 \
    --calib-text "$TEXT" --calib-lines second-half --eval-text "$TEXT" --eval-lines first-half \
    --eval-windows 40 --threads 2 2>/dev/null | tail -n 1 >> "$OUT"
done
# GradProbe: its profiling configuration, prunemem and the reference pruner
# (GRADPROBE_REPO: a checkout of dcifrian/GradProbe), with and without
# embeddings.
for emb in "" "--include-embeddings"; do
  echo "== gradprobe $emb" >&2
  $BENCH gradprobe - $emb | sed 's/^{/{"tool":"prunemem","mode":"streaming",/' >> "$OUT"
  if [[ -n "${GRADPROBE_REPO:-}" ]]; then
    REF_OUT=$(mktemp -d)
    "$PY" scripts/reference/run_gradprobe_reference.py --gradprobe-repo "$GRADPROBE_REPO" --model "$MODEL" \
      --calib-text "$TEXT" --calib-lines second-half $emb --out "$REF_OUT" 2>/dev/null | tail -n 1 >> "$OUT"
    target/release/prunemem eval --model "$REF_OUT/model" --text "$TEXT" --lines first-half --seqlen 128 \
      --windows 40 --json 2>/dev/null | sed 's/^{/{"tool":"gradprobe-reference-eval",/' >> "$OUT"
    rm -rf "$REF_OUT"
  fi
done
echo "results in $OUT" >&2
