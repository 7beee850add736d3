#!/usr/bin/env bash
# One call of a lent GPU machine: unpacks what `.gpu/` carries (the
# stripped, gzipped binaries, the kit, the authors' repositories, and the
# kernels an earlier call compiled), runs scripts/bench/cuda.sh under a
# total time limit, and leaves in $OUT the run's archive, its log and the
# compiled kernels (so the next call, on a fresh machine, starts cached).
#
#   NAME=call1 TOTAL=380 SHAPES=llama-3.2-1b RUNS="wanda:prunemem ..." \
#     scripts/bench/gpu_session.sh
#
# `.gpu/` (ignored through .git/info/exclude, named in the call's carry):
#   prunemem.gz [transfer_rate.gz matmul_rate.gz select_rate.gz]  cargo build --release
#       --features cuda --bin prunemem [--example ...], stripped, gzipped
#   kit/   tokenizer.json, tokenizer_config.json (SmolLM2's), wiki.test.raw
#   wanda/ gradprobe/   `git archive` of locuslab/wanda, dcifrian/GradProbe
#   kernels.tgz   (optional) an earlier call's $OUT/kernels.tgz
#   device_tests.gz device_tests.root   (optional) gpu_prepare.sh's DEVICE_TESTS=1:
#       with WITH_DEVICE_TESTS=1 the kernel and mask tests run on CUDA first
set -u
cd "$(dirname "$0")/../.."
g=.gpu
name=${NAME:-call}
mkdir -p /tmp/bin
for b in prunemem transfer_rate matmul_rate select_rate device_tests; do
  [ -f "$g/$b.gz" ] && gunzip -c "$g/$b.gz" >/tmp/bin/$b && chmod +x /tmp/bin/$b
done
export PRUNEMEM_KERNEL_CACHE=/tmp/kernels
mkdir -p "$PRUNEMEM_KERNEL_CACHE"
[ -f "$g/kernels.tgz" ] && tar xzf "$g/kernels.tgz" -C "$PRUNEMEM_KERNEL_CACHE"
echo "kernels cached at start: $(find "$PRUNEMEM_KERNEL_CACHE" -type f | wc -l) files"
[ -x /tmp/bin/transfer_rate ] && [ -n "${WITH_TRANSFER:-}" ] && export TRANSFER_BIN=/tmp/bin/transfer_rate
[ -x /tmp/bin/matmul_rate ] && [ -n "${WITH_MATMUL:-}" ] && export MATMUL_BIN=/tmp/bin/matmul_rate
[ -x /tmp/bin/select_rate ] && [ -n "${WITH_SELECT:-}" ] && export SELECT_BIN=/tmp/bin/select_rate
# The device tests read their fixtures where they were built: that path
# points at this checkout.
if [ -x /tmp/bin/device_tests ] && [ -n "${WITH_DEVICE_TESTS:-}" ] && [ -s "$g/device_tests.root" ]; then
  root=$(cat "$g/device_tests.root")
  if [ ! -e "$root" ]; then mkdir -p "$(dirname "$root")" && ln -s "$PWD" "$root"; fi
  export DEVICE_TESTS_BIN=/tmp/bin/device_tests
fi
export BIN=/tmp/bin/prunemem KIT=$g/kit WANDA_REPO=$g/wanda GRADPROBE_REPO=$g/gradprobe
export ARCHIVE=$OUT/$name.tgz KERNELS_ARCHIVE=$OUT/kernels.tgz
export STEP_TIMEOUT=${STEP_TIMEOUT:-120}
set -o pipefail
timeout -k 5 "${TOTAL:-380}" scripts/bench/cuda.sh "/tmp/$name" 2>&1 | tee "$OUT/$name.log"
echo "cuda.sh: rc $?"
cp "/tmp/$name/table.txt" "$OUT/$name.table.txt" 2>/dev/null
tar czf "$ARCHIVE" --exclude=models -C "/tmp/$name" .
tar czf "$KERNELS_ARCHIVE" -C "$PRUNEMEM_KERNEL_CACHE" .
ls -la "$OUT"
