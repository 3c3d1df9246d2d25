#!/usr/bin/env bash
# The answer evaluations behind evals/RESULTS-answers.md: each RUN is one `ragqa eval answers`
# folder in OUT (default /tmp/ragqa-answers), sharing one data dir, so each corpus is ingested
# once per embedder. Then: python evals/render_answers.py OUT/*/
#
#   source ~/.cache/ragqa/venv/bin/activate
#   evals/run_answers.sh [OUT] [RUN...]     # RUN: see RUNS below; default all
#
# LIMIT_S (default: none) stops each run after that many seconds; a stopped run keeps the
# questions it finished (rows are written as they come) and the same command resumes it.
set -euo pipefail

main() {
DATA="${DATA:-/work/shared/data}"
OUT="${1:-/tmp/ragqa-answers}"
shift || true
mkdir -p "$OUT"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
XQ_EN="$HERE/tests/data/xquad-en"
XQ_ZH="$HERE/tests/data/xquad-zh"
RGB="$DATA/rgb-zh-dev"

# name: dataset, sample size, abstention questions, environment. The model runs measure the
# default before inferred citations (RAG_CITATIONS__INFER=false); xquad-en-qwen-infer is the
# default with them, on the same questions.
OLD=RAG_CITATIONS__INFER=false
declare -A RUNS=(
  [xquad-en-extractive]="$XQ_EN 150 150 RAG_GENERATOR__BACKEND=extractive"
  [xquad-zh-extractive]="$XQ_ZH 150 150 RAG_GENERATOR__BACKEND=extractive RAG_EMBEDDER__BACKEND=use"
  [rgb-zh-extractive]="$RGB 100 100 RAG_GENERATOR__BACKEND=extractive RAG_EMBEDDER__BACKEND=use"
  [xquad-en-qwen]="$XQ_EN 150 30 RAG_GENERATOR__BACKEND=llamacpp $OLD"
  [xquad-zh-qwen]="$XQ_ZH 150 10 RAG_GENERATOR__BACKEND=llamacpp RAG_EMBEDDER__BACKEND=use $OLD"
  [rgb-zh-qwen]="$RGB 100 10 RAG_GENERATOR__BACKEND=llamacpp RAG_EMBEDDER__BACKEND=use $OLD"
  [xquad-en-qwen-infer]="$XQ_EN 150 30 RAG_GENERATOR__BACKEND=llamacpp"
  [xquad-en-gemma]="$XQ_EN 150 10 RAG_GENERATOR__BACKEND=llamacpp RAG_GENERATOR__MODEL=gemma-3-270m $OLD"
  [xquad-zh-gemma]="$XQ_ZH 150 10 RAG_GENERATOR__BACKEND=llamacpp RAG_GENERATOR__MODEL=gemma-3-270m RAG_EMBEDDER__BACKEND=use $OLD"
  [rgb-zh-gemma]="$RGB 100 10 RAG_GENERATOR__BACKEND=llamacpp RAG_GENERATOR__MODEL=gemma-3-270m RAG_EMBEDDER__BACKEND=use $OLD"
)
ORDER=(xquad-en-extractive xquad-zh-extractive rgb-zh-extractive xquad-en-qwen xquad-zh-qwen rgb-zh-qwen
       xquad-en-qwen-infer xquad-en-gemma xquad-zh-gemma rgb-zh-gemma)
[[ $# -gt 0 ]] && ORDER=("$@")

for name in "${ORDER[@]}"; do
  read -r dataset limit abstain env <<<"${RUNS[$name]}"
  echo "== $name: $dataset --limit $limit --abstain $abstain ($env) load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  local -a cmd=(ragqa --data-dir "$OUT/data" eval answers "$dataset" --limit "$limit" --seed 0
                --abstain "$abstain" --name "$(cut -d- -f1-2 <<<"$name")" --out "$OUT/$name" --no-tracking)
  [[ -n "${LIMIT_S:-}" ]] && cmd=(timeout "$LIMIT_S" "${cmd[@]}")
  env $env "${cmd[@]}" >"$OUT/$name.txt" 2>"$OUT/$name.log" || echo "   stopped (exit $?): partial rows kept" >&2
  echo "   done at load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
}
main "$@"
