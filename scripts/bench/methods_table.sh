#!/usr/bin/env bash
# The README's method comparison on SmolLM2-135M (benchmark protocol:
# 32 calibration windows of 512 from the second half of wiki.test.raw, 40
# evaluation windows of 512 from the first half), one run at a time, each
# saved compressed to get its file size. Appends one JSON line per run to
# OUT (prunemem's --json line plus "run"). Needs a release build.
#
#   scripts/bench/methods_table.sh reports/bench/methods.jsonl
set -euo pipefail
# shellcheck source=scripts/bench/env.sh
source "$(dirname "$0")/env.sh" reports/bench/methods.jsonl "$@"
W=$TEXT
BIN=${PRUNEMEM:-target/release/prunemem}
SAVE=$(mktemp -d)/model
trap 'rm -rf "$(dirname "$SAVE")"' EXIT
COMMON=(--model "$MODEL" --nsamples 32 --seqlen 512 --calib-text "$W" --calib-lines second-half
        --eval-text "$W" --eval-lines first-half --eval-windows 40 --ui none --json
        --save "$SAVE" --save-format compressed)
run() {
  local name=$1; shift
  echo "== $name" >&2
  "$BIN" prune "${COMMON[@]}" "$@" | sed "s/^{/{\"run\":\"$name\",/" >> "$OUT"
}
"$BIN" eval --model "$MODEL" --text "$W" --lines first-half --seqlen 512 --windows 40 --ui none --json \
  | sed 's/^{/{"run":"dense",/' >> "$OUT"
for s in 0.5 0.7; do
  for m in magnitude wanda sparsegpt ria; do
    run "$m-$s" --method "$m" --sparsity "$s"
    run "$m-owl-$s" --method "$m" --sparsity "$s" --owl
  done
  run "wanda-dsnot-$s" --method wanda --sparsity "$s" --dsnot
  run "sparsegpt-dsnot-$s" --method sparsegpt --sparsity "$s" --dsnot
done
for m in magnitude wanda sparsegpt ria; do
  run "$m-2:4" --method "$m" --sparsity-type 2:4
done
run "wanda-dsnot-2:4" --method wanda --sparsity-type 2:4 --dsnot
