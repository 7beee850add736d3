#!/usr/bin/env bash
# Traces the reference scripts' CUDA memory (trace_peak.py) on the grid the
# estimator is checked against, and writes one JSON object per line to
# tests/fixtures/reference_traces.jsonl (`cargo test` reads it, no Python).
#
#   WANDA_REPO=PATH_TO_WANDA GRADPROBE_REPO=PATH_TO_GRADPROBE \
#     scripts/reference/trace_grid.sh [OUT]
#
# SparseGPT runs with --tensors meta (the same counts as fake tensors, about
# six times faster through its per-column loop; checked on SmolLM2 in
# docs/estimator.md). Wanda, magnitude and GradProbe use fake tensors.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-tests/fixtures/reference_traces.jsonl}
: "${WANDA_REPO:?set WANDA_REPO to a checkout of locuslab/wanda}"
shapes=${SHAPES:-llama-3.2-1b llama-3.2-3b llama-2-7b mistral-7b llama-3.1-8b llama-2-13b llama-2-70b}
tmp=$(mktemp)
trace() {
  python3 scripts/reference/trace_peak.py --wanda-repo "$WANDA_REPO" --json "$@" 2>/dev/null \
    | tail -n 1 >>"$tmp"
  echo "traced: $* -> $(tail -n 1 "$tmp" | grep -o '"peak_allocated_bytes": [0-9]*')" >&2
}
for s in $shapes; do
  c=profiles/models/$s.json
  trace --config "$c" --method magnitude --nsamples 128 --seqlen 2048
  trace --config "$c" --method wanda --nsamples 128 --seqlen 2048
  trace --config "$c" --method wanda --nsamples 32 --seqlen 4096
  trace --config "$c" --method wanda --nsamples 128 --seqlen 2048 --sparsity-type 2:4
  trace --config "$c" --method sparsegpt --nsamples 128 --seqlen 2048 --tensors meta
  trace --config "$c" --method sparsegpt --nsamples 32 --seqlen 4096 --tensors meta
  trace --config "$c" --method sparsegpt --nsamples 128 --seqlen 2048 --sparsity-type 2:4 --tensors meta
done
# GradProbe's reference runs in float32 (its benchmark: 2 windows of 128
# tokens, 10% tentative, magnitude strategy); the small shapes only, and on
# the CPU: its backward on a faked CUDA device stops in the autograd
# engine, which asks the CUDA driver for the device's context.
: "${GRADPROBE_REPO:?set GRADPROBE_REPO to a checkout of dcifrian/GradProbe}"
for s in ${GRADPROBE_SHAPES-smollm2-135m llama-3.2-1b}; do
  c=profiles/models/$s.json
  for extra in "" "--include-embeddings"; do
    trace --config "$c" --method gradprobe --nsamples 2 --seqlen 128 --sparsity 0.1 \
      --dtype float32 --device cpu --gradprobe-repo "$GRADPROBE_REPO" $extra
  done
  trace --config "$c" --method gradprobe --nsamples 4 --seqlen 512 --sparsity 0.1 \
    --dtype float32 --device cpu --gradprobe-repo "$GRADPROBE_REPO"
done
mv "$tmp" "$out"
echo "wrote $(wc -l <"$out") traces to $out" >&2
