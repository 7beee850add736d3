#!/usr/bin/env bash
# prunemem's engine on a CUDA GPU beside the authors' PyTorch code on the same
# GPU, one run at a time, each with nvidia-smi sampled every 200 ms, and
# `estimate --against` each prunemem run. For a machine with a GPU and
# PyTorch but no network (and no Rust): the prunemem binary is built
# elsewhere (`cargo build --release --features cuda`, stripped), and the
# checkpoints are made here with random weights of the real shapes (memory
# and time do not depend on the values; perplexities of random weights mean
# nothing and are not compared).
#
#   BIN=path/to/prunemem KIT=dir WANDA_REPO=path scripts/bench/cuda.sh OUTDIR
#
# FACTOR_BIN (optional): examples/factor_rate built with --features cuda,
# run first on FACTOR_SIZES (default 4096 8192 14336). MATMUL_BIN
# (optional): examples/matmul_rate, the same way: every matmul strategy on
# a 1B layer's linears and on the head, in both of the head's layouts.
# TRANSFER_BIN (optional): examples/transfer_rate, Burn's uploads and reads
# against the staged copies through page-locked memory at a run's sizes.
# SELECT_BIN (optional): examples/select_rate, the per-output selection and
# the per-matrix threshold at a model's linear shapes (SELECT_SHAPES,
# default "1b"; "1b 8b" adds the 8B shape's), checked against the host.
# DEVICE_TESTS_BIN (optional): tests/device built with --features wgpu,cuda
# (gpu_prepare.sh's DEVICE_TESTS=1); runs first, its in-process kernel and
# mask tests on CUDA (DEVICE_TESTS_FILTER, default: the in-process ones).
#
# GRADPROBE_REPO (optional): a checkout of dcifrian/GradProbe, for
# gradprobe:reference (scripts/reference/run_gradprobe_reference.py --device
# cuda). METHOD gradprobe runs GradProbe's own protocol on both sides, not
# the Wanda one: 2 windows of 128 tokens, 10% of the decoder's weights,
# gradient threshold 2.0, magnitude candidates, in f32 as its reference
# loads the model (GRADPROBE_ARGS overrides); prunemem evaluates
# EVAL_WINDOWS windows of 128 tokens after it, the reference does not.
#
# KIT holds tokenizer.json, tokenizer_config.json (SmolLM2's) and
# wiki.test.raw. SHAPES picks the configs (profiles/models/NAME.json); each
# runs RUNS (default "wanda:prunemem wanda:reference", then any other
# METHOD:TOOL pairs; TOOL prunemem-warm is prunemem again, its kernels
# compiled by the run before and loaded from the cache; prunemem-device and
# prunemem-host are that with --keep-pruned device or host (the default
# evaluates each pruned layer inside the prune, --keep-pruned inline); prunemem-owl adds --owl (no reference:
# compare its seconds with the method's alone); prunemem-dsnot adds --dsnot
# (prunemem-dsnot-all with --dsnot-skip none, prunemem-dsnot-ops with its
# cycles as Burn's ops, PRUNEMEM_DSNOT=ops; no reference in the kit: its
# dsnot_refine seconds are the figure); prunemem-24 and reference-24 prune 2:4;
# prunemem-variant and reference-variant prune with Wanda's α-variant
# (--use-variant); prunemem-realloc prunes 2:4 with --reallocation --lsa (RIA: the assignment
# kernels' seconds and the scores' bytes; no reference in the kit);
# prunemem-flash and prunemem-unit take cubek's flash attention on the
# tensor cores or on plain units, PRUNEMEM_ATTENTION; prunemem-head runs the
# head's product with HEAD_MATMUL, default double_tma_mma,
# PRUNEMEM_HEAD_MATMUL; prunemem-stored leaves the linears' weights as
# stored, transposed on the device instead of the host,
# PRUNEMEM_WEIGHT_LAYOUT=stored; prunemem-pinned copies the large tensors
# through page-locked staging, PRUNEMEM_TRANSFERS=pinned (prunemem-pinned-host
# with --keep-pruned host); prunemem-all takes the
# head's strategy, the stored layout and the pinned copies together
# (prunemem-all-warm again, after the kernels it compiles are cached; on
# CUDA all three are the defaults since 2026-11-28, so these equal
# prunemem there); prunemem-burn (and -burn-warm) takes Burn's ways
# instead, CUDA's defaults before (PRUNEMEM_HEAD_MATMUL=auto
# PRUNEMEM_WEIGHT_LAYOUT=burn PRUNEMEM_TRANSFERS=burn);
# prunemem-profile is a short run, 8 calibration and
# 8 evaluation windows, under cubecl's per-kernel profile, its kernels by
# time in RUN.kernels.txt) with NSAMPLES × SEQLEN (default the benchmark protocol's
# 32 × 512) and EVAL_WINDOWS windows, in f16. Every step has its own time
# limit (STEP_TIMEOUT seconds, default 150), and after every step the whole
# OUTDIR is packed into ARCHIVE (when set) and the table printed
# (scripts/bench/cuda_table.py), so a session cut short keeps what ran.
set -uo pipefail
self=$(realpath "$0")
cd "$(dirname "$0")/../.."
# `cuda.sh --do FUNCTION ARGS...`: one step, re-entered under `timeout`
# (which runs programs, not shell functions); its settings come exported.
doing=
if [ "${1:-}" = --do ]; then
  doing=1
  out=$BENCH_OUT
  read -r -a common <<<"$BENCH_COMMON"
else
  out=${1:?usage: cuda.sh OUTDIR}
fi
mkdir -p "$out"
BIN=${BIN:?BIN: a prunemem built with --features cuda}
KIT=${KIT:?KIT: tokenizer files and wiki.test.raw}
: "${WANDA_REPO:?WANDA_REPO: a checkout of locuslab/wanda}"
GRADPROBE_ARGS=${GRADPROBE_ARGS:-"--seqlen 128 --num-batches 2 --sparsity 0.1 --gradient-threshold 2.0 --strategy magnitude"}
SHAPES=${SHAPES:-llama-3.2-1b}
NSAMPLES=${NSAMPLES:-32}
SEQLEN=${SEQLEN:-512}
EVAL_WINDOWS=${EVAL_WINDOWS:-40}
RUNS=${RUNS:-"wanda:prunemem wanda:reference"}
STEP_TIMEOUT=${STEP_TIMEOUT:-150}
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
# One step: nvidia-smi sampled beside it into NAME.util.csv, a time limit,
# then the archive and the table.
step() {
  local name=$1; shift
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits \
      -lms 200 >"$out/$name.util.csv" 2>/dev/null &
  local smi=$!
  date +%s.%N >"$out/$name.start"
  timeout -k 10 "$STEP_TIMEOUT" "$self" --do "$@"
  local rc=$?
  date +%s.%N >"$out/$name.end"
  kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null
  echo "step $name: rc $rc"
  python3 scripts/bench/cuda_table.py "$out" >"$out/table.txt" 2>&1; cat "$out/table.txt"
  [ -n "${ARCHIVE:-}" ] && tar czf "$ARCHIVE" --exclude=models -C "$out" .
  # The compiled kernels too (KERNELS_ARCHIVE), for a later machine to start
  # with them cached (unpacked into PRUNEMEM_KERNEL_CACHE before its runs).
  [ -n "${KERNELS_ARCHIVE:-}" ] && [ -d "${PRUNEMEM_KERNEL_CACHE:-}" ] \
    && tar czf "$KERNELS_ARCHIVE" -C "$PRUNEMEM_KERNEL_CACHE" .
  return $rc
}
[ -n "$doing" ] || nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv | tee "$out/gpu.txt"

make_model() {
  python3 - "$1" "$2" "$KIT" <<'EOF'
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
}

# The protocol's flags for METHOD: GradProbe's own (GRADPROBE_ARGS, f32), or
# the benchmark protocol's (BENCH_COMMON).
protocol() {
  if [ "$1" = gradprobe ]; then
    read -r -a args <<<"$GRADPROBE_ARGS"
    args+=(--dtype f32 --calib-text "$TEXT" --calib-lines second-half
           --eval-text "$TEXT" --eval-lines first-half --eval-windows "$EVAL_WINDOWS")
  else
    args=("${common[@]}")
  fi
}

prunemem_run() {
  local model=$1 method=$2 run=$3; shift 3
  local -a args; protocol "$method"
  timed "$out/$run.time" "$BIN" prune --model "$model" --method "$method" --device cuda "${args[@]}" "$@" \
      --ui none --json --log-memory "$out/$run" >"$out/$run.json" 2>"$out/$run.err"
  local rc=$?
  echo "prunemem $run: rc $rc $(tail -1 "$out/$run.time")"
  tail -c 600 "$out/$run.err"
  "$BIN" estimate --against "$out/$run" >"$out/$run.estimate.txt" 2>&1
  tail -n 25 "$out/$run.estimate.txt"
  return $rc
}

reference_run() {
  local model=$1 method=$2 run=$3; shift 3
  if [ "$method" = gradprobe ]; then gradprobe_reference "$model" "$run"; return; fi
  timed "$out/$run.time" python3 scripts/reference/run_reference.py --wanda-repo "$WANDA_REPO" \
      --model "$model" --method "$method" --device cuda --dtype float16 "${common[@]}" --threads 8 "$@" \
      >"$out/$run.json" 2>"$out/$run.err"
  local rc=$?
  echo "reference $run: rc $rc $(tail -1 "$out/$run.time")"
  tail -c 300 "$out/$run.err"
  tail -n 1 "$out/$run.json"
  return $rc
}

# GradProbe's own pruner on the GPU, its model in f32, nothing saved.
gradprobe_reference() {
  local model=$1 run=$2 rc
  local -a gp; read -r -a gp <<<"$GRADPROBE_ARGS"
  if [ -z "${GRADPROBE_REPO:-}" ]; then echo "gradprobe:reference needs GRADPROBE_REPO" >&2; return 2; fi
  timed "$out/$run.time" python3 scripts/reference/run_gradprobe_reference.py --gradprobe-repo "$GRADPROBE_REPO" \
      --model "$model" --calib-text "$TEXT" --calib-lines second-half "${gp[@]}" --device cuda --no-save \
      --out "$out/$run" >"$out/$run.json" 2>"$out/$run.err"
  rc=$?
  echo "reference $run: rc $rc $(tail -1 "$out/$run.time")"
  tail -c 300 "$out/$run.err"
  tail -n 1 "$out/$run.json"
  return $rc
}

# SparseGPT's factorisation alone (`examples/factor_rate.rs`, built with
# --features cuda and carried like BIN): host and device seconds per input
# width, and whether Burn's f32 matmul rounds to TF32 on this card.
factor_rate() {
  "$FACTOR_BIN" cuda ${FACTOR_SIZES:-4096 8192 14336} >"$out/factor-rate.txt" 2>&1
  local rc=$?
  cat "$out/factor-rate.txt"
  return $rc
}

# The matmul strategies alone (`examples/matmul_rate.rs`).
matmul_rate() {
  "$MATMUL_BIN" cuda 4096 ${MATMUL_NAMES:-auto double_tma_mma specialized_tma_mma simple_tma_mma double_cyclic_cmma} \
      >"$out/matmul-rate.txt" 2>&1
  local rc=$?
  cat "$out/matmul-rate.txt"
  return $rc
}

# The copies alone (`examples/transfer_rate.rs`).
transfer_rate() {
  "$TRANSFER_BIN" cuda >"$out/transfer-rate.txt" 2>&1
  local rc=$?
  cat "$out/transfer-rate.txt"
  return $rc
}

# prunemem's kernels and the masks against the host's answers, on CUDA
# (tests/device's in-process tests, PRUNEMEM_TEST_DEVICE=cuda): every
# kernel's results on the card, where CI only compiles them (NVRTC). The
# tests that run the command line are left out (they name wgpu, and the
# test binary's prunemem is not carried).
DEVICE_TESTS_DEFAULT="kernels:: masks::device_ masks::gradprobe_decides_the_same masks::the_sparsegpt_sweep masks::training_steps ties::gradprobe_breaks_bf16_ties"
device_tests() {
  PRUNEMEM_TEST_DEVICE=cuda RUST_BACKTRACE=1 "$DEVICE_TESTS_BIN" --test-threads 1 \
      ${DEVICE_TESTS_FILTER:-$DEVICE_TESTS_DEFAULT} >"$out/device-tests.txt" 2>&1
  local rc=$?
  grep -E '^test |test result|panicked' "$out/device-tests.txt"
  return $rc
}

# The selections alone (`examples/select_rate.rs`).
select_rate() {
  local rc=0 shape
  for shape in ${SELECT_SHAPES:-1b}; do
    "$SELECT_BIN" cuda "$shape" >>"$out/select-rate.txt" 2>&1 || rc=$?
  done
  cat "$out/select-rate.txt"
  return $rc
}

# A short run under cubecl's profile (every kernel synchronised and timed,
# so its seconds are not a run's): which kernels the time went to, and the
# phases' seconds of the same run in its RUN.json.
profile_run() {
  local model=$1 method=$2 run=$3
  local -a common=(--nsamples 8 --seqlen "$SEQLEN" --calib-text "$TEXT" --calib-lines second-half
                   --eval-text "$TEXT" --eval-lines first-half --eval-windows 8)
  CUBECL_DEBUG_OPTION=profile CUBECL_DEBUG_LOG="$out/$run.cubecl.log" prunemem_run "$model" "$method" "$run"
  local rc=$?
  python3 scripts/bench/cubecl_profile.py "$out/$run.cubecl.log" >"$out/$run.kernels.txt" 2>&1
  head -n 25 "$out/$run.kernels.txt"
  gzip -f "$out/$run.cubecl.log"
  return $rc
}

if [ -n "$doing" ]; then
  shift
  "$@"
  exit $?
fi
common=(--nsamples "$NSAMPLES" --seqlen "$SEQLEN" --calib-text "$TEXT" --calib-lines second-half
        --eval-text "$TEXT" --eval-lines first-half --eval-windows "$EVAL_WINDOWS")
export BENCH_OUT=$out BENCH_COMMON="${common[*]}" BIN KIT WANDA_REPO GRADPROBE_REPO=${GRADPROBE_REPO:-} GRADPROBE_ARGS FACTOR_BIN=${FACTOR_BIN:-} FACTOR_SIZES=${FACTOR_SIZES:-} \
    MATMUL_BIN=${MATMUL_BIN:-} MATMUL_NAMES=${MATMUL_NAMES:-} TRANSFER_BIN=${TRANSFER_BIN:-} SELECT_BIN=${SELECT_BIN:-} SELECT_SHAPES=${SELECT_SHAPES:-1b} SEQLEN EVAL_WINDOWS TEXT \
    DEVICE_TESTS_BIN=${DEVICE_TESTS_BIN:-} DEVICE_TESTS_FILTER=${DEVICE_TESTS_FILTER:-}
[ -n "${DEVICE_TESTS_BIN:-}" ] && step device-tests device_tests
[ -n "${FACTOR_BIN:-}" ] && step factor-rate factor_rate
[ -n "${TRANSFER_BIN:-}" ] && step transfer-rate transfer_rate
[ -n "${SELECT_BIN:-}" ] && step select-rate select_rate
[ -n "${MATMUL_BIN:-}" ] && step matmul-rate matmul_rate
for shape in $SHAPES; do
  model=$out/models/$shape
  step "make-$shape" make_model "$shape" "$model" || continue
  for r in $RUNS; do
    method=${r%%:*}; tool=${r#*:}
    case $tool in
      prunemem) step "$shape-$method" prunemem_run "$model" "$method" "$shape-$method" ;;
      # The same again: cubecl's compiled kernels are now in the cache.
      prunemem-warm) step "$shape-$method-warm" prunemem_run "$model" "$method" "$shape-$method-warm" ;;
      # Again, the pruned layers kept on the device for the evaluation
      # (the default before the evaluation ran inside the prune, 2026-11-29).
      prunemem-device) step "$shape-$method-device" prunemem_run "$model" "$method" "$shape-$method-device" --keep-pruned device ;;
      # Again, the pruned layers waiting in host memory.
      prunemem-host) step "$shape-$method-host" prunemem_run "$model" "$method" "$shape-$method-host" --keep-pruned host ;;
      # OWL's layer sparsities: its outlier pass on the device first.
      prunemem-owl) step "$shape-$method-owl" prunemem_run "$model" "$method" "$shape-$method-owl" --owl ;;
      # DSnoT's swap loop on the device (its windows); -dsnot-all refines all seven linears.
      prunemem-dsnot) step "$shape-$method-dsnot" prunemem_run "$model" "$method" "$shape-$method-dsnot" --dsnot ;;
      prunemem-dsnot-all) step "$shape-$method-dsnot-all" prunemem_run "$model" "$method" "$shape-$method-dsnot-all" --dsnot --dsnot-skip none ;;
      # The same with the cycles stepped by Burn's ops (PRUNEMEM_DSNOT=ops), against the one launch.
      prunemem-dsnot-ops) PRUNEMEM_DSNOT=ops step "$shape-$method-dsnot-ops" prunemem_run "$model" "$method" "$shape-$method-dsnot-ops" --dsnot ;;
      reference) step "ref-$shape-$method" reference_run "$model" "$method" "ref-$shape-$method" ;;
      # N:M (2:4): prunemem's group kernel beside the authors' mask.
      prunemem-realloc) step "$shape-$method-realloc" prunemem_run "$model" "$method" "$shape-$method-realloc" --sparsity-type 2:4 --reallocation --lsa ;;
      # Wanda's α-variant: the sort, running sums and α rounds on the device, beside the authors' --use_variant.
      prunemem-variant) step "$shape-$method-variant" prunemem_run "$model" "$method" "$shape-$method-variant" --use-variant ;;
      reference-variant) step "ref-$shape-$method-variant" reference_run "$model" "$method" "ref-$shape-$method-variant" --use-variant ;;
      prunemem-24) step "$shape-$method-24" prunemem_run "$model" "$method" "$shape-$method-24" --sparsity-type 2:4 ;;
      # cubek's flash attention instead of Burn's separate kernels.
      prunemem-flash) PRUNEMEM_ATTENTION=accelerated step "$shape-$method-flash" prunemem_run "$model" "$method" "$shape-$method-flash" ;;
      prunemem-unit) PRUNEMEM_ATTENTION=unit step "$shape-$method-unit" prunemem_run "$model" "$method" "$shape-$method-unit" ;;
      # The head's product with a named strategy on its stored table.
      prunemem-head) PRUNEMEM_HEAD_MATMUL=${HEAD_MATMUL:-double_tma_mma} step "$shape-$method-head" prunemem_run "$model" "$method" "$shape-$method-head" ;;
      # The linears' weights as stored: no transposition on the host.
      prunemem-stored) PRUNEMEM_WEIGHT_LAYOUT=stored step "$shape-$method-stored" prunemem_run "$model" "$method" "$shape-$method-stored" ;;
      # Copies through page-locked staging instead of cubecl's pageable ones.
      prunemem-pinned) PRUNEMEM_TRANSFERS=pinned step "$shape-$method-pinned" prunemem_run "$model" "$method" "$shape-$method-pinned" ;;
      prunemem-pinned-host) PRUNEMEM_TRANSFERS=pinned step "$shape-$method-pinned-host" prunemem_run "$model" "$method" "$shape-$method-pinned-host" --keep-pruned host ;;
      # Every opt-in at once: the head's strategy, the stored layout, pinned copies.
      prunemem-all) PRUNEMEM_HEAD_MATMUL=${HEAD_MATMUL:-double_tma_mma} PRUNEMEM_WEIGHT_LAYOUT=stored PRUNEMEM_TRANSFERS=pinned \
          step "$shape-$method-all" prunemem_run "$model" "$method" "$shape-$method-all" ;;
      # The same again, its kernels compiled by the run before.
      prunemem-all-warm) PRUNEMEM_HEAD_MATMUL=${HEAD_MATMUL:-double_tma_mma} PRUNEMEM_WEIGHT_LAYOUT=stored PRUNEMEM_TRANSFERS=pinned \
          step "$shape-$method-all-warm" prunemem_run "$model" "$method" "$shape-$method-all-warm" ;;
      # Burn's ways, CUDA's defaults before 2026-11-28 (exec::defaults):
      # its matmul for the head, the host's transposition, pageable copies.
      prunemem-burn) PRUNEMEM_HEAD_MATMUL=auto PRUNEMEM_WEIGHT_LAYOUT=burn PRUNEMEM_TRANSFERS=burn \
          step "$shape-$method-burn" prunemem_run "$model" "$method" "$shape-$method-burn" ;;
      prunemem-burn-warm) PRUNEMEM_HEAD_MATMUL=auto PRUNEMEM_WEIGHT_LAYOUT=burn PRUNEMEM_TRANSFERS=burn \
          step "$shape-$method-burn-warm" prunemem_run "$model" "$method" "$shape-$method-burn-warm" ;;
      prunemem-profile) step "$shape-$method-profile" profile_run "$model" "$method" "$shape-$method-profile" ;;
      reference-24) step "ref-$shape-$method-24" reference_run "$model" "$method" "ref-$shape-$method-24" --sparsity-type 2:4 ;;
      *) echo "unknown tool $tool in RUNS" >&2 ;;
    esac
  done
  rm -rf "$model"
done
