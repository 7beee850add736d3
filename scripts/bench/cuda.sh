#!/usr/bin/env bash
# prunemem's engine on a CUDA GPU beside the authors' PyTorch code on the same
# GPU, one run at a time, and `estimate --against` each prunemem run. For a
# machine with a GPU and PyTorch but no network (and no Rust): the prunemem
# binary is built elsewhere (`cargo build --release --features cuda`,
# stripped), and the checkpoints are made here with random weights of the
# real shapes (memory and time do not depend on the values; perplexities of
# random weights mean nothing and are not compared).
#
#   BIN=path/to/prunemem KIT=dir WANDA_REPO=path scripts/bench/cuda.sh OUTDIR
#
# KIT holds tokenizer.json, tokenizer_config.json (SmolLM2's) and
# wiki.test.raw. SHAPES picks the configs (profiles/models/NAME.json);
# each runs METHODS (default Wanda and SparseGPT) with NSAMPLES × SEQLEN
# (default the benchmark protocol's 32 × 512) and EVAL_WINDOWS windows, in
# f16, by TOOLS (default "prunemem reference").
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: cuda.sh OUTDIR}
mkdir -p "$out"
BIN=${BIN:?BIN: a prunemem built with --features cuda}
KIT=${KIT:?KIT: tokenizer files and wiki.test.raw}
: "${WANDA_REPO:?WANDA_REPO: a checkout of locuslab/wanda}"
SHAPES=${SHAPES:-smollm2-135m}
NSAMPLES=${NSAMPLES:-32}
SEQLEN=${SEQLEN:-512}
EVAL_WINDOWS=${EVAL_WINDOWS:-40}
METHODS=${METHODS:-wanda sparsegpt}
TOOLS=${TOOLS:-prunemem reference}
TEXT=$KIT/wiki.test.raw
# cudarc loads libnvrtc and libcuda by name: add where the CUDA toolkit or
# PyTorch's wheels keep them.
for d in /usr/local/cuda/lib64 $(python3 -c 'import nvidia,os;print(" ".join(os.path.join(p,q,"lib") for p in nvidia.__path__ for q in os.listdir(p)))' 2>/dev/null); do
  [ -d "$d" ] && LD_LIBRARY_PATH=$d:${LD_LIBRARY_PATH:-}
done
export LD_LIBRARY_PATH
# GNU time where the machine has it; the wall clock alone where not.
timed() {
  local to=$1; shift
  if [ -x /usr/bin/time ]; then /usr/bin/time -f "%e s wall, %M KiB peak RSS" -o "$to" "$@"
  else local t0=$SECONDS; "$@"; local rc=$?; echo "$((SECONDS - t0)) s wall" >"$to"; return $rc; fi
}
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv | tee "$out/gpu.txt"

for shape in $SHAPES; do
  model=$out/models/$shape
  python3 - "$shape" "$model" "$KIT" <<'EOF'
import json, os, shutil, sys, torch
sys.path.insert(0, "scripts/reference")
from trace_peak import load_config
from transformers import AutoModelForCausalLM
shape, dest, kit = sys.argv[1:]
_, config = load_config(f"profiles/models/{shape}.json")
torch.manual_seed(0)
with torch.device("cuda"):
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
model.save_pretrained(dest)
for f in ("tokenizer.json", "tokenizer_config.json"):
    shutil.copy(os.path.join(kit, f), dest)
print(f"made {dest}: {sum(p.numel() for p in model.parameters())} parameters")
EOF
  common=(--nsamples "$NSAMPLES" --seqlen "$SEQLEN" --calib-text "$TEXT" --calib-lines second-half
          --eval-text "$TEXT" --eval-lines first-half --eval-windows "$EVAL_WINDOWS")
  for method in $METHODS; do
    run=$shape-$method
    if [[ " $TOOLS " == *" prunemem "* ]]; then
      timed "$out/$run.time" "$BIN" prune --model "$model" --method "$method" --device cuda "${common[@]}" \
          --ui none --json --log-memory "$out/$run" >"$out/$run.json" 2>"$out/$run.err"
      echo "prunemem $run: rc $? $(cat "$out/$run.time" | tail -1)"
      tail -c 600 "$out/$run.err"
      "$BIN" estimate --against "$out/$run" >"$out/$run.estimate.txt" 2>&1
      tail -n 25 "$out/$run.estimate.txt"
    fi
    [[ " $TOOLS " == *" reference "* ]] || continue
    timed "$out/ref-$run.time" python3 scripts/reference/run_reference.py --wanda-repo "$WANDA_REPO" --model "$model" \
        --method "$method" --device cuda --dtype float16 "${common[@]}" --threads 8 \
        >"$out/ref-$run.json" 2>"$out/ref-$run.err"
    echo "reference $run: rc $? $(tail -1 "$out/ref-$run.time")"
    tail -c 300 "$out/ref-$run.err"
    tail -n 1 "$out/ref-$run.json"
  done
done
