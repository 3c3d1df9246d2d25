"""A sentence-transformers BERT model (MiniLM by default) as int8 ONNX, run by onnxruntime."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from rag.embedders import encode_batched, one_line, usable_cpus
from rag.embedders.st import SentenceTransformerEmbedder, _read_json
from rag.errors import EmbedderError

__all__ = ["OnnxInt8Embedder"]

_EXTRA = "pip install 'ragqa[onnx]'"


class OnnxInt8Embedder(SentenceTransformerEmbedder):
    """The same model as :class:`SentenceTransformerEmbedder`, int8-quantized, on onnxruntime.

    On first use the model's transformer is exported to ONNX and quantized once per machine
    into ``~/.cache/ragqa/models/<model>-onnx-int8/`` (see :mod:`rag.embedders.onnx_export`);
    later runs load that file. Tokenizer, truncation, mean pooling and normalisation are the
    sentence-transformers model's, so vectors stay close to fp32 (cosine at least 0.98 on real
    passages, ``bench/RESULTS-onnx.md``) but not equal: its ``name`` (``onnx-int8:<model>``)
    differs from the fp32 one, so an index built with one refuses the other's vectors.

    Only models made of a Transformer and mean Pooling (and Normalize) qualify, with a
    ``tokenizer.json``; anything else is an ``EmbedderError`` on first use.

    Each text runs alone, unpadded. Dynamic quantization scales activations per tensor, so in
    a padded batch a text's vector would depend on its batch mates (cosine down to 0.985
    between two batchings of the same passages); alone, a text always gets the same vector,
    as a query or as a passage, and on two cores it was no slower (75-83 passages/s against
    62-65 in batches of 32, ``bench/RESULTS-onnx.md``).

    Texts run side by side, one per core (``threads``, default the usable cores), each on one
    onnxruntime thread: a single text's matrices are too small for several threads to share
    well (on two cores, 26 chunks/s on one thread, 31-34 on two, 52-53 with two texts at once).
    A text's vector does not depend on the thread count.

    Needs onnxruntime and onnx (``pip install 'ragqa[onnx]'``), and torch with transformers
    for the one-time export.

    Example::

        embedder = OnnxInt8Embedder()                     # packaged MiniLM, 384 dimensions
        docs = embedder.embed_documents(["Paris is the capital of France."])
        score = float(docs[0] @ embedder.embed_query("capital of France"))
    """

    def __init__(
        self,
        model: str | Path | None = None,
        batch_size: int = 32,
        threads: int | None = None,
        progress: bool = True,
        cache_dir: Path | None = None,
    ) -> None:
        super().__init__(model, batch_size=batch_size, threads=threads, device="cpu", progress=progress)
        self.name = f"onnx-int8:{self._label}"
        self.cache_dir = cache_dir
        self._truncating: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        _LIVE.add(self)  # see _forget_pools

    def __repr__(self) -> str:
        state = "loaded" if self._model is not None else "not loaded"
        return f"OnnxInt8Embedder({self._label!r}, {state})"

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = self._pooling_dim()
        return self._dim

    @property
    def max_seq_length(self) -> int:
        if self._max_seq_length is None:
            folder = self._model_folder()
            config = _read_json(folder / "sentence_bert_config.json") or {}
            bert = _read_json(folder / "config.json") or {}
            length = config.get("max_seq_length") if isinstance(config, dict) else None
            if not isinstance(length, int):
                length = bert.get("max_position_embeddings", 512) if isinstance(bert, dict) else 512
            self._max_seq_length = int(length)
        return self._max_seq_length

    @property
    def model_path(self) -> Path:
        """The int8 ONNX file, built now if this machine has none yet."""
        from rag.embedders.onnx_export import int8_model

        self._need("onnx")
        return int8_model(self._model_folder(), self._label.replace("/", "--"), self.cache_dir)

    def _load(self) -> Any:
        ort = self._need("onnxruntime")
        self._pooling_dim()
        path = self.model_path
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # texts run in parallel instead; see the class docstring
        options.inter_op_num_threads = 1
        # Idle threads sleep rather than spin, for the reason rag.embedders.openmp_env gives.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types
            raise EmbedderError(f"cannot load the ONNX model {str(path)!r}: {one_line(exc)}") from exc

    @staticmethod
    def _need(module: str) -> Any:
        import importlib

        try:
            return importlib.import_module(module)
        except ImportError as exc:
            raise EmbedderError(f"the onnx-int8 embedder needs {module}: {_EXTRA}") from exc

    def _model_folder(self) -> Path:
        folder = self._folder(must_exist=True)
        if folder is None:
            raise EmbedderError(
                f"the onnx-int8 embedder needs a local model folder, not the hub id {str(self._spec)!r}")
        return folder

    def _pooling_dim(self) -> int:
        """The output size, after checking the model is Transformer + mean Pooling (+ Normalize)."""
        folder = self._model_folder()
        modules = _read_json(folder / "modules.json")
        kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules] if isinstance(modules, list) else []
        pooling = None
        if "Pooling" in kinds and set(kinds) <= {"Transformer", "Pooling", "Normalize"}:
            pooling = _read_json(folder / str(modules[kinds.index("Pooling")].get("path", "")) / "config.json")
        modes = [k for k, v in pooling.items() if k.startswith("pooling_mode_") and v is True] if isinstance(
            pooling, dict) else []
        if modes != ["pooling_mode_mean_tokens"] or not isinstance(pooling.get("word_embedding_dimension"), int):  # type: ignore[union-attr]
            raise EmbedderError(f"the onnx-int8 embedder runs Transformer + mean Pooling models only, "
                                f"and {self._shown!r} is not one")
        return int(pooling["word_embedding_dimension"])  # type: ignore[index]

    def _make_tokenizer(self) -> Any:
        from tokenizers import Tokenizer

        path = self._model_folder() / "tokenizer.json"
        try:
            tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:
            raise EmbedderError(f"the onnx-int8 embedder needs the model's tokenizer.json: {one_line(exc)}") from exc
        tokenizer.no_truncation()
        tokenizer.no_padding()
        return tokenizer

    def _embed(self, texts: Sequence[str], progress: bool) -> np.ndarray:
        if self._truncating is None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_str(self.tokenizer.to_str())
            tokenizer.enable_truncation(self.max_seq_length)  # as sentence-transformers cuts
            self._truncating = tokenizer
        encodings = self._truncating.encode_batch(list(texts)) if texts else []
        return encode_batched(encodings, self._run, self.dim, self.batch_size, progress, f"embedding ({self.name})")

    def _run(self, batch: list[Any]) -> np.ndarray:
        threads = self.threads or usable_cpus()
        if min(len(batch), threads) <= 1:
            return np.concatenate([self._run_padded([enc]) for enc in batch])
        if self._pool is None:
            with self._pool_lock:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(threads, thread_name_prefix="onnx-int8")
        # onnxruntime releases the GIL while it runs, and a session may run on several threads.
        return np.concatenate(list(self._pool.map(lambda enc: self._run_padded([enc]), batch)))

    def _run_padded(self, batch: list[Any]) -> np.ndarray:
        """Mean-pooled vectors of ``batch`` run as one tensor padded to its longest text."""
        session = self.load()
        width = max(len(e.ids) for e in batch)
        ids = np.zeros((len(batch), width), dtype=np.int64)
        mask = np.zeros((len(batch), width), dtype=np.int64)
        for row, enc in enumerate(batch):
            ids[row, : len(enc.ids)] = enc.ids
            mask[row, : len(enc.ids)] = 1
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        try:
            hidden = session.run(None, feed)[0]
        except Exception as exc:  # onnxruntime raises its own exception types
            raise EmbedderError(f"embedding with {self.name!r} failed: {one_line(exc)}") from exc
        weights = mask[..., None].astype(np.float32)
        return (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)


_LIVE: weakref.WeakSet[OnnxInt8Embedder] = weakref.WeakSet()


def _forget_pools() -> None:
    """In a forked child: none of the parent's threads exist, so each embedder starts its own."""
    for embedder in list(_LIVE):
        embedder._pool = None
        embedder._pool_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pools)
