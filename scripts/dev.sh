#!/usr/bin/env bash
# Install ragqa and run it on the embedded default: ingest this project's docs/ folder,
# show what was indexed, then keep it fresh with the scheduler (Ctrl-C stops it).
#
#   scripts/dev.sh                 # RAG_DATA_DIR defaults to ./.ragqa
#   scripts/dev.sh --no-schedule   # stop after ingesting
source "$(dirname "$0")/env.sh"

schedule=1
[[ "${1:-}" == "--no-schedule" ]] && schedule=0

ensure_venv
install_project ""
activate
cd "$ROOT"
export RAG_DATA_DIR="${RAG_DATA_DIR:-$ROOT/.ragqa}"

if ragqa sources --json | grep -q '"name": "docs"'; then
  say "updating the docs source"
  ragqa reindex --source docs --mode incremental || true
else
  say "ingesting $ROOT/docs"
  ragqa ingest "$ROOT/docs" --name docs --trust high
fi
ragqa status
say "try: ragqa search \"how does incremental reindexing work\""
ragqa search "how does incremental reindexing work" --k 3
if (( schedule )); then
  say "starting the scheduler (hourly incremental, daily full); Ctrl-C to stop"
  exec ragqa schedule
fi
