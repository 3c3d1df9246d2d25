#!/usr/bin/env bash
# The answer evaluations behind evals/RESULTS-answers.md: each RUN is one `ragqa eval answers`
# folder in OUT (default /tmp/ragqa-answers), sharing one data dir, so each corpus is ingested
# once per embedder. Then: python evals/render_answers.py OUT/*/
#
#   source ~/.cache/ragqa/venv/bin/activate
#   DATA=<datasets> evals/run_answers.sh [OUT] [RUN...]   # RUN: see RUNS below; default all
#                                                         # (DATA only for the rgb-zh runs)
#
# LIMIT_S (default: none) stops each run after that many seconds; a stopped run keeps the
# questions it finished (rows are written as they come) and the same command resumes it.
set -euo pipefail

main() {
# DATA: the folder holding rgb-zh-dev (evals/README.md says where it comes from and under which
# license), needed by the rgb-zh runs only; the XQuAD sets are in tests/data.
DATA="${DATA:-}"
OUT="${1:-/tmp/ragqa-answers}"
shift || true
mkdir -p "$OUT"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
XQ_EN="$HERE/tests/data/xquad-en"
XQ_ZH="$HERE/tests/data/xquad-zh"
RGB="$DATA/rgb-zh-dev"

# name: dataset, sample size, abstention questions, environment.
#
# The first set (the answer harness's baseline) measured the 1.5B model with the context of
# that time (3,000 tokens, every passage of the top 8, no examples) before inferred citations
# (RAG_CITATIONS__INFER=false); xquad-en-qwen-infer is the same with them.
#
# The second set measures the fast-answer levers on one seeded sample of 100 questions per
# language (LIMIT_N stops each after the sample's first N; the same command resumes): `*-old` is
# the previous default (Qwen 1.5B, 3,000 tokens, every passage of the top 8, no examples, no
# flash attention), `*-new` the new one (Qwen 1.5B, the best passage in at most 512 tokens, one
# cited example per language, flash attention, the system message's state kept), and the others
# change one lever of the new default. The answer cache is off in all of them.
OLD=RAG_CITATIONS__INFER=false
Q15=RAG_GENERATOR__MODEL=qwen2.5-coder-1.5b-instruct
Q05="RAG_GENERATOR__MODEL=qwen2.5-coder-0.5b-instruct RAG_RETRIEVAL__MAX_CONTEXT_CHUNKS=3 RAG_RETRIEVAL__MAX_CONTEXT_TOKENS=1024"
WIDE="RAG_RETRIEVAL__MAX_CONTEXT_TOKENS=3000 RAG_RETRIEVAL__MAX_CONTEXT_CHUNKS=8 RAG_GENERATOR__FLASH_ATTN=false"
PREV="$Q15 $WIDE RAG_PROMPT__EXAMPLES=[] RAG_CACHE__BACKEND=off"
NEW="RAG_CACHE__BACKEND=off"
USE=RAG_EMBEDDER__BACKEND=use
FOCUS="RAG_RETRIEVAL__MAX_CONTEXT_CHUNKS=3 RAG_RETRIEVAL__FOCUS_SENTENCES=3"
RETR_OLD="RAG_EMBEDDER__BACKEND=sentence-transformers RAG_RETRIEVAL__WEIGHTS=[1,1] RAG_RETRIEVAL__LANGUAGE_AWARE=false"
declare -A RUNS=(
  [xquad-en-extractive]="$XQ_EN 150 150 RAG_GENERATOR__BACKEND=extractive"
  [xquad-zh-extractive]="$XQ_ZH 150 150 RAG_GENERATOR__BACKEND=extractive $USE"
  [rgb-zh-extractive]="$RGB 100 100 RAG_GENERATOR__BACKEND=extractive $USE"
  [xquad-en-qwen]="$XQ_EN 150 30 RAG_GENERATOR__BACKEND=llamacpp $Q15 $WIDE RAG_PROMPT__EXAMPLES=[] $OLD"
  [xquad-zh-qwen]="$XQ_ZH 150 10 RAG_GENERATOR__BACKEND=llamacpp $USE $Q15 $WIDE RAG_PROMPT__EXAMPLES=[] $OLD"
  [rgb-zh-qwen]="$RGB 100 10 RAG_GENERATOR__BACKEND=llamacpp $USE $Q15 $WIDE RAG_PROMPT__EXAMPLES=[] $OLD"
  [xquad-en-qwen-infer]="$XQ_EN 150 30 RAG_GENERATOR__BACKEND=llamacpp $Q15 $WIDE RAG_PROMPT__EXAMPLES=[]"
  [xquad-en-gemma]="$XQ_EN 150 10 RAG_GENERATOR__BACKEND=llamacpp RAG_GENERATOR__MODEL=gemma-3-270m $WIDE $OLD"
  [xquad-zh-gemma]="$XQ_ZH 150 10 RAG_GENERATOR__BACKEND=llamacpp RAG_GENERATOR__MODEL=gemma-3-270m $USE $WIDE $OLD"
  [rgb-zh-gemma]="$RGB 100 10 RAG_GENERATOR__BACKEND=llamacpp RAG_GENERATOR__MODEL=gemma-3-270m $USE $WIDE $OLD"
  # the fast-answer levers (one seeded sample of 100 per language)
  [xquad-en-old]="$XQ_EN 100 0 $PREV"
  [xquad-zh-old]="$XQ_ZH 100 0 $PREV $USE"
  [xquad-en-new]="$XQ_EN 100 10 $NEW"
  [xquad-zh-new]="$XQ_ZH 100 10 $NEW $USE"
  [xquad-en-noshots]="$XQ_EN 100 0 $NEW RAG_PROMPT__EXAMPLES=[]"
  [xquad-zh-noshots]="$XQ_ZH 100 0 $NEW RAG_PROMPT__EXAMPLES=[] $USE"
  [xquad-en-c2]="$XQ_EN 100 0 $NEW RAG_RETRIEVAL__MAX_CONTEXT_CHUNKS=2 RAG_RETRIEVAL__MAX_CONTEXT_TOKENS=1024"
  [xquad-zh-c2]="$XQ_ZH 100 0 $NEW RAG_RETRIEVAL__MAX_CONTEXT_CHUNKS=2 RAG_RETRIEVAL__MAX_CONTEXT_TOKENS=1024 $USE"
  [xquad-en-focus]="$XQ_EN 100 0 $NEW $FOCUS"
  [xquad-zh-focus]="$XQ_ZH 100 0 $NEW $FOCUS $USE"
  [xquad-en-f2s2]="$XQ_EN 100 0 $NEW RAG_RETRIEVAL__MAX_CONTEXT_CHUNKS=2 RAG_RETRIEVAL__FOCUS_SENTENCES=2"
  [xquad-zh-f2s2]="$XQ_ZH 100 0 $NEW RAG_RETRIEVAL__MAX_CONTEXT_CHUNKS=2 RAG_RETRIEVAL__FOCUS_SENTENCES=2 $USE"
  [xquad-en-f3s2]="$XQ_EN 100 0 $NEW RAG_RETRIEVAL__MAX_CONTEXT_CHUNKS=3 RAG_RETRIEVAL__FOCUS_SENTENCES=2"
  [xquad-zh-f3s2]="$XQ_ZH 100 0 $NEW RAG_RETRIEVAL__MAX_CONTEXT_CHUNKS=3 RAG_RETRIEVAL__FOCUS_SENTENCES=2 $USE"
  # retrieval without settings: the previous default as a user got it (MiniLM for every language,
  # equal rrf weights, no language gate) against auto embedder + adaptive weights + the gate
  [xquad-en-retr-old]="$XQ_EN 100 10 $NEW $RETR_OLD"
  [xquad-zh-retr-old]="$XQ_ZH 100 10 $NEW $RETR_OLD"
  [xquad-en-retr-new]="$XQ_EN 100 10 $NEW"
  [xquad-zh-retr-new]="$XQ_ZH 100 10 $NEW"
  [xquad-en-q05]="$XQ_EN 100 10 $NEW $Q05"
  [xquad-zh-q05]="$XQ_ZH 100 10 $NEW $Q05 $USE"
)
ORDER=(xquad-en-extractive xquad-zh-extractive rgb-zh-extractive xquad-en-qwen xquad-zh-qwen rgb-zh-qwen
       xquad-en-qwen-infer xquad-en-gemma xquad-zh-gemma rgb-zh-gemma
       xquad-en-new xquad-zh-new xquad-en-old xquad-zh-old xquad-en-q05 xquad-zh-q05 xquad-en-c2 xquad-zh-c2
       xquad-en-noshots xquad-zh-noshots)
[[ $# -gt 0 ]] && ORDER=("$@")
for name in "${ORDER[@]}"; do
  [[ -n "${RUNS[$name]:-}" ]] || { echo "run_answers.sh: unknown run $name" >&2; exit 2; }
  if [[ "$name" == rgb-* && ! -d "$DATA/rgb-zh-dev" ]]; then
    echo "run_answers.sh: $name needs DATA=<folder holding rgb-zh-dev> (evals/README.md)" >&2; exit 2
  fi
done

for name in "${ORDER[@]}"; do
  read -r dataset limit abstain env <<<"${RUNS[$name]}"
  echo "== $name: $dataset --limit $limit --abstain $abstain ($env) load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  local -a cmd=(ragqa --data-dir "$OUT/data" eval answers "$dataset" --limit "$limit" --seed 0
                --abstain "$abstain" --name "$(cut -d- -f1-2 <<<"$name")" --out "$OUT/$name" --no-tracking)
  [[ -n "${LIMIT_S:-}" ]] && cmd=(timeout "$LIMIT_S" "${cmd[@]}")
  [[ -n "${LIMIT_N:-}" ]] && cmd+=(--stop-after "$LIMIT_N")
  env $env "${cmd[@]}" >"$OUT/$name.txt" 2>"$OUT/$name.log" || echo "   stopped (exit $?): partial rows kept" >&2
  echo "   done at load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
}
main "$@"
