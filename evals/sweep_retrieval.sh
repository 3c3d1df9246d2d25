#!/usr/bin/env bash
# The retrieval sweep behind evals/RESULTS-retrieval.md: one ingest per (dataset, embedder),
# every variant measured on it. Writes one JSON report per run to OUT (default
# evals/results), then: python evals/render_results.py OUT > evals/RESULTS-retrieval.md
#
#   source scripts/env.sh && activate   # or: source ~/.cache/ragqa/venv/bin/activate
#   evals/sweep_retrieval.sh DATA [OUT] [RUN...]   # RUN: cranfield-st cranfield-use rgb-use xquad-en xquad-zh zh-en-use zh-en-e5
#                                                  #      default-cranfield default-xquad-en default-xquad-zh default-rgb default-zh-en
set -euo pipefail

main() {  # the whole script is one function, so bash reads it all before running any of it
# DATA: the folder holding cranfield-dev, rgb-zh-dev, xquad-en and xquad-zh (evals/README.md
# says where each comes from and under which license).
DATA="${1:?usage: evals/sweep_retrieval.sh DATA [OUT] [RUN...] (DATA holds the datasets of evals/README.md)}"
OUT="${2:-evals/results}"
shift 2 || shift || true
mkdir -p "$OUT"

# The plain modes run with 100 candidates, rrf k 60 and weights 1,1 (the defaults before
# weights by embedder), pinned here since the CLI otherwise takes the settings' parameters.
BASE=(--modes bm25,vector,hybrid,rrf --candidates 100 --rrf-k 60 --weights 1,1)
# The sweep of cranfield-dev and rgb-zh-dev: the four modes, hybrid and rrf at 50 and 200
# candidates, and rrf weights x k.
SWEEP=("${BASE[@]}"
       --variant hybrid:c=50 --variant hybrid:c=200 --variant rrf:c=50 --variant rrf:c=200)
for w in 1,1 1,0.5 1,0.7 2,1 1,0.3 1,0.2 1,1.5; do
  for k in 20 60; do
    [[ "$w" == 1,1 && "$k" == 60 ]] && continue   # that is the rrf mode itself
    SWEEP+=(--variant "rrf:w=$w:k=$k")
  done
done
# XQuAD (saturated): the modes that matter and a few weightings.
XQUAD=("${BASE[@]}" --variant rrf:w=1,0.5:k=60 --variant rrf:w=2,1:k=60
       --variant rrf:w=1,0.7:k=60 --variant rrf:w=1,0.5:k=20 --variant rrf:w=1,0.7:k=20)
# Cross-lingual (zh questions, en paragraphs): BM25 can only match names and numbers.
CROSS=("${BASE[@]}" --variant rrf:w=1,0.5:k=60 --variant rrf:w=1,0.5:k=20
       --variant rrf:w=1,0.7:k=20 --variant rrf:w=0.5,1:k=60 --variant rrf:w=0.3,1:k=60)

run() {  # NAME ARGS...: one ragqa eval run, its report in OUT/NAME.json, its log in OUT/NAME.log
  local name="$1"; shift
  echo "== $name: ragqa eval retrieval $*" >&2
  local started=$SECONDS sha
  sha="$(sha1sum rag/retrieval/hybrid.py | cut -c1-12)"   # the retriever this run loads
  ragqa eval retrieval "$@" --per-query --json >"$OUT/$name.json.tmp" 2>"$OUT/$name.log"
  python - "$OUT/$name.json.tmp" "$OUT/$name.json" "$((SECONDS - started))" "$*" "$sha" <<'PY'
import json, sys, pathlib
report = json.loads(pathlib.Path(sys.argv[1]).read_text())
report["wall_s"] = int(sys.argv[3])
report["command"] = "ragqa eval retrieval " + sys.argv[4]
report["hybrid_py_sha1"] = sys.argv[5]
pathlib.Path(sys.argv[2]).write_text(json.dumps(report, ensure_ascii=False, indent=1))
pathlib.Path(sys.argv[1]).unlink()
PY
  echo "   done in $((SECONDS - started)) s" >&2
}

# The defaults, nothing set by hand: the embedder chosen by the first ingest (auto), adaptive
# weights, the language gate; beside them the fixed weights of the previous defaults, ungated.
DEFAULTS=(--modes bm25,vector,rrf --variant rrf:w=1,1:lang=0 --variant rrf:w=1,0.5:lang=0)

want() { [[ ${#RUNS[@]} -eq 0 ]] || [[ " ${RUNS[*]} " == *" $1 "* ]]; }

RUNS=("$@")
want cranfield-st  && run cranfield-st  "$DATA/cranfield-dev" --embedder sentence-transformers "${SWEEP[@]}"
want cranfield-use && run cranfield-use "$DATA/cranfield-dev" --embedder use "${SWEEP[@]}"
want rgb-use       && run rgb-use       "$DATA/rgb-zh-dev"    --embedder use "${SWEEP[@]}"
want xquad-en      && run xquad-en      "$DATA/xquad-en"      --embedder use "${XQUAD[@]}"
want xquad-zh      && run xquad-zh      "$DATA/xquad-zh"      --embedder use "${XQUAD[@]}"
want zh-en-use     && run zh-en-use     "$DATA/xquad-en" --queries "$DATA/xquad-zh/queries.jsonl" \
                          --qrels "$DATA/xquad-zh/qrels.tsv" --embedder use "${CROSS[@]}"
want zh-en-e5      && run zh-en-e5      "$DATA/xquad-en" --queries "$DATA/xquad-zh/queries.jsonl" \
                          --qrels "$DATA/xquad-zh/qrels.tsv" --embedder e5 ${E5_LIMIT:+--limit "$E5_LIMIT"} "${CROSS[@]}"
want default-cranfield && run default-cranfield "$DATA/cranfield-dev" "${DEFAULTS[@]}"
want default-xquad-en  && run default-xquad-en  "$DATA/xquad-en" "${DEFAULTS[@]}"
want default-xquad-zh  && run default-xquad-zh  "$DATA/xquad-zh" "${DEFAULTS[@]}"
want default-zh-en     && run default-zh-en     "$DATA/xquad-en" --queries "$DATA/xquad-zh/queries.jsonl" \
                          --qrels "$DATA/xquad-zh/qrels.tsv" "${DEFAULTS[@]}"
want default-rgb       && run default-rgb       "$DATA/rgb-zh-dev" "${DEFAULTS[@]}"
return 0
}

main "$@"
exit 0
