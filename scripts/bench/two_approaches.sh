#!/usr/bin/env bash
# Two approaches to one job, compared (issue 44): the Wanda authors' code,
# watched by prunemem with the probe's `Memory Checkpoint` blocks at
# prunemem's stage names (`run_reference.py --memory-checkpoints`), beside
# `prunemem prune` with the same protocol; then `prunemem report compare`.
#
#   scripts/bench/two_approaches.sh reports/two-approaches
#
# Needs the reference venv (torch, transformers) and the authors' checkout
# (WANDA_REPO, default .gpu/wanda: git clone https://github.com/locuslab/wanda).
# PRUNEMEM overrides the binary (default: target/release/prunemem);
# NSAMPLES / SEQLEN / EVAL_WINDOWS the protocol (default 32 / 512 / 8).
set -euo pipefail
# shellcheck source=scripts/bench/env.sh
source "$(dirname "$0")/env.sh" reports/two-approaches/x "$@"
OUT=${1:-reports/two-approaches}
BIN=${PRUNEMEM:-target/release/prunemem}
WANDA_REPO=${WANDA_REPO:-.gpu/wanda}
PROTOCOL=(--nsamples "${NSAMPLES:-32}" --seqlen "${SEQLEN:-512}" --calib-text "$TEXT"
          --calib-lines second-half --eval-text "$TEXT" --eval-lines first-half
          --eval-windows "${EVAL_WINDOWS:-8}")
rm -rf "$OUT/reference" "$OUT/prunemem" "$OUT/compare"
mkdir -p "$OUT"
echo "== the authors' Wanda, watched" >&2
/usr/bin/time -f "reference wall %e s" "$BIN" watch --ui none --sample-hz 20 \
  --log-memory "$OUT/reference" -- \
  "$PY" scripts/reference/run_reference.py --wanda-repo "$WANDA_REPO" --model "$MODEL" \
  --method wanda "${PROTOCOL[@]}" --threads 2 --memory-checkpoints | tail -1 >"$OUT/reference.json"
echo "== prunemem prune" >&2
/usr/bin/time -f "prunemem wall %e s" "$BIN" prune --model "$MODEL" --method wanda \
  "${PROTOCOL[@]}" --ui none --sample-hz 20 --log-memory "$OUT/prunemem" --json | tail -1 >"$OUT/prunemem.json"
"$BIN" report compare "$OUT/reference" "$OUT/prunemem" --label reference --label prunemem \
  --out "$OUT/compare"
echo "$OUT/compare/compare.md" >&2
