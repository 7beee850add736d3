#!/usr/bin/env bash
# Fills `.gpu/` for scripts/bench/gpu_session.sh on a fresh checkout, before
# a lent GPU's first call (the machine there has no Rust, and the device
# tool carries at most 64 MiB of ignored paths):
#   prunemem.gz            cargo build --release --features cuda --bin prunemem,
#                          stripped and gzipped (about 13 MB)
#   select_rate.gz, transfer_rate.gz, matmul_rate.gz
#                          the examples, built the same way (EXAMPLES="" skips them)
#   kit/                   SmolLM2's tokenizer files (scripts/fetch-smollm2.sh
#                          converts the model) and wiki.test.raw
#   wanda/, gradprobe/     `git archive` of the authors' repositories, from the
#                          git directories the search tool's fetch brings
#                          (WANDA_GIT, GRADPROBE_GIT; skipped when unset)
#   device_tests.gz        (DEVICE_TESTS=1) tests/device built with --features
#                          wgpu,cuda, stripped and gzipped, and device_tests.root
#                          (the checkout it was built in: its fixtures' path):
#                          the kernel and mask tests on CUDA
#   prunemem.commit        the commit the binaries were built from
# and keeps `.gpu/` out of git (.git/info/exclude). A clean cuda build takes
# about 15 minutes on this project's 2-core machines; a warm one about 4.
#
#   WANDA_GIT=/work/.mirror/locuslab+wanda/... \
#   GRADPROBE_GIT=/work/.mirror/dcifrian+GradProbe/... \
#     scripts/bench/gpu_prepare.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
g=.gpu
mkdir -p "$g"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >>"$exclude"

export CARGO_INCREMENTAL=0 CARGO_PROFILE_RELEASE_DEBUG=0
examples=${EXAMPLES-select_rate transfer_rate matmul_rate}
args=(--release --features cuda --bin prunemem)
for e in $examples; do args+=(--example "$e"); done
time cargo build "${args[@]}"
pack() {
  strip -o "$g/$2.tmp" "$1"
  gzip -9 -c "$g/$2.tmp" >"$g/$2.gz"
  rm -f "$g/$2.tmp"
  echo "gpu_prepare: $g/$2.gz $(du -h "$g/$2.gz" | cut -f1)"
}
pack target/release/prunemem prunemem
for e in $examples; do pack "target/release/examples/$e" "$e"; done
git rev-parse --short HEAD >"$g/prunemem.commit"

# The device tests on CUDA (PRUNEMEM_TEST_DEVICE=cuda): prunemem's kernels
# and the masks against the host's, on the card users run.
if [ -n "${DEVICE_TESTS:-}" ]; then
  exe=$(cargo test --features wgpu,cuda --test device --no-run --message-format=json \
    | python3 -c 'import sys, json
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["executable"])' | tail -n 1)
  pack "$exe" device_tests
  pwd >"$g/device_tests.root"
fi

model=models/smollm2-135m
[ -f "$model/tokenizer.json" ] || PRUNEMEM=target/release/prunemem scripts/fetch-smollm2.sh
mkdir -p "$g/kit"
cp "$model/tokenizer.json" "$g/kit/"
[ -f "$model/tokenizer_config.json" ] && cp "$model/tokenizer_config.json" "$g/kit/"
text=data/wikitext-2-raw/wiki.test.raw
[ -f "$text" ] || text=../shared/data/wikitext-2-raw/wiki.test.raw
cp "$text" "$g/kit/wiki.test.raw"

unpack() { # GIT_DIR NAME
  [ -n "$1" ] || { echo "gpu_prepare: no git directory for $2: skipped"; return; }
  rm -rf "${g:?}/$2" && mkdir -p "$g/$2"
  git --git-dir="$1" archive HEAD | tar -x -C "$g/$2"
  echo "gpu_prepare: $g/$2 from $1 ($(git --git-dir="$1" rev-parse --short HEAD))"
}
unpack "${WANDA_GIT:-}" wanda
unpack "${GRADPROBE_GIT:-}" gradprobe
du -sh "$g"
