#!/bin/bash
# Log-format compatibility check used for the jobs refactor: runs a set of
# deterministic commands (every prune method, GradProbe incl. --iterative,
# eval, snapshot) with the sampler off, so two binaries can be compared
# with compare.py (stage names, event kinds and order, results, CSV rows).
# Usage: capture.sh BIN OUTDIR MODEL_DIR TEXT
BIN=$1; OUT=$2; M=$3; T=$4
rm -rf $OUT; mkdir -p $OUT
common="--ui none --sample-hz 0"
$BIN prune --model $M --method wanda --sparsity 0.5 --nsamples 8 --seqlen 32 --calib-text $T --eval-text $T --eval-windows 4 --save $OUT/wanda-model --log-memory $OUT/wanda $common --json > $OUT/wanda.out 2>&1
$BIN prune --model $M --method sparsegpt --sparsity 0.5 --nsamples 8 --seqlen 32 --calib-text $T --log-memory $OUT/sparsegpt $common --json > $OUT/sparsegpt.out 2>&1
$BIN prune --model $M --method magnitude --sparsity-type 2:4 --log-memory $OUT/magnitude $common > $OUT/magnitude.out 2>&1
$BIN prune --model $M --method wanda --nsamples 8 --seqlen 32 --calib-text $T --eval-text $T --eval-windows 4 --log-memory $OUT/wanda-scratch $common --json > $OUT/wanda-scratch.out 2>&1
$BIN prune --model $M --method wanda --nsamples 8 --seqlen 32 --calib-text $T --eval-text $T --eval-windows 4 --resident --log-memory $OUT/wanda-resident $common --json > $OUT/wanda-resident.out 2>&1
$BIN prune --model $M --method gradprobe --sparsity 0.2 --seqlen 32 --num-batches 2 --gradient-threshold 2.0 --calib-text $T --eval-text $T --eval-windows 4 --save $OUT/gp-model --log-memory $OUT/gradprobe $common --json > $OUT/gradprobe.out 2>&1
$BIN prune --model $M --method gradprobe --seqlen 32 --calib-text $T --eval-text $T --eval-windows 4 --log-memory $OUT/gradprobe-scratch $common --json > $OUT/gradprobe-scratch.out 2>&1
$BIN prune --model $M --method gradprobe --iterative --initial-sparsity 0.1 --sparsity-step 0.2 --max-ppl-increase 50 --seqlen 32 --calib-text $T --eval-text $T --eval-windows 4 --include-embeddings --log-memory $OUT/gp-iter $common --json > $OUT/gp-iter.out 2>&1
$BIN eval --model $M --text $T --seqlen 32 --windows 4 --log-memory $OUT/eval $common --json > $OUT/eval.out 2>&1
$BIN snapshot --log-memory $OUT/snapshot --json > $OUT/snapshot.out 2>&1
# a bad one
$BIN prune --model $M --method wanda --sparsity 1.5 --calib-text $T $common > $OUT/bad.out 2>&1; echo "exit $?" >> $OUT/bad.out
