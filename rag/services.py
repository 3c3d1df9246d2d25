"""Builds every component from ``Settings``, in one place, lazily.

Nothing connects or loads a model until it is first used, so ``ragqa status`` stays fast
and a broken backend only fails the commands that need it.

With ``embedder.backend: auto`` (the default) the first ingest chooses the embedding model
from the language of the first documents it reads (:meth:`Services.choose_embedder`): the
English MiniLM, int8 on onnxruntime (fp32 on torch when onnxruntime is missing), for an
English corpus, the multilingual USE when at least :data:`AUTO_MULTILINGUAL_SHARE` of them are
Chinese. The choice is recorded in the state and never changes on an existing index (one built
before ``auto`` recorded choices keeps the model it was built with); ``ragqa status`` shows it
and why.

The ingestion state (:class:`rag.types.IndexState`: stored chunks, the embedder choice, the
change log) belongs to ``ingest``, above the core: ``Services`` takes a factory for it, and
``ingest.services.open_services`` passes the SQLite one.

Example::

    services = open_services(Settings.load())  # from ingest.services
    with services.write_lock():
        report = reindex(services, "docs", "incremental")
    services.close()
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import cached_property
from pathlib import Path

import numpy as np
from filelock import FileLock, Timeout

from rag.config import EmbedderSettings, Settings
from rag.errors import ConfigError, DataDirLocked
from rag.types import Chunk, Embedder, Filters, Generator, Hit, IndexState, Lease, LexicalIndex, VectorIndex

__all__ = ["AUTO_BACKENDS", "AUTO_MULTILINGUAL_SHARE", "Services"]

AUTO_BACKENDS = {"en": "onnx-int8", "multilingual": "use"}
"""What ``embedder.backend: auto`` becomes: MiniLM for English corpora (the best measured on
English: Cranfield, XQuAD-en), as int8 ONNX (3.7-5.4 times faster to embed than fp32, no
significant retrieval or answer difference: ``bench/RESULTS-onnx.md``; fp32 when onnxruntime is
missing, :func:`rag.embedders.auto_english_backend`), USE for Chinese and mixed ones (MiniLM
ranks Chinese close to randomly); see ``evals/RESULTS-retrieval.md``."""
#: The embedder (``Embedder.name``) an index was built with before ``auto`` recorded its choice,
#: and the backend that index keeps.
BUILT_WITH = {"st:all-MiniLM-L6-v2": "sentence-transformers", "onnx-int8:all-MiniLM-L6-v2": "onnx-int8",
              "use:multilingual-v3": "use"}
AUTO_MULTILINGUAL_SHARE = 0.1
"""The share of Chinese documents from which ``auto`` chooses the multilingual model."""
AUTO_META = "embedder_choice"


class _NoVectors:
    """The vector index before ``auto`` has chosen a model: empty, and it writes nothing."""

    def upsert(self, chunks: Sequence[Chunk], vectors: np.ndarray) -> None:
        raise ConfigError("no embedding model is chosen yet: the first ingest chooses it (embedder.backend auto)")

    def delete_documents(self, doc_ids: Iterable[str]) -> None:
        return None

    def delete_chunks(self, chunk_ids: Iterable[str]) -> None:
        return None

    def search(self, vector: np.ndarray, k: int = 10, filters: Filters | None = None) -> list[Hit]:
        return []

    def get_vectors(self, chunk_ids: Sequence[str]) -> dict[str, np.ndarray]:
        return {}

    def count(self) -> int:
        return 0

    def chunk_ids(self, source: str | None = None) -> set[str]:
        return set()

    def close(self) -> None:
        return None


NO_VECTORS: VectorIndex = _NoVectors()


class Services:
    """The components of one ragqa deployment, built from its settings on first use."""

    def __init__(self, settings: Settings, embedder: Embedder | None = None,
                 generator: Generator | None = None,
                 state: Callable[[Settings], IndexState] | None = None,
                 shared_lock: Callable[[Settings], Lease | None] | None = None) -> None:
        self.settings = settings
        self._state_factory = state
        self._shared_lock_factory = shared_lock
        self._shared_lock: Lease | None = None
        self.data_dir = Path(settings.data_dir)
        self._embedder = embedder
        self._generator = generator
        self._profile_generators: dict[str, Generator] = {}  # the other profiles', built on first use
        self._given = embedder is not None  # a given embedder is never replaced by the auto choice
        self._choice: dict[str, str] | None = None  # auto: the recorded choice, once read
        self._lock = FileLock(str(self.data_dir / "write.lock"), thread_local=False)

    # -- the write lock -------------------------------------------------------------------
    @contextlib.contextmanager
    def write_lock(self) -> Iterator[None]:
        """Hold the data directory for writing, and the shared state's write lock when the
        state is shared (PostgreSQL): a second writer, here or on another instance, gets
        ``DataDirLocked``."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise DataDirLocked(
                f"data directory {self.data_dir} is locked by another ragqa process "
                "(a reindex or the scheduler is running); try again when it finishes"
            ) from None
        try:
            shared = self._shared_write_lock()
            if shared is not None and not shared.try_acquire():
                raise DataDirLocked(
                    "the shared state is locked by another ragqa instance (a reindex or its scheduler "
                    "is running); try again when it finishes")
            try:
                yield
            finally:
                if shared is not None:
                    shared.release()
        finally:
            self._lock.release()

    def _shared_write_lock(self) -> Lease | None:
        if self._shared_lock is None and self._shared_lock_factory is not None:
            self._shared_lock = self._shared_lock_factory(self.settings)
            self._shared_lock_factory = None
        return self._shared_lock

    # -- components -----------------------------------------------------------------------
    @cached_property
    def state(self) -> IndexState:
        """The ingestion state, opened on first use by the ``state`` factory given."""
        if self._state_factory is None:
            raise ConfigError("these services were built without the ingestion state: "
                              "build them with ingest.services.open_services(settings)")
        return self._state_factory(self.settings)

    @property
    def shared_state(self) -> bool:
        """Whether the ingestion state is a database named by ``state.url`` (shared by every
        instance), rather than the data directory's own ``state.db``."""
        return self.settings.state.url is not None

    @property
    def servers_only(self) -> bool:
        """Whether every index a question reads is a server that returns whole chunks:
        Elasticsearch, a Milvus server, and no local vector store."""
        s = self.settings
        return (s.lexical.backend == "elasticsearch" and s.vector.backend == "milvus"
                and "://" in s.milvus_uri and not self.local_vector_cache)

    @property
    def query_state(self) -> IndexState | None:
        """The ingestion state as answering reads it (the cache's change log, the ``auto``
        embedder's choice, text for hits that carry only ids), or ``None`` when this process
        has none to read: on the servers-only settings (:attr:`servers_only`) with no shared
        state (``state.url``) and no ``state.db`` in the data directory, or built with no state
        factory. Such a process answers without a data directory: hits carry their text, a
        Redis answer cache gets the change log from the ingesting process
        (:func:`rag.cache.push_changes`), and the embedder must be named in the settings."""
        if "state" not in self.__dict__ and self.servers_only and (
                self._state_factory is None  # built without one (a library user's Services)
                or (not self.shared_state and not (self.data_dir / "state.db").exists())):
            return None
        return self.state

    @property
    def embedder(self) -> Embedder:
        """The configured embedder; with ``auto``, the recorded choice (the English one until there is one)."""
        if self._embedder is not None and not self._given and self._auto and self._choice is None:
            if self.embedder_choice() is not None:  # chosen since, here or by another process
                self._reset_embedder()
        if self._embedder is None:
            from rag.embedders import make_embedder

            self._embedder = make_embedder(self.embedder_settings)
        return self._embedder

    @property
    def embedder_settings(self) -> EmbedderSettings:
        """The embedder's settings with ``auto`` resolved."""
        cfg = self.settings.embedder
        if cfg.backend != "auto":
            return cfg
        choice = self.embedder_choice()  # None also when a model folder or hub id is named:
        if choice:  # then a sentence-transformers one
            return cfg.model_copy(update={"backend": choice["backend"]})
        return cfg if cfg.model is not None else cfg.model_copy(update={"backend": self._auto_backend("en")})

    @staticmethod
    def _auto_backend(kind: str) -> str:
        """:data:`AUTO_BACKENDS`'s model for ``kind``, if it is installed (int8 MiniLM needs onnxruntime)."""
        backend = AUTO_BACKENDS[kind]
        if backend == "onnx-int8":
            from rag.embedders import auto_english_backend

            return auto_english_backend()
        return backend

    @property
    def _auto(self) -> bool:
        """``embedder.backend: auto`` with no model named: the first ingest chooses the model."""
        return self.settings.embedder.backend == "auto" and self.settings.embedder.model is None

    def embedder_choice(self) -> dict[str, str] | None:
        """With ``auto``: ``{"backend", "reason"}`` as recorded by the first ingest, else ``None``.
        Until there is one, every call reads the state (one meta row), so a choice made by
        another process is seen at once; after it, none does."""
        if not self._auto:
            return None
        if self._choice is None:
            state = self.query_state
            if state is None:
                raise ConfigError(
                    "embedder.backend is auto, but this process has no ingestion state to read the "
                    f"embedder chosen by the first ingest from ({self.data_dir / 'state.db'} does not exist): "
                    "set state.url to the database the ingest wrote, or name the embedder "
                    "(embedder.backend) the index was built with")
            raw = state.get_meta(AUTO_META)
            self._choice = json.loads(raw) if raw else self._built_with(state.get_meta("embedder"))
        return self._choice

    @staticmethod
    def _built_with(recorded: str | None) -> dict[str, str] | None:
        """The choice of an index built before ``auto`` recorded one, from the embedder it was
        built with (the ``embedder`` meta row, ``<name>:<dim>``): it keeps that model."""
        name = recorded.rsplit(":", 1)[0] if recorded else ""
        backend = BUILT_WITH.get(name)
        return {"backend": backend, "reason": f"the index was built with {name}"} if backend else None

    @property
    def embedder_undecided(self) -> bool:
        """``auto`` with no choice yet: the next ingest makes it from its first documents."""
        return not self._given and self._auto and self.embedder_choice() is None

    def choose_embedder(self, langs: Sequence[str]) -> dict[str, str]:
        """With ``auto``: choose the embedder from ``langs``, the languages of a corpus's first
        documents (``Document.lang``), record the choice and use it from now on. Returns
        ``{"backend", "reason"}``."""
        known = [lang for lang in langs if lang in ("en", "zh")]
        share = known.count("zh") / len(known) if known else 0.0
        multilingual = share >= AUTO_MULTILINGUAL_SHARE
        backend = self._auto_backend("multilingual" if multilingual else "en")
        reason = (f"chosen at the first ingest: {share:.0%} of its first {len(langs)} documents are Chinese "
                  f"({'at least' if multilingual else 'under'} {AUTO_MULTILINGUAL_SHARE:.0%})")
        choice = {"backend": backend, "reason": reason}
        self.state.set_meta(AUTO_META, json.dumps(choice))
        self._choice = choice
        if not self._given:
            self._reset_embedder()
        return choice

    def _reset_embedder(self) -> None:
        """Drop the embedder and the vector stores sized for it; they are rebuilt on next use."""
        self._embedder = None
        for name in ("_vector", "_vector_cache"):
            component = self.__dict__.pop(name, None)
            if component is not None:
                with contextlib.suppress(Exception):
                    component.close()

    @cached_property
    def lexical(self) -> LexicalIndex:
        cfg = self.settings.lexical
        if cfg.backend == "tantivy":
            from rag.lexical.tantivy_index import TantivyIndex

            return TantivyIndex(self.settings.lexical_path)
        if cfg.backend == "elasticsearch":
            from rag.lexical.elasticsearch import ElasticsearchIndex

            urls = [u.strip() for u in (cfg.url or "").split(",") if u.strip()]
            return ElasticsearchIndex(
                urls if len(urls) > 1 else urls[0], cfg.index,
                api_key=cfg.api_key.get_secret_value() if cfg.api_key else None,
                username=cfg.username,
                password=cfg.password.get_secret_value() if cfg.password else None,
                ca_certs=str(cfg.ca_certs) if cfg.ca_certs else None, verify_certs=cfg.verify_certs,
                request_timeout=cfg.request_timeout_s, max_retries=cfg.max_retries,
                query_timeout=cfg.query_timeout_s,
            )
        raise ConfigError(f"unknown lexical backend {cfg.backend!r}")

    @property
    def vector(self) -> VectorIndex:
        """The vector index. With ``auto`` and no model chosen yet, an empty stand-in: opening
        the real index would fix its vector size to a model the first ingest may not choose."""
        return NO_VECTORS if self.embedder_undecided else self._vector

    @cached_property
    def _vector(self) -> VectorIndex:
        cfg = self.settings.vector
        if cfg.backend == "numpy":
            return self._vector_cache
        if cfg.backend == "milvus":
            # gRPC's own logging (keepalive chatter with Milvus Lite) is noise on stderr.
            os.environ.setdefault("GRPC_VERBOSITY", "NONE")
            from rag.vectors.milvus import MilvusVectorIndex

            uri = self.settings.milvus_uri
            if "://" not in uri:
                Path(uri).parent.mkdir(parents=True, exist_ok=True)
            token = cfg.token.get_secret_value() if cfg.token else None
            return MilvusVectorIndex(uri, cfg.collection, self.embedder.dim, token=token)
        raise ConfigError(f"unknown vector backend {cfg.backend!r}")

    @property
    def generator(self) -> Generator:
        """The configured generator, not yet started (``await generator.start()``)."""
        if self._generator is None:
            from rag.generators import make_generator

            self._generator = make_generator(self.settings.generator)
        return self._generator

    def profile_generator(self, name: str) -> Generator:
        """The generator of profile ``name`` (``default`` is :attr:`generator`), built on first
        use and not started; an unknown name is a ``ConfigError`` naming the known ones."""
        if name == "default":
            return self.generator
        built = self._profile_generators
        if name not in built:
            cfg = self.settings.profiles.get(name)
            if cfg is None:
                known = ", ".join(["default", *self.settings.profiles])
                raise ConfigError(f"no generator profile named {name!r} (known: {known})")
            from rag.generators import make_generator

            built[name] = make_generator(cfg)
        return built[name]

    @property
    def vector_cache(self) -> VectorIndex | None:
        """The local exact vector store used for reranking, or ``None`` when turned off (an
        empty stand-in until ``auto`` has chosen the model, as for :attr:`vector`)."""
        if not self.local_vector_cache:
            return None
        return NO_VECTORS if self.embedder_undecided else self._vector_cache

    @property
    def local_vector_cache(self) -> bool:
        """Whether a local exact vector store sits beside the vector index (``vector.cache``).
        Unset, it is on with Milvus Lite, whose fetch by id is 30-50 times slower, and off with
        a Milvus server, which answers the fetch itself, keeps every instance on the same
        vectors and needs no data directory (figures: bench/RESULTS-query-path.md)."""
        cfg = self.settings.vector
        if cfg.backend == "numpy":
            return True
        if cfg.cache is not None:
            return bool(cfg.cache)
        return "://" not in self.settings.milvus_uri

    @cached_property
    def _vector_cache(self) -> VectorIndex:
        return self._numpy_index()

    def _numpy_index(self) -> VectorIndex:
        from rag.vectors.numpy_index import NumpyVectorIndex

        self.data_dir.mkdir(parents=True, exist_ok=True)
        return NumpyVectorIndex(self.data_dir / "vectors.db", self.embedder.dim)

    def vector_indexes(self) -> list[VectorIndex]:
        """Every vector store that must receive writes (the index and, if separate, the cache)."""
        out = [self.vector]
        if self.vector_cache is not None and self.vector_cache is not self.vector:
            out.append(self.vector_cache)
        return out

    def read_fresh(self) -> None:
        """Another process changed the indexes (the answer cache saw its generation move): read
        them at once rather than at an eventually consistent level for a while (a Milvus
        server's Bounded reads), so no answer built on a replaced passage is cached."""
        for index in self.vector_indexes():
            wrote = getattr(index, "wrote", None)
            if callable(wrote):
                wrote()

    def indexes(self) -> dict[str, LexicalIndex | VectorIndex]:
        """Every index that must receive writes, by name: ``lexical``, ``vector`` and, when
        it is a separate store, ``vector_cache``."""
        names = ("vector", "vector_cache")
        return {"lexical": self.lexical, **dict(zip(names, self.vector_indexes(), strict=False))}

    def backend_names(self) -> dict[str, str]:
        s = self.settings
        vector = f"milvus ({s.milvus_uri})" if s.vector.backend == "milvus" else "numpy"
        lexical = (f"elasticsearch ({s.lexical.url}, alias {s.lexical.index})"
                   if s.lexical.backend == "elasticsearch" else f"tantivy ({s.lexical_path})")
        return {
            "lexical": lexical,
            "vector": vector,
            "vector_cache": "numpy (vectors.db)" if self.local_vector_cache else "off",
            "embedder": self._embedder_text(),
        }

    def _embedder_text(self) -> str:
        cfg = self.settings.embedder
        if not self._auto:
            return cfg.model or f"{cfg.backend} (default model)"
        try:
            choice = self.embedder_choice()
        except ConfigError as exc:  # no state to read it from: say so, as the vector index will
            return f"auto (unknown: {exc})"
        if choice is None:
            return "auto (not chosen yet: the first ingest chooses from its documents' language)"
        return f"auto: {choice['backend']}, {choice['reason']}"

    def close(self) -> None:
        for name in ("lexical", "_vector", "_vector_cache", "state"):
            component = self.__dict__.get(name)
            if component is not None:
                with contextlib.suppress(Exception):
                    component.close()
        close = getattr(self._embedder, "close", None)
        if close is not None and not self._given:  # a remote embedder's connections; a given one is the caller's
            with contextlib.suppress(Exception):
                close()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
