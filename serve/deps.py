"""What routes depend on, as ``Annotated`` aliases: the app's state and the caller.

``Caller`` is who is asking. Until API keys arrive every request is the anonymous caller
with every scope; routes already name the scope they need (``QueryCaller``,
``AdminCaller``) and pass the caller's tenant and key id on, so auth slots in here alone.

Example::

    @router.get("/v1/sources")
    async def sources(state: State, caller: AdminCaller) -> list[SourceOut]: ...
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Annotated

from fastapi import Depends, Request

from rag.answer import Answerer
from rag.config import Settings
from rag.services import Services
from rag.types import Filters
from serve.conversations import Conversations
from serve.streams import StreamManager

__all__ = ["AppState", "Caller", "State", "QueryCaller", "AdminCaller", "GeneratorHealth"]


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
    conversations: Conversations
    generator: GeneratorHealth = field(default_factory=GeneratorHealth)


@dataclass(frozen=True)
class Caller:
    """The caller of a request: its key id (stream and conversation owner), tenant, scopes."""

    key_id: str | None = None
    tenant: str | None = None
    scopes: frozenset[str] = frozenset({"query", "admin"})

    def restrict(self, filters: Filters) -> Filters:
        """The filters with the caller's tenant enforced; a client can never widen it."""
        return filters if self.tenant is None else replace(filters, tenant=self.tenant)


def _state(request: Request) -> AppState:
    return request.app.state.ragqa


def _caller(scope: str):  # a dependency factory
    async def caller(request: Request) -> Caller:
        return Caller()  # auth is not configured yet: everyone is the anonymous caller
    caller.__name__ = f"{scope}_caller"
    return caller


State = Annotated[AppState, Depends(_state)]
QueryCaller = Annotated[Caller, Depends(_caller("query"))]
AdminCaller = Annotated[Caller, Depends(_caller("admin"))]
