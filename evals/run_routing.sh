#!/usr/bin/env bash
# The answer runs behind the routing figures of evals/RESULTS-profiles.md: each dataset answered by
# each profile on the same seeded sample, every row carrying the router's signals and the
# answer's confidence (the model's mean token log-probability), then the router and the cascade's
# routing.min_confidence fitted on each (small, large) pair with `ragqa eval fit-router`.
#
#   source ~/.cache/ragqa/venv/bin/activate
#   DATA=<folder holding rgb-zh-dev> LIMIT_N=60 evals/run_routing.sh [OUT] [RUN...]
#
# RUN is DATASET-PROFILE: DATASET one of xquad-en, xquad-zh, rgb-zh; PROFILE one of extractive
# (no model), q05 (the packaged Qwen2.5-Coder-0.5B, the llamacpp-small extra) and q15 (the
# packaged Qwen2.5-Coder-1.5B, the default). Every profile keeps its own default context (the
# best passage in 512 tokens on llamacpp, 3,000 tokens for the extractive answerer); the answer
# cache is off. LIMIT_N (default 60) answers the first N of a seeded sample of 100 questions;
# the same command resumes a stopped run. Runs go one after the other (they share two cores).
set -euo pipefail

OUT="${1:-/tmp/ragqa-routing}"
shift || true
mkdir -p "$OUT"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
DATA="${DATA:-}"
LIMIT_N="${LIMIT_N:-60}"
declare -A SETS=([xquad-en]="$HERE/tests/data/xquad-en" [xquad-zh]="$HERE/tests/data/xquad-zh"
                 [rgb-zh]="$DATA/rgb-zh-dev")
declare -A EMB=([xquad-en]="" [xquad-zh]="RAG_EMBEDDER__BACKEND=use" [rgb-zh]="RAG_EMBEDDER__BACKEND=use")
declare -A PROFILES=(
  [extractive]="RAG_GENERATOR__BACKEND=extractive"
  [q05]="RAG_GENERATOR__BACKEND=llamacpp RAG_GENERATOR__MODEL=qwen2.5-coder-0.5b-instruct"
  [q15]="RAG_GENERATOR__BACKEND=llamacpp RAG_GENERATOR__MODEL=qwen2.5-coder-1.5b-instruct"
)
ORDER=(xquad-en-extractive xquad-zh-extractive rgb-zh-extractive xquad-en-q15 xquad-zh-q15 rgb-zh-q15
       xquad-en-q05 xquad-zh-q05 rgb-zh-q05)
[[ $# -gt 0 ]] && ORDER=("$@")

for name in "${ORDER[@]}"; do
  set_name="${name%-*}" profile="${name##*-}"
  dataset="${SETS[$set_name]:-}"
  [[ -n "$dataset" && -n "${PROFILES[$profile]:-}" ]] || { echo "run_routing.sh: unknown run $name" >&2; exit 2; }
  [[ -d "$dataset" ]] || { echo "run_routing.sh: $name needs $dataset (DATA=..., evals/README.md)" >&2; exit 2; }
  echo "== $name $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  # shellcheck disable=SC2086
  env RAG_CACHE__BACKEND=off ${EMB[$set_name]} ${PROFILES[$profile]} \
    ragqa --data-dir "$OUT/data" eval answers "$dataset" --limit 100 --seed 0 --abstain 0 \
    --name "$set_name" --out "$OUT/$name" --no-tracking --stop-after "$LIMIT_N" \
    >"$OUT/$name.txt" 2>"$OUT/$name.log" || echo "   $name stopped (exit $?): partial rows kept" >&2
  echo "   done $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
