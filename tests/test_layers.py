"""The packages form layers, each importing only those below it::

    ragqa (the command line)
    serve, evals (neither imports the other)
    ingest
    rag (the core)

Every import counts: at module level, inside functions, under ``TYPE_CHECKING``, relative
ones, and ``importlib.import_module("...")`` / ``__import__("...")`` with a literal name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN = {
    "rag": {"ingest", "serve", "evals", "ragqa"},
    "ingest": {"serve", "evals", "ragqa"},
    "serve": {"evals", "ragqa"},
    "evals": {"serve", "ragqa"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _dynamic_name(call: ast.Call) -> str | None:
    """The module a literal ``importlib.import_module(...)`` or ``__import__(...)`` names: the
    literal prefix of an f-string is enough to know its top-level package."""
    func = call.func
    named = (isinstance(func, ast.Attribute) and func.attr == "import_module") or (
        isinstance(func, ast.Name) and func.id in ("import_module", "__import__"))
    if not named or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        prefix = str(arg.values[0].value)
        return prefix if "." in prefix else None  # f"pkg{i}": the package itself is not known
    return None


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, absolute module name)`` for every import in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against the file's package
                base = package[:len(package) - node.level + 1]
                yield node.lineno, ".".join([*base, *([node.module] if node.module else [])])
            elif node.module:
                yield node.lineno, node.module
        elif isinstance(node, ast.Call) and (name := _dynamic_name(node)) is not None:
            yield node.lineno, name


def violations(layer: str) -> list[str]:
    out = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        for line, name in sorted(imports(path)):
            if name.split(".")[0] in FORBIDDEN[layer]:
                out.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    return out


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_upward_imports(layer: str) -> None:
    found = violations(layer)
    assert not found, (f"{layer}/ must not import {', '.join(sorted(FORBIDDEN[layer]))}:\n  "
                       + "\n  ".join(found))


def test_the_walk_sees_every_kind_of_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker itself: each way of importing is caught, with its line."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    pkg = tmp_path / "rag" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "rag" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from .. import types\n")
    (pkg / "mod.py").write_text(
        "import ingest.state\n"
        "from serve.app import create_app\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from evals import retrieval\n"
        "def f():\n"
        "    from ragqa.cli import cli\n"
        "    import importlib\n"
        "    importlib.import_module('ingest.pipeline')\n"
        "    __import__('serve')\n"
        "    importlib.import_module(f'ingest.sources.{f}')\n"
        "    importlib.import_module(f'pkg{f}')\n"
        "    from .. import services\n"
        "    from ...ingest import state\n"
    )
    assert violations("rag") == [
        "rag/sub/mod.py:1 imports ingest.state",
        "rag/sub/mod.py:2 imports serve.app",
        "rag/sub/mod.py:5 imports evals",
        "rag/sub/mod.py:7 imports ragqa.cli",
        "rag/sub/mod.py:9 imports ingest.pipeline",
        "rag/sub/mod.py:10 imports serve",
        "rag/sub/mod.py:11 imports ingest.sources.",
        "rag/sub/mod.py:14 imports ingest",
    ]
