#!/usr/bin/env bash
# Side-by-side benchmark (issue 17): prunemem (examples/bench_prune.rs
# protocol) against the Wanda authors' code (scripts/reference/run_reference.py)
# for Wanda unstructured, Wanda 2:4, SparseGPT and magnitude, and against
# GradProbe's own pruner for its profiling configuration. Runs one at a time,
# alternating which tool goes first in each round, appends JSON lines to OUT
# and prints the ratio table (scripts/reference/ratio_table.py).
#
#   WANDA_REPO=/path/to/wanda GRADPROBE_REPO=/path/to/GradProbe PYTHON=python3 \
#     ROUNDS=2 scripts/reference/bench_all.sh OUT.jsonl
#
# Needs `cargo build --release --examples --bins`, the model
# (scripts/fetch-smollm2.sh), the text, and a Python with torch +
# transformers. FROM_ROUND=2 ROUNDS=2 runs only the second round (the
# reference first) to add to an earlier OUT. CONFIGS narrows the run
# ("wanda:unstructured wanda:2:4
# sparsegpt:unstructured magnitude:unstructured gradprobe gradprobe-emb").
set -euo pipefail
# shellcheck source=scripts/bench/env.sh
source "$(dirname "$0")/../bench/env.sh" reports/bench/prune.jsonl "$@"
ROUNDS=${ROUNDS:-1}
FROM_ROUND=${FROM_ROUND:-1}
BENCH=target/release/examples/bench_prune
CONFIGS=${CONFIGS:-"wanda:unstructured wanda:2:4 sparsegpt:unstructured magnitude:unstructured gradprobe gradprobe-emb"}
: "${WANDA_REPO:?set WANDA_REPO to a checkout of locuslab/wanda}"

tagged() { sed "s/^{/{\"tool\":\"$1\",\"config\":\"$2\",\"round\":$3,/"; }
# A reference script's last line, its own "tool" key replaced by the tags.
reference_line() { tail -n 1 | sed 's/"tool": *"[^"]*", *//' | tagged reference "$1" "$2"; }

prunemem_run() { # config round
  case $1 in
    gradprobe) $BENCH gradprobe - ;;
    gradprobe-emb) $BENCH gradprobe - --include-embeddings ;;
    *) $BENCH "${1%%:*}" "${1#*:}" ;;
  esac | tail -n 1 | tagged prunemem "$1" "$2" >> "$OUT"
}

reference_run() { # config round
  case $1 in
    gradprobe | gradprobe-emb)
      [[ -n "${GRADPROBE_REPO:-}" ]] || return 0
      local emb="" dir
      [[ $1 == gradprobe-emb ]] && emb=--include-embeddings
      dir=$(mktemp -d)
      "$PY" scripts/reference/run_gradprobe_reference.py --gradprobe-repo "$GRADPROBE_REPO" \
        --model "$MODEL" --calib-text "$TEXT" --calib-lines second-half $emb --out "$dir" \
        2>/dev/null | reference_line "$1" "$2" >> "$OUT"
      rm -rf "$dir" ;;
    *)
      "$PY" scripts/reference/run_reference.py --wanda-repo "$WANDA_REPO" --model "$MODEL" \
        --method "${1%%:*}" --sparsity 0.5 --sparsity-type "${1#*:}" --nsamples 32 --seqlen 512 \
        --seed 0 --calib-text "$TEXT" --calib-lines second-half --eval-text "$TEXT" \
        --eval-lines first-half --eval-windows 40 --threads 2 2>/dev/null \
        | reference_line "$1" "$2" >> "$OUT" ;;
  esac
}

for round in $(seq "$FROM_ROUND" "$ROUNDS"); do
  for cfg in $CONFIGS; do
    echo "== round $round: $cfg" >&2
    if (( round % 2 == 1 )); then
      prunemem_run "$cfg" "$round"; reference_run "$cfg" "$round"
    else
      reference_run "$cfg" "$round"; prunemem_run "$cfg" "$round"
    fi
  done
done
"$PY" scripts/reference/ratio_table.py "$OUT"
