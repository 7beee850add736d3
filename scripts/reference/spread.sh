#!/usr/bin/env bash
# How far the reference's own perplexity moves when only the last bits of
# its arithmetic change (issue 17's 2:4 fidelity question). Runs the Wanda
# authors' code (scripts/reference/run_reference.py, the benchmark protocol)
# once per numerically equivalent setting of the same PyTorch build — thread
# count, MKL's instruction set, ATen's vector width, transformers' attention
# path — one at a time, then
# prunemem once, and prints each perplexity and its distance from the
# reference's default run and from the mean of the reference runs.
#
#   WANDA_REPO=/path/to/wanda CONFIG=wanda:2:4 scripts/reference/spread.sh OUT.jsonl
#
# None of these settings changes the algorithm: they change which kernels
# PyTorch and MKL pick, so sums are taken in a different order. A method
# whose result moves by more than a bound under them cannot be held to that
# bound against any single reference run. Needs what bench_all.sh needs.
set -euo pipefail
# shellcheck source=scripts/bench/env.sh
source "$(dirname "$0")/../bench/env.sh" reports/bench/spread.jsonl "$@"
CONFIG=${CONFIG:-wanda:2:4}
BENCH=target/release/examples/bench_prune
: "${WANDA_REPO:?set WANDA_REPO to a checkout of locuslab/wanda}"

# Space-separated variants, each name|environment|threads|attention; an
# environment of several variables joins them with commas.
VARIANTS=${VARIANTS:-"default||2|sdpa one-thread||1|sdpa mkl-avx2|MKL_ENABLE_INSTRUCTIONS=AVX2|2|sdpa \
aten-avx2|ATEN_CPU_CAPABILITY=avx2|2|sdpa aten-scalar|ATEN_CPU_CAPABILITY=default|2|sdpa \
eager||2|eager eager+aten-avx2|ATEN_CPU_CAPABILITY=avx2|2|eager"}

for v in $VARIANTS; do
  IFS='|' read -r name envs threads attn <<< "$v"
  envs=${envs//,/ }
  echo "== reference $CONFIG: $name" >&2
  # shellcheck disable=SC2086
  env $envs "$PY" scripts/reference/run_reference.py --wanda-repo "$WANDA_REPO" --model "$MODEL" \
    --method "${CONFIG%%:*}" --sparsity 0.5 --sparsity-type "${CONFIG#*:}" --nsamples 32 \
    --seqlen 512 --seed 0 --calib-text "$TEXT" --calib-lines second-half --eval-text "$TEXT" \
    --eval-lines first-half --eval-windows 40 --threads "$threads" \
    --attn-implementation "${attn:-sdpa}" 2>/dev/null | tail -n 1 \
    | sed "s/^{\"tool\": *\"[^\"]*\", */{\"tool\":\"reference\",\"variant\":\"$name\",/" >> "$OUT"
done
echo "== prunemem $CONFIG" >&2
$BENCH "${CONFIG%%:*}" "${CONFIG#*:}" | tail -n 1 \
  | sed 's/^{/{"tool":"prunemem","variant":"default",/' >> "$OUT"

"$PY" - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ref = [r for r in rows if r["tool"] == "reference"]
base = next((r["perplexity"] for r in ref if r["variant"] == "default"), None)
mean = statistics.mean(r["perplexity"] for r in ref) if ref else None
print(f"{'tool':10} {'variant':22} {'perplexity':>11} {'vs default':>11} {'vs ref mean':>12}")
for r in rows:
    p = r["perplexity"]
    d = f"{(p / base - 1) * 100:+.2f}%" if base else "-"
    m = f"{(p / mean - 1) * 100:+.2f}%" if mean else "-"
    print(f"{r['tool']:10} {r['variant']:22} {p:11.4f} {d:>11} {m:>12}")
if len(ref) > 1:
    ps = [r["perplexity"] for r in ref]
    print(f"reference: mean {mean:.4f}, min {min(ps):.4f}, max {max(ps):.4f}, "
          f"spread {(max(ps) / min(ps) - 1) * 100:.2f}%, sd {statistics.stdev(ps):.4f}")
EOF
