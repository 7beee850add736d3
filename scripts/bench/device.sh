#!/usr/bin/env bash
# Wanda and SparseGPT on SmolLM2-135M on the CPU backend and on --device wgpu,
# one run at a time, with the benchmark protocol's text split (calibration
# windows from the second half of wiki.test.raw, evaluation windows from the
# first half). Prints, per run: prune seconds, device peak (cubecl's pool,
# bytes in use), host RSS peak, perplexity; appends each run's --json line
# (plus "run") to OUT. Needs a release build with the wgpu feature:
#
#   cargo build --release --features wgpu
#   scripts/bench/device.sh reports/bench/device.jsonl
#
# The benchmark protocol is 32 calibration windows and 40 evaluation windows
# of 512 tokens; on Mesa's lavapipe (a Vulkan device that runs on the CPU,
# about 8 GFLOP/s) that is about half an hour per run, so NSAMPLES,
# EVAL_WINDOWS and SEQLEN override it. DEVICE picks the device (default wgpu).
set -euo pipefail
# shellcheck source=scripts/bench/env.sh
source "$(dirname "$0")/env.sh" reports/bench/device.jsonl "$@"
BIN=${PRUNEMEM:-target/release/prunemem}
NSAMPLES=${NSAMPLES:-32}
EVAL_WINDOWS=${EVAL_WINDOWS:-40}
SEQLEN=${SEQLEN:-512}
DEVICE=${DEVICE:-wgpu}
DTYPE=${DTYPE:-f32}
COMMON=(--model "$MODEL" --nsamples "$NSAMPLES" --seqlen "$SEQLEN" --calib-text "$TEXT"
        --calib-lines second-half --eval-text "$TEXT" --eval-lines first-half
        --eval-windows "$EVAL_WINDOWS" --dtype "$DTYPE" --ui none --json)
for method in wanda sparsegpt; do
  for device in cpu "$DEVICE"; do
    name="$method-$device"
    echo "== $name" >&2
    "$BIN" prune "${COMMON[@]}" --method "$method" --device "$device" \
      | sed "s/^{/{\"run\":\"$name\",/" >> "$OUT"
  done
done
"$PY" - "$OUT" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
mib = lambda b: "n/a" if b is None else f"{b / 2**20:.1f} MiB"
print(f"{'run':<18} {'prune s':>8} {'eval s':>8} {'device peak':>12} {'RSS peak':>11} {'perplexity':>11}")
for r in rows:
    res = {**r, **r.get("results", {})}
    dev = res.get("device_peak") if str(res.get("device", "cpu")) != "cpu" else None
    print(f"{r['run']:<18} {res.get('prune_seconds', float('nan')):>8.1f} "
          f"{res.get('eval_seconds', float('nan')):>8.1f} {mib(dev):>12} "
          f"{mib(res.get('rss_peak')):>11} {res.get('perplexity', float('nan')):>11.4f}")
EOF
