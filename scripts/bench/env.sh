# Sourced by the benchmark scripts (scripts/bench, scripts/reference): moves
# to the repository root, takes OUT from the first argument (or the default
# given as $1 to this file) and creates its folder, and names the text, the
# model and the Python every benchmark uses unless PRUNEMEM_TEXT,
# PRUNEMEM_MODEL or PYTHON override them.
#
#   source "$(dirname "$0")/../bench/env.sh" reports/bench/x.jsonl "$@"
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${2:-$1}
mkdir -p "$(dirname "$OUT")"
TEXT=${PRUNEMEM_TEXT:-data/wikitext-2-raw/wiki.test.raw}
MODEL=${PRUNEMEM_MODEL:-models/smollm2-135m}
PY=${PYTHON:-python3}
