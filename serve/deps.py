"""What routes depend on, as ``Annotated`` aliases: the app's state and the caller.

``Caller`` is who is asking: the API key's id, tenant and scopes, checked (and rate
limited) by the app's :class:`~serve.auth.Gate`; with auth off, the anonymous caller with
every scope. Routes name the scope they need (``QueryCaller``, ``AdminCaller``) and pass
the caller's tenant and key id on.

Example::

    @router.get("/v1/sources")
    async def sources(state: State, caller: AdminCaller) -> list[SourceOut]: ...
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPBearer

from rag.answer import Answerer
from rag.config import Settings
from rag.services import Services
from rag.types import Filters
from serve.conversations import ConversationStore
from serve.errors import Forbidden
from serve.streams import StreamManager

if TYPE_CHECKING:
    from serve.auth import Gate
    from serve.qa_log import QALog

__all__ = ["AdminCaller", "AppState", "Caller", "GeneratorHealth", "QueryCaller", "State"]


@dataclass
class GeneratorHealth:
    """The generator's last known state: set at start-up, then by every answer."""

    state: str = "down"  # ready | down
    detail: str | None = "not started"


@dataclass
class AppState:
    settings: Settings
    services: Services
    answerer: Answerer
    streams: StreamManager
    conversations: ConversationStore
    gate: Gate
    generator: GeneratorHealth = field(default_factory=GeneratorHealth)
    qa_log: QALog | None = None  # serve.qa_log: the question-and-answer log


@dataclass(frozen=True)
class Caller:
    """The caller of a request: its key id (stream and conversation owner), tenant, scopes."""

    key_id: str | None = None
    tenant: str | None = None
    scopes: frozenset[str] = frozenset({"query", "admin"})

    def restrict(self, filters: Filters) -> Filters:
        """The filters with the caller's tenant enforced; a client can never widen it.

        Naming another tenant is a 403 rather than an answer quietly drawn from this one.
        """
        if self.tenant is None:
            return filters
        if filters.tenant is not None and filters.tenant != self.tenant:
            raise Forbidden(f"this API key is bound to tenant {self.tenant!r}; it cannot query tenant "
                            f"{filters.tenant!r}", "tenant_forbidden")
        return replace(filters, tenant=self.tenant)


def _state(request: Request) -> AppState:
    return request.app.state.ragqa


async def _state_dependency(request: Request) -> AppState:
    # async: FastAPI runs a plain ``def`` dependency in its thread pool, a thread hop per request
    return request.app.state.ragqa


# Only to document the two ways of sending a key in the OpenAPI schema (and /docs); the gate reads them.
_bearer, _api_key = HTTPBearer(auto_error=False), APIKeyHeader(name="X-API-Key", auto_error=False)


def _caller(scope: str):  # a dependency factory
    async def caller(request: Request, _b: Annotated[object, Depends(_bearer)],
                     _k: Annotated[object, Depends(_api_key)]) -> Caller:
        return await _state(request).gate.caller(request, scope)
    caller.__name__ = f"{scope}_caller"
    return caller


State = Annotated[AppState, Depends(_state_dependency)]
QueryCaller = Annotated[Caller, Depends(_caller("query"))]
AdminCaller = Annotated[Caller, Depends(_caller("admin"))]
