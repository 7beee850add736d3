#!/usr/bin/env bash
# Fetches NVRTC (NVIDIA's runtime CUDA compiler, a library: no driver, no
# GPU) and the CUDA headers it reads, from NVIDIA's PyPI wheels, into DIR,
# and prints the two variables the kernel check needs
# (`exec::kernels::cuda_source`: every prunemem kernel compiled to PTX as
# cubecl-cuda compiles it on a GPU's first run). Idempotent.
#
#   eval "$(scripts/fetch-nvrtc.sh DIR)"
#   cargo test --features wgpu --lib cuda_source -- --ignored --nocapture
#
# CUDA=12 fetches CUDA 12's (cu12 wheels); the default is CUDA 13's.
set -euo pipefail
DIR=${1:?usage: fetch-nvrtc.sh DIR}
CUDA=${CUDA:-13}
case "$CUDA" in
  13) PKGS=(nvidia-cuda-nvrtc==13.0.88 nvidia-cuda-runtime==13.0.96) ;;
  12) PKGS=(nvidia-cuda-nvrtc-cu12==12.9.86 nvidia-cuda-runtime-cu12==12.9.79) ;;
  *) echo "fetch-nvrtc: CUDA=$CUDA: 12 or 13" >&2; exit 2 ;;
esac
DIR=$(mkdir -p "$DIR" && cd "$DIR" && pwd)/cuda$CUDA
lib() { find "$DIR/x" -name 'libnvrtc.so.*' ! -name '*alt*' -printf '%h\n' 2>/dev/null | head -1; }
inc() { find "$DIR/x" -name cuda_runtime.h -printf '%h\n' 2>/dev/null | head -1; }
if [[ -z "$(lib)" || -z "$(inc)" ]]; then
  PY=$(command -v python3 || command -v python || true)
  [[ -n "$PY" ]] || { echo "fetch-nvrtc: python3 with pip is needed to download ${PKGS[*]}" >&2; exit 1; }
  rm -rf "$DIR" && mkdir -p "$DIR/wheels"
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: -d "$DIR/wheels" "${PKGS[@]}" >&2
  for w in "$DIR"/wheels/*.whl; do "$PY" -m zipfile -e "$w" "$DIR/x" >&2; done
  rm -rf "$DIR/wheels"
fi
[[ -n "$(lib)" && -n "$(inc)" ]] || { echo "fetch-nvrtc: no libnvrtc or cuda_runtime.h under $DIR/x" >&2; exit 1; }
echo "export LD_LIBRARY_PATH=$(lib)\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
echo "export PRUNEMEM_CUDA_INCLUDE=$(inc)"
