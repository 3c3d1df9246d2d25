#!/usr/bin/env bash
# Install everything the tests need and run the whole suite.
#
#   scripts/test.sh                # all tests
#   scripts/test.sh -m "not slow"  # extra arguments go to pytest
source "$(dirname "$0")/env.sh"

ensure_venv
install_project "dev,es,multilingual,redis"
activate
cd "$ROOT"

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
