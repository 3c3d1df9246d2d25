"""A feature whose optional dependencies are not installed says which extra to install.

Each case runs in a fresh interpreter where the package cannot be imported (``None`` in
``sys.modules``, as Python does for a blocked import), so this process's modules stay as they are.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_without(package: str, code: str) -> subprocess.CompletedProcess[str]:
    script = f"import sys; sys.modules[{package!r}] = None\n{code}"
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, text=True, capture_output=True, timeout=120)


def test_the_openai_generator_without_the_sdk_names_the_extra() -> None:
    run = run_without("openai", """
from rag.config import GeneratorSettings
from rag.errors import ConfigError
from rag.generators import make_generator
try:
    make_generator(GeneratorSettings(backend="openai", base_url="http://127.0.0.1:9/v1", model="m"))
except ConfigError as exc:
    print(exc)
""")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "the openai generator needs the openai SDK: pip install 'ragqa[openai]'"


def test_the_langchain_retriever_without_langchain_core_names_the_extra() -> None:
    run = run_without("langchain_core", "import rag.langchain")
    assert run.returncode == 1
    assert "ImportError: rag.langchain needs langchain-core" in run.stderr
    assert "pip install 'ragqa[langchain]'" in run.stderr


@pytest.mark.parametrize("package", ["openai", "langchain_core"])
def test_the_core_imports_without_the_extras(package: str) -> None:
    """Retrieval, serving and the CLI load without either extra."""
    run = run_without(package, "import ragqa.cli, rag.search, serve.app, rag.generators")
    assert run.returncode == 0, run.stderr
