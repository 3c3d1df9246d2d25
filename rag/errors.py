"""The error tree. Every error ragqa raises on purpose is a ``RagError``::

    RagError
    ├── ConfigError            bad settings, a bad YAML file, an unknown source name
    ├── FilterError            an invalid metadata filter (unknown field, bad date, from > to)
    ├── RequestError           a request outside the server's limits (temperature, max_tokens, ...)
    ├── DataDirLocked          another ragqa process holds the data directory
    ├── Overloaded             every answer slot is taken and the queue is full: try again later
    ├── IngestError            a source cannot be crawled at all
    │   └── FetchError         one URL or file could not be fetched (kept per page, not fatal)
    ├── EmbedderError          the embedding model cannot be loaded or run
    ├── RerankerError          the reranking model or API failed
    ├── GeneratorError         the language model cannot be loaded, or failed mid-answer
    └── BackendError           an index or service failed
        ├── BackendUnavailable     cannot connect, wrong credentials, not ready
        ├── BackendTimeout         the backend did not answer in time
        └── SchemaMismatch         an existing index or collection has another schema

Adapters translate driver exceptions at the boundary and raise these ``from`` the
original, so callers (the CLI, the scheduler, the HTTP layer) handle one tree.
"""

from __future__ import annotations

__all__ = [
    "RagError",
    "ConfigError",
    "FilterError",
    "RequestError",
    "DataDirLocked",
    "Overloaded",
    "IngestError",
    "FetchError",
    "EmbedderError",
    "RerankerError",
    "GeneratorError",
    "BackendError",
    "BackendUnavailable",
    "BackendTimeout",
    "SchemaMismatch",
]


class RagError(Exception):
    """Base of every error ragqa raises on purpose; its message is meant for a user."""


class ConfigError(RagError):
    """The configuration is invalid, or names something that does not exist."""


class FilterError(RagError, ValueError):
    """A metadata filter is invalid. Raised instead of returning an empty result."""


class RequestError(RagError, ValueError):
    """A request asks for more than the server allows; ``field`` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class DataDirLocked(RagError):
    """Another process is writing to the data directory."""


class IngestError(RagError):
    """A source cannot be crawled (its root is unreachable, its path does not exist)."""


class FetchError(IngestError):
    """One document could not be fetched. Recorded per page; it never deletes anything.

    ``kind`` names the failure for the ``crawl_errors_total`` metric: ``timeout``, ``slow``
    (a page that trickled past ``crawl.page_deadline_s``), ``connection`` (refused, reset,
    truncated), ``http``, ``too_large``, ``redirects``, ``robots``, ``unreadable`` (bytes that
    are not a document of their type), ``crashed`` (the page's extraction killed its worker
    process, ``crawl.extract_workers``).
    """

    def __init__(self, url: str, reason: str, status: int | None = None, kind: str = "unreadable") -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason
        self.status = status
        self.kind = kind


class EmbedderError(RagError):
    """The embedding model cannot be loaded or run."""


class RerankerError(RagError):
    """The reranking model or API failed."""


class GeneratorError(RagError):
    """The language model cannot be loaded, or failed mid-answer.

    A generator server that cannot be reached raises ``BackendUnavailable`` instead, so the
    caller can fall back to the extractive answerer.
    """


class BackendError(RagError):
    """An index, cache or model server failed."""


class BackendUnavailable(BackendError):
    """The backend cannot be reached, refused the credentials, or is not ready."""


class BackendTimeout(BackendError):
    """The backend did not answer within the configured timeout."""


class Overloaded(RagError):
    """Every answer slot is taken and the queue is full (:mod:`rag.admission`); ``retry_after_s``
    is when to try again."""

    def __init__(self, message: str, retry_after_s: float = 2.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class SchemaMismatch(BackendError):
    """An existing index or collection was created with another schema or dimension."""
