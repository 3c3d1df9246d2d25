#!/usr/bin/env bash
# Install everything the tests need and run the whole suite.
#
#   scripts/test.sh                # all tests
#   scripts/test.sh -m "not slow"  # extra arguments go to pytest
source "$(dirname "$0")/env.sh"

ensure_venv
install_project "dev,es,redis"
activate
cd "$ROOT"

# A real single-node Elasticsearch on loopback for the integration tests (fetched once from
# Maven Central and cached); it is stopped again when the tests end.
export RAGQA_ES_PORT="${RAGQA_ES_PORT:-9250}"
if [[ -z "${RAG_TEST_ES_URL:-}" ]]; then
  if bash "$ROOT/scripts/elasticsearch.sh" start; then
    export RAG_TEST_ES_URL="http://127.0.0.1:$RAGQA_ES_PORT"
    trap 'bash "$ROOT/scripts/elasticsearch.sh" stop || true' EXIT
  else
    say "WARNING: Elasticsearch could not be started; its tests will be skipped"
  fi
fi

say "running the tests"
set +e
python -m pytest -p no:cacheprovider "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "no tests were collected" >&2
  exit 1
fi
exit $rc
