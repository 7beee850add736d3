#!/usr/bin/env bash
# The own engine's estimates checked on the build users run: the canonical
# SmolLM2-135M runs (Wanda and SparseGPT with the benchmark protocol,
# evaluation alone, GradProbe as docs/pruning.md runs it, training on the
# 2-layer cut) on a release binary, one at a time, each followed by
# `prunemem estimate --against`. Prints each phase and the whole run,
# predicted / measured peak RSS; exits 1 when a run's peak is off by more
# than 5%. Appends each run's `estimate --against --json` (plus "run") to OUT.
#
#   cargo build --release --features wgpu,mpi
#   scripts/bench/release_estimates.sh reports/bench/release_estimates.jsonl
#
# CI (.ci/run) runs RUNS="wanda train-cut" EVAL_WINDOWS=8 on a
# default-features release build after the test suite (the debug build's
# estimates are checked by tests/estimate.rs and tests/estimate_train.rs).
# PRUNEMEM overrides the binary; RUNS picks runs (default: all five);
# EVAL_WINDOWS the pruning runs' evaluation windows (default: 40, the
# benchmark protocol's).
set -euo pipefail
# shellcheck source=scripts/bench/env.sh
source "$(dirname "$0")/env.sh" reports/bench/release_estimates.jsonl "$@"
BIN=${PRUNEMEM:-target/release/prunemem}
RUNS=${RUNS:-wanda sparsegpt eval gradprobe train-cut}
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
PROTOCOL=(--nsamples 32 --seqlen 512 --calib-text "$TEXT" --calib-lines second-half
          --eval-text "$TEXT" --eval-lines first-half --eval-windows "${EVAL_WINDOWS:-40}")

args_of() {
  case $1 in
    wanda|sparsegpt) echo prune --model "$MODEL" --method "$1" "${PROTOCOL[@]}" ;;
    eval) echo eval --model "$MODEL" --text "$TEXT" --lines first-half --seqlen 512 --windows 40 ;;
    gradprobe) echo prune --model "$MODEL" --method gradprobe --sparsity 0.1 --gradient-threshold 2.0 \
      --num-batches 2 --seqlen 128 --calib-text "$TEXT" --calib-lines second-half \
      --eval-text "$TEXT" --eval-lines first-half --eval-windows 40 ;;
    train-cut) echo train --model "$LOGS/cut" --text "$TEXT" --lines second-half --optimizer adamw \
      --batch-size 2 --grad-accum 2 --seqlen 64 --steps 6 ;;
    *) echo "release_estimates: unknown run $1" >&2; exit 2 ;;
  esac
}

# The 2-layer cut: the model's files, its config with two layers.
mkdir -p "$LOGS/cut"
ln -s "$PWD/$MODEL/model.safetensors" "$PWD/$MODEL/tokenizer.json" "$LOGS/cut/"
"$PY" -c 'import json, sys; c = json.load(open(sys.argv[1])); c["num_hidden_layers"] = 2
json.dump(c, open(sys.argv[2], "w"))' "$MODEL/config.json" "$LOGS/cut/config.json"

for run in $RUNS; do args_of "$run" > /dev/null; done  # unknown names before any run
# The binary's pages out of the page cache (written back first), so that the
# runs map it as a binary read back from disk does: one just written (a
# build, the wheel's install) maps more of itself (tests/support/grid.rs,
# `settle`). Best effort where dd lacks GNU's nocache flag.
sync "$BIN" 2>/dev/null || true
dd if="$BIN" iflag=nocache count=0 status=none 2>/dev/null || true
for run in $RUNS; do
  echo "== $run" >&2
  # shellcheck disable=SC2046  # the arguments hold no spaces
  "$BIN" $(args_of "$run") --log-memory "$LOGS/$run" --ui none > /dev/null
  "$BIN" estimate --against "$LOGS/$run" --json | sed "s/^{/{\"run\":\"$run\",/" >> "$OUT"
done

"$PY" - "$OUT" $RUNS <<'EOF'
import json, sys
out, runs = sys.argv[1], sys.argv[2:]
rows = {}
for line in open(out):
    if line.strip():
        r = json.loads(line)
        rows[r["run"]] = r  # the latest line of each run
mib = lambda b: f"{b / 2**20:.1f}"
failed = []
print(f"{'run':<10} {'phase':<22} {'predicted MiB':>14} {'measured MiB':>13} {'error':>8}")
for run in runs:
    r = rows[run]
    for p in r["phases"] + [r["peak"]]:
        print(f"{run:<10} {p['phase']:<22} {mib(p['predicted']):>14} {mib(p['measured']):>13} {p['error_percent']:>+7.1f}%")
    if abs(r["peak"]["error_percent"]) > 5:
        failed.append(run)
if failed:
    sys.exit(f"release_estimates: peak off by more than 5%: {' '.join(failed)}")
print("every run's peak within 5%")
EOF
