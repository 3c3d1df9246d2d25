"""Data types and the small Protocols every backend implements.

The dataclasses are frozen: a ``Chunk`` that reached an index is never mutated in place,
it is replaced. The Protocols are deliberately small so that an embedded backend, an
Elasticsearch cluster and a Milvus cluster can all satisfy them, and one shared test
suite (``tests/backend_suite.py``) runs against each.

Example::

    from rag.types import Chunk, Filters
    chunk = Chunk(id="c1", doc_id="d1", source="docs", text="Hello", hash="...")
    hits = lexical_index.search("hello", k=5, filters=Filters(source=("docs",)))
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "Trust",
    "Document",
    "Chunk",
    "Hit",
    "Filters",
    "Citation",
    "Answer",
    "GenerationParams",
    "Warmable",
    "GenerationDelta",
    "Passage",
    "Prompt",
    "LexicalIndex",
    "VectorIndex",
    "Embedder",
    "Reranker",
    "TokenCounter",
    "Generator",
    "AnswerCache",
    "CacheGenerations",
    "ChangeLog",
    "IndexState",
    "IndexChange",
]


class Trust(enum.IntEnum):
    """How far a source is trusted. Filters compare with ``>=`` (``min_trust``)."""

    low = 0
    normal = 1
    high = 2

    @classmethod
    def parse(cls, value: str | int | Trust) -> Trust:
        if isinstance(value, Trust):
            return value
        if isinstance(value, int):
            return cls(value)
        try:
            return cls[str(value).strip().lower()]
        except KeyError:
            raise ValueError(f"trust must be one of high, normal, low (got {value!r})") from None


@dataclass(frozen=True, slots=True)
class Document:
    """One source document after extraction, before chunking.

    ``text`` is the normalised text that is hashed and indexed; markup and boilerplate
    such as "Last updated on ..." footers are already gone.

    Example::

        Document(id="docs:readme.md", source="docs", url="file:///srv/docs/readme.md",
                 title="Readme", text="# Readme\\n...", lang="en")
    """

    id: str
    source: str
    url: str
    title: str
    text: str
    lang: str = "und"
    published: datetime | None = None
    modified: datetime | None = None
    fetched_at: datetime | None = None
    trust: Trust = Trust.normal
    tags: tuple[str, ...] = ()
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class Chunk:
    """A passage of a document, the unit that is indexed and retrieved.

    ``id`` is stable for the same document and text; ``hash`` identifies the text alone, so
    an embedding can be reused wherever the same text appears again.

    Example::

        Chunk(id="9f2c...", doc_id="docs:readme.md", source="docs", text="...", hash="ab12...")
    """

    id: str
    doc_id: str
    source: str
    text: str
    hash: str
    ordinal: int = 0
    title: str = ""
    url: str = ""
    heading: str = ""
    lang: str = "und"
    published: datetime | None = None
    modified: datetime | None = None
    trust: Trust = Trust.normal
    tags: tuple[str, ...] = ()
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class Hit:
    """A scored search result. ``chunk`` is filled when the backend stores the text."""

    chunk_id: str
    score: float
    doc_id: str = ""
    chunk: Chunk | None = None
    explain: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Filters:
    """Metadata filters, one typed object that every backend translates to its own language.

    Empty fields do not filter. Ranges are inclusive. Build from user input with
    :func:`rag.filters.parse_filters`, which validates and raises ``FilterError``.

    Example::

        Filters(source=("pydocs",), modified_from=datetime(2024, 1, 1, tzinfo=UTC),
                min_trust=Trust.normal)
    """

    source: tuple[str, ...] = ()
    tenant: str | None = None
    tags: tuple[str, ...] = ()
    lang: tuple[str, ...] = ()
    published_from: datetime | None = None
    published_to: datetime | None = None
    modified_from: datetime | None = None
    modified_to: datetime | None = None
    min_trust: Trust | None = None

    def is_empty(self) -> bool:
        return self == Filters()


@dataclass(frozen=True, slots=True)
class Citation:
    """A numbered source of an answer."""

    label: int
    chunk_id: str
    doc_id: str
    title: str
    url: str
    modified: datetime | None = None
    snippet: str = ""
    inferred: bool = False  # the model did not write this label: a sentence's best-supporting passage
    source: str = ""  # the source (``ragqa sources``) the passage came from


@dataclass(frozen=True, slots=True)
class Answer:
    """A generated (or extracted) answer with the sources it cites."""

    text: str
    citations: tuple[Citation, ...] = ()
    degraded: bool = False
    cache: str = "miss"
    timings: dict[str, float] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    """The profile, model, quantization, prompt version, route and experiment arm (rag/answer.py)."""


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """Sampling settings of one generation. ``stop`` strings end it and are not returned."""

    temperature: float = 0.3
    top_p: float = 0.9
    max_tokens: int = 512
    repetition_penalty: float = 1.2
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False  # ask for the answer tokens' log-probabilities where they cost the backend


@dataclass(frozen=True, slots=True)
class GenerationDelta:
    """One streamed piece of a generation; the last one carries ``finish_reason`` and usage.

    ``finish_reason`` is ``"stop"`` (end of answer or a stop string), ``"length"``
    (``max_tokens`` reached) or ``"abort"`` (cancelled).

    ``logprob`` and ``min_logprob`` (final delta only; ``None`` when the generator cannot say)
    are the mean and the lowest natural-log probability the model gave the answer tokens it
    sampled, from its own distribution before temperature, penalties and truncation: the
    answer's confidence, which the cascade (``routing.min_confidence``) reads. Both are <= 0.
    """

    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    logprob: float | None = None
    min_logprob: float | None = None


@dataclass(frozen=True, slots=True)
class Passage:
    """A packed context chunk with its citation label (``[label]`` in the prompt)."""

    label: int
    chunk: Chunk
    tokens: int = 0
    score: float = 0.0


@dataclass(frozen=True, slots=True)
class Prompt:
    """What a generator answers: chat messages, plus the parts they were built from.

    ``messages`` are OpenAI-style ``{"role", "content"}`` dicts (system first). A generator
    with a chat template applies it to them; one without renders ``completion`` instead,
    a plain-text prompt ending where the answer starts. The extractive generator ignores
    both and answers from ``question`` and ``passages``.

    Example::

        Prompt(messages=({"role": "system", "content": "..."}, {"role": "user", "content": "..."}),
               completion="...Answer:", question="What is X?", passages=(passage,), lang="en")
    """

    messages: tuple[dict[str, str], ...]
    completion: str = ""
    question: str = ""
    passages: tuple[Passage, ...] = ()
    lang: str = "en"
    stop: tuple[str, ...] = ()


@runtime_checkable
class LexicalIndex(Protocol):
    """A keyword (BM25) index of chunks."""

    def upsert(self, chunks: Sequence[Chunk]) -> None: ...

    def delete_documents(self, doc_ids: Iterable[str]) -> None: ...

    def delete_chunks(self, chunk_ids: Iterable[str]) -> None: ...

    def search(self, query: str, k: int = 10, filters: Filters | None = None) -> list[Hit]: ...

    def count(self) -> int: ...

    def chunk_ids(self, source: str | None = None) -> set[str]: ...

    def close(self) -> None: ...


@runtime_checkable
class VectorIndex(Protocol):
    """A store of chunk vectors with filtered nearest-neighbour search and fetch by id."""

    def upsert(self, chunks: Sequence[Chunk], vectors: np.ndarray) -> None: ...

    def delete_documents(self, doc_ids: Iterable[str]) -> None: ...

    def delete_chunks(self, chunk_ids: Iterable[str]) -> None: ...

    def search(self, vector: np.ndarray, k: int = 10, filters: Filters | None = None) -> list[Hit]: ...

    def get_vectors(self, chunk_ids: Sequence[str]) -> dict[str, np.ndarray]: ...

    def count(self) -> int: ...

    def chunk_ids(self, source: str | None = None) -> set[str]: ...

    def close(self) -> None: ...


@runtime_checkable
class Embedder(Protocol):
    """Turns text into unit-length float32 vectors.

    ``languages`` are the languages (``"en"``, ``"zh"``) the model ranks well, ``None`` for
    any: retrieval gives the vector leg no weight for a query in another language
    (:mod:`rag.lang`).
    """

    name: str
    languages: frozenset[str] | None

    @property
    def dim(self) -> int: ...  # read-only: an attribute or a property (loaded on first use)

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_query(self, text: str) -> np.ndarray: ...


@runtime_checkable
class Reranker(Protocol):
    """Reorders candidate hits for a query, best first.

    Hits arrive with their chunks (the text is what gets scored). The result holds the best
    ``top_n`` (all when ``None``), each with the reranker's score as ``score`` and also under
    its own key in ``explain`` (``cosine``, ``cohere``, ``cross_encoder``), keeping the keys
    the hits already had.
    """

    name: str

    def rerank(self, query: str, hits: Sequence[Hit], top_n: int | None = None) -> list[Hit]: ...


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens the way a model does, to keep prompts inside its budget."""

    def count_tokens(self, text: str) -> int: ...


@runtime_checkable
class Generator(Protocol):
    """Streams an answer for a prompt, token by token.

    ``stream`` is an async generator of text deltas; the last delta has ``finish_reason``
    and the token counts. Closing the iterator early (``aclose()``, or the consumer being
    cancelled) aborts the request in the engine. ``count_tokens`` uses the model's own
    tokenizer and ``context_window`` is the model's length limit in tokens, so the context
    packer can keep the prompt inside it. ``start()`` loads the model or checks the server,
    raising one clear ``ConfigError``/``BackendUnavailable`` line; ``close()`` frees it.

    Example::

        async for delta in generator.stream(prompt, GenerationParams(max_tokens=64)):
            print(delta.text, end="")
    """

    name: str
    context_window: int

    def stream(self, prompt: Prompt, params: GenerationParams) -> AsyncIterator[GenerationDelta]: ...

    def count_tokens(self, text: str) -> int: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class Warmable(Protocol):
    """A generator that can read a prompt's static head (the system message) ahead of time, so
    that requests starting with it read only what follows (the llamacpp generator)."""

    async def warm(self, prompt: Prompt) -> None: ...


@dataclass(frozen=True, slots=True)
class IndexChange:
    """One entry of the index's change log (:class:`ChangeLog`): what a reindex did to one
    document (``kind="chunks"``), or an operator's purge of a source's answers (``"purge"``,
    ``source=""`` for all of them)."""

    seq: int
    source: str
    kind: Literal["chunks", "purge"] = "chunks"
    removed: tuple[str, ...] = ()  # chunk ids no longer indexed: their text changed, or went
    added: int = 0  # chunks new to the index (a new document, or new text in a changed one)


@runtime_checkable
class ChangeLog(Protocol):
    """What the answer cache reads of ingestion: the log of changes to the indexes, in order.
    ``ingest.state.StateDB`` writes it in the same transaction as the chunks it describes."""

    log_id: str  # names the log (a data directory's state), for stores that several logs feed

    def change_token(self) -> object:
        """Cheap (no query): differs from its last value after any write that may have logged a change."""
        ...

    def changes_since(self, seq: int) -> list[IndexChange]: ...

    def last_change(self) -> int: ...


class Lease(Protocol):
    """A lock that one holder among several processes, or several machines, holds at a time: a
    file lock on one machine, an advisory lock on a shared PostgreSQL state
    (``ingest.leader``). The scheduler's lease and the shared write lock are leases.

    Example::

        if lease.try_acquire():
            try:
                ...  # while lease.holds()
            finally:
                lease.release()
    """

    def try_acquire(self) -> bool:
        """Take the lease if nobody holds it; True when this object holds it now."""
        ...

    def holds(self) -> bool:
        """Whether this object still holds the lease (a lost connection loses it)."""
        ...

    def release(self) -> None: ...


@runtime_checkable
class IndexState(ChangeLog, Protocol):
    """What the core reads and writes of ingestion's state (:attr:`rag.services.Services.state`):
    the stored text of chunks, for hits whose index keeps only ids and vectors, a few named
    settings (the embedder chosen by the first ingest), and the change log. ``ingest.state.StateDB``
    implements it; ``ingest.services.open_services`` builds a ``Services`` with one.

    Example::

        state: IndexState = services.state
        chunks = state.get_chunks(["c1", "c2"])  # ids that are not stored are left out
    """

    def get_chunks(self, chunk_ids: Sequence[str]) -> dict[str, Chunk]: ...

    def get_meta(self, key: str) -> str | None: ...

    def set_meta(self, key: str, value: str) -> None: ...

    def close(self) -> None: ...


class CacheGenerations(NamedTuple):
    """An answer store's clock: ``now`` moves at every applied change; ``added`` is ``now``'s
    value at the last addition to the sources asked about. An entry stored at generation ``g``
    may be missing newer content when ``g < added``."""

    now: int
    added: int


@runtime_checkable
class AnswerCache(Protocol):
    """Stores answers (JSON-able dicts) for ``ttl_s``: by exact key, and, when put with a
    ``scope`` and a unit question vector, for :meth:`nearest` lookups within that scope
    (best first, cosine at least ``threshold``). Each answer records the chunks and sources it
    was built from (``deps``, ``sources``): :meth:`apply` drops the answers whose chunks a
    reindex removed, and notes the sources that gained chunks. See :mod:`rag.cache`."""

    def get(self, key: str, sources: Sequence[str] = ()) -> tuple[dict[str, Any] | None, CacheGenerations]:
        """The answer stored under ``key`` (or ``None``), and the clock, its ``added`` taken
        over ``sources`` (all of them when empty)."""
        ...

    def put(self, key: str, value: dict[str, Any], ttl_s: float | None = None, *,
            scope: str | None = None, vector: np.ndarray | None = None, deps: Sequence[str] = (),
            sources: Sequence[str] = (), generation: int | None = None) -> bool:
        """Store; refused (``False``) when the clock moved past ``generation`` since the lookup."""
        ...

    def nearest(self, scope: str, vector: np.ndarray, threshold: float,
                limit: int = 3) -> list[tuple[dict[str, Any], float]]: ...

    def apply(self, changes: Sequence[IndexChange]) -> int:
        """Apply changes of the log in order; returns how many answers were dropped."""
        ...

    def cursor(self, log_id: str) -> int | None:
        """The last sequence number of change log ``log_id`` applied, ``None`` if never."""
        ...

    def set_cursor(self, log_id: str, seq: int) -> None: ...

    def count(self, kind: str) -> None:
        """Count a lookup's outcome (hit, semantic, miss, stale) for :meth:`stats`."""
        ...

    def stats(self) -> dict[str, Any]: ...

    def clear(self) -> None: ...
