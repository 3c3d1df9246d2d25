"""Connecting to Milvus, and its errors in the terms of :mod:`rag.errors`.

pymilvus and gRPC errors are raised as :class:`~rag.errors.BackendUnavailable` (cannot
connect, or credentials refused), :class:`~rag.errors.BackendTimeout` or
:class:`~rag.errors.BackendError`; a Milvus Lite file held by another process is
:class:`~rag.errors.DataDirLocked`.

Example::

    with calling(describe("http://root:pw@milvus:19530"), "search 'chunks'"):
        client.search(...)        # errors name "Milvus at http://milvus:19530"
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
from pymilvus import MilvusClient
from pymilvus.exceptions import MilvusException

from rag.errors import (
    BackendError,
    BackendTimeout,
    BackendUnavailable,
    DataDirLocked,
    RagError,
)

__all__ = ["calling", "describe", "is_lite", "open_client", "translate_error"]

_CONNECTION_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED,
                     grpc.StatusCode.PERMISSION_DENIED}


def is_lite(uri: str) -> bool:
    """Whether ``uri`` is a Milvus Lite file rather than a server URL."""
    return "://" not in uri


def describe(uri: str) -> str:
    """How errors name the server: its URI without credentials."""
    return f"Milvus at {re.sub(r'//[^/@]*@', '//', uri)}"


@contextlib.contextmanager
def calling(where: str, action: str) -> Iterator[None]:
    """Raise driver errors inside the block as :mod:`rag.errors`, saying what failed."""
    try:
        yield
    except RagError:
        raise
    except (MilvusException, grpc.RpcError) as exc:
        raise translate_error(exc, f"{where}: cannot {action}") from exc


def translate_error(exc: Exception, context: str) -> BackendError:
    code: Any = exc.code() if isinstance(exc, grpc.RpcError) else getattr(exc, "code", None)
    cause = exc.__cause__
    if not isinstance(code, grpc.StatusCode) and isinstance(cause, grpc.RpcError):
        code = cause.code()
    message = exc.details() if isinstance(exc, grpc.RpcError) else getattr(exc, "message", "") or str(exc)
    text = f"{context}: {message}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED or "timeout" in message.lower():
        return BackendTimeout(text)
    if code in _CONNECTION_CODES or code == 2 or "Fail connecting" in message:
        return BackendUnavailable(text)
    return BackendError(text)


def open_client(uri: str, token: str | None, timeout_s: float) -> MilvusClient:
    """A client of the server, or of the Milvus Lite file (whose folder is made first)."""
    lite = is_lite(uri)
    if lite:
        Path(uri).expanduser().parent.mkdir(parents=True, exist_ok=True)
    try:
        with calling(describe(uri), "connect"):
            return MilvusClient(uri=uri, token=token or "", timeout=timeout_s)
    except BackendError as exc:
        if lite and _lite_file_locked(uri):
            raise DataDirLocked(
                f"Milvus Lite file {uri} is open in another process (Milvus Lite "
                "allows one process per file); stop it, or run a Milvus server. While `ragqa serve` "
                "holds it, reindex through the server: `ragqa serve --with-scheduler`, or "
                "POST /v1/sources/<name>/reindex with an admin key"
            ) from exc
        raise


def _lite_file_locked(uri: str) -> bool:
    """Whether another process holds Milvus Lite's lock on its data folder (Unix only)."""
    lock = Path(uri).expanduser() / "LOCK"
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        return False
    try:
        with open(lock, "rb") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
    except OSError:
        return False
    return False
