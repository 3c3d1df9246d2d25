# shellcheck shell=bash
# Sourced by the other scripts: finds or builds the Python environment.
#
# The environment lives outside the checkout (torch alone is ~2.7 GB of downloads), in
# $RAGQA_VENV (default ~/.cache/ragqa/venv), and is reused once it is complete.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RAGQA_VENV="${RAGQA_VENV:-$HOME/.cache/ragqa/venv}"
TORCH_VERSION="2.13.0"
PYTHON="${PYTHON:-python3}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# llama-cpp-python (the llamacpp extra) is built from source, once per machine, into this cache.
LLAMA_CPP_VERSION="0.3.36"
RAGQA_WHEELS="${RAGQA_WHEELS:-$HOME/.cache/ragqa/wheels}"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

ensure_venv() {
  local marker="$RAGQA_VENV/.torch-$TORCH_VERSION-complete"
  local want have
  want="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  if [[ -f "$marker" && -x "$RAGQA_VENV/bin/python" ]]; then
    have="$("$RAGQA_VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)"
    if [[ "$have" == "$want" ]]; then
      return 0
    fi
  fi
  say "creating $RAGQA_VENV with torch $TORCH_VERSION (one time; large download)"
  rm -rf "$RAGQA_VENV"
  "$PYTHON" -m venv "$RAGQA_VENV"
  "$RAGQA_VENV/bin/pip" install -q --upgrade pip
  "$RAGQA_VENV/bin/pip" install -q "torch==$TORCH_VERSION"
  touch "$marker"
}

# ensure_llamacpp_wheel: PyPI has only the source of llama-cpp-python, a C++ build of 7-8
# minutes on 2 idle cores. Build it once into $RAGQA_WHEELS/avx2/ and print that folder, so
# that installs reuse the wheel. Not -march=native: on these VMs the CPU reports AMX, and
# ggml's AMX kernels crash (SIGSEGV in ggml_backend_amx_mul_mat); AVX2/FMA (x86-64-v3) is
# also portable. LLAVA_BUILD=OFF skips the multimodal library, which the service never loads.
ensure_llamacpp_wheel() {
  local dir="$RAGQA_WHEELS/avx2" start=$SECONDS
  if ! compgen -G "$dir/llama_cpp_python-$LLAMA_CPP_VERSION-*.whl" >/dev/null; then
    say "building llama-cpp-python $LLAMA_CPP_VERSION into $dir (once per machine; 7-8 minutes)"
    mkdir -p "$dir"
    CMAKE_ARGS="-DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON \
-DGGML_F16C=ON -DGGML_BMI2=ON ${CMAKE_ARGS:-}" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
      "$RAGQA_VENV/bin/pip" wheel -q --no-deps -w "$dir" "llama-cpp-python==$LLAMA_CPP_VERSION" >&2
    say "built llama-cpp-python in $((SECONDS - start)) s"
  fi
  echo "$dir"
}

# install_project EXTRAS: install this checkout (editable) with the given extras.
install_project() {
  local extras="${1:-}"
  local spec="$ROOT" more=()
  [[ -n "$extras" ]] && spec="$ROOT[$extras]"
  if [[ ",$extras," == *",llamacpp,"* ]]; then
    more=(--find-links "$(ensure_llamacpp_wheel)" "llama-cpp-python==$LLAMA_CPP_VERSION")
  fi
  say "installing ragqa${extras:+[$extras]} into $RAGQA_VENV"
  "$RAGQA_VENV/bin/pip" install -q -e "$spec" "torch==$TORCH_VERSION" ${more[@]+"${more[@]}"}
}

# ensure_redis: a redis-server for the Redis tests (the stream store, the answer cache), from
# Debian's package, installed once per machine. Returns non-zero when it cannot be had.
ensure_redis() {
  command -v redis-server >/dev/null 2>&1 && return 0
  say "installing redis-server (Debian's package) for the Redis tests"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; } >/dev/null 2>&1
  command -v redis-server >/dev/null 2>&1
}

# ensure_postgres: Debian's postgresql server for the shared ingestion state's tests
# (scripts/postgres.sh runs a cluster of its own on loopback), installed once per machine.
# Returns non-zero when it cannot be had.
ensure_postgres() {
  compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null && return 0
  say "installing postgresql (Debian's package) for the PostgreSQL state tests"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      postgresql; } >/dev/null 2>&1
  compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null
}

# ensure_promtool: Prometheus' promtool, from Debian's prometheus package, installed once per
# machine, to check the alert rules and run their unit tests (infra/prometheus/). The package
# also installs a Prometheus server, which the tests never start.
ensure_promtool() {
  command -v promtool >/dev/null 2>&1 && return 0
  say "installing promtool (Debian's prometheus package) for the alert rule tests"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      prometheus; } >/dev/null 2>&1
  command -v promtool >/dev/null 2>&1
}

# ensure_kustomize: kustomize renders infra/k8s for tests/test_ops_k8s.py. kubectl's built-in
# one will do; else kustomize is built from the Go module proxy into ~/.cache/ragqa/bin, once per
# machine (about 3 minutes on 2 cores). Returns non-zero when neither can be had.
KUSTOMIZE_VERSION="v5.7.1"
ensure_kustomize() {
  command -v kustomize >/dev/null 2>&1 && return 0
  command -v kubectl >/dev/null 2>&1 && kubectl kustomize --help >/dev/null 2>&1 && return 0
  local bin="$HOME/.cache/ragqa/bin" go
  [[ -x "$bin/kustomize" ]] && return 0
  go="$(command -v go || echo /usr/local/go/bin/go)"
  [[ -x "$go" ]] || return 1
  say "building kustomize $KUSTOMIZE_VERSION from the Go module proxy for the Kubernetes manifest tests"
  mkdir -p "$bin"
  GOBIN="$bin" GOFLAGS=-mod=mod "$go" install "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION" >/dev/null 2>&1
  [[ -x "$bin/kustomize" ]]
}

# ensure_chromium: Debian's chromium and chromium-driver for the web page's browser test
# (tests/test_webpage.py, driven by Selenium), installed once per machine: about 135 MB of
# packages, 440 MB on disk, under a minute. Returns non-zero when they cannot be had (the
# test is then skipped).
ensure_chromium() {
  [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]] && return 0
  say "installing chromium and chromium-driver (Debian's packages) for the web page test"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      chromium chromium-driver; } >/dev/null 2>&1
  [[ -x /usr/bin/chromium && -x /usr/bin/chromedriver ]]
}

activate() {
  # shellcheck disable=SC1091
  source "$RAGQA_VENV/bin/activate"
}
