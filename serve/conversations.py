"""Conversation history for ``/v1/ask``'s ``conversation_id``: in this process's memory, or in
Redis so that a conversation continues on any worker or instance.

The chat route needs none: OpenAI clients send the whole conversation each time. The
native route sends only the new question, so the server remembers the last
``max_turns`` turns of recent conversations. A conversation belongs to the API key that
started it: another key sending the same id starts its own.

- :class:`Conversations` (no ``serve.redis_url``): the least recently used of more than
  ``max_conversations`` are dropped first.
- :class:`RedisConversations` (``serve.redis_url``): a Redis list per conversation, trimmed to
  ``max_turns`` turns, expiring ``ttl_s`` (``serve.conversation_ttl_s``) after its last
  turn. The worker keeps a copy of the conversations it served in memory (bounded the same
  way), so with Redis unreachable (0.5 s timeouts) a conversation goes on where it was last
  served, and ``conversation_store_fallbacks_total`` counts each such read or write.

Example::

    conversations = Conversations()
    cid = conversations.new_id()
    await conversations.add(cid, "What is X?", "X is ... [1]")
    await conversations.history(cid)   # [{"role": "user", ...}, {"role": "assistant", ...}]
"""

from __future__ import annotations

import json
import logging
import secrets
from collections import OrderedDict
from typing import Protocol

from rag.config import ServeSettings
from rag.metrics import CONVERSATION_STORE_FALLBACKS
from rag.redis_loop import LoopClients

__all__ = ["ConversationStore", "Conversations", "RedisConversations", "make_conversations"]

log = logging.getLogger("ragqa.serve.conversations")
Turn = dict[str, str]


class ConversationStore(Protocol):
    def new_id(self) -> str: ...

    async def history(self, conversation_id: str, owner: str | None = None) -> list[Turn]: ...

    async def add(self, conversation_id: str, question: str, answer: str, owner: str | None = None) -> None: ...


def new_conversation_id() -> str:
    return "conv-" + secrets.token_urlsafe(12)


class Conversations:
    """In this process's memory."""

    def __init__(self, max_conversations: int = 10_000, max_turns: int = 10) -> None:
        self.max_conversations = max_conversations
        self.max_turns = max_turns
        self._turns: OrderedDict[tuple[str | None, str], list[Turn]] = OrderedDict()

    new_id = staticmethod(new_conversation_id)

    async def history(self, conversation_id: str, owner: str | None = None) -> list[Turn]:
        turns = self._turns.get((owner, conversation_id))
        if turns is None:
            return []
        self._turns.move_to_end((owner, conversation_id))
        return list(turns)

    async def add(self, conversation_id: str, question: str, answer: str, owner: str | None = None) -> None:
        self.put(conversation_id, [*self._turns.get((owner, conversation_id), []), *_pair(question, answer)], owner)

    def put(self, conversation_id: str, turns: list[Turn], owner: str | None = None) -> None:
        """Replace a conversation's turns (the last ``max_turns``)."""
        self._turns[(owner, conversation_id)] = turns[-2 * self.max_turns:]
        self._turns.move_to_end((owner, conversation_id))
        while len(self._turns) > self.max_conversations:
            self._turns.popitem(last=False)


def _pair(question: str, answer: str) -> list[Turn]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


class RedisConversations:
    """In Redis, shared by every worker and instance (see the module docstring)."""

    def __init__(self, url: str, *, max_turns: int = 10, ttl_s: float = 86_400.0,
                 prefix: str = "ragqa:conv", max_conversations: int = 10_000) -> None:
        self.url, self.max_turns, self.ttl_s, self.prefix = url, max_turns, ttl_s, prefix
        self.local = Conversations(max_conversations, max_turns)
        self._redis = LoopClients(url, decode_responses=True, socket_connect_timeout=0.5, socket_timeout=0.5)

    new_id = staticmethod(new_conversation_id)

    def _key(self, conversation_id: str, owner: str | None) -> str:
        # Owners are key ids ([A-Za-z0-9_.-]); "" when auth is off. The id is the client's.
        return f"{self.prefix}:{owner or ''}:{conversation_id}"

    def _down(self, what: str, exc: Exception) -> None:
        CONVERSATION_STORE_FALLBACKS.labels(what).inc()
        log.warning("conversation store unavailable (%s), using this worker's copy: %s", what, exc)

    async def history(self, conversation_id: str, owner: str | None = None) -> list[Turn]:
        try:
            raw = await self._redis.client().lrange(self._key(conversation_id, owner), 0, -1)
        except Exception as exc:  # noqa: BLE001 - Redis down or hung: this worker's copy
            self._down("read", exc)
            return await self.local.history(conversation_id, owner)
        turns = [json.loads(item) for item in raw]
        self.local.put(conversation_id, turns, owner)
        return turns

    async def add(self, conversation_id: str, question: str, answer: str, owner: str | None = None) -> None:
        await self.local.add(conversation_id, question, answer, owner)
        key = self._key(conversation_id, owner)
        try:
            async with self._redis.client().pipeline(transaction=True) as pipe:
                pipe.rpush(key, *(json.dumps(turn, ensure_ascii=False) for turn in _pair(question, answer)))
                pipe.ltrim(key, -2 * self.max_turns, -1)
                pipe.pexpire(key, max(1, int(self.ttl_s * 1000)))
                await pipe.execute()
        except Exception as exc:  # noqa: BLE001 - kept in this worker's copy
            self._down("write", exc)

    async def aclose(self) -> None:
        await self._redis.aclose()


def make_conversations(serve: ServeSettings) -> ConversationStore:
    """Redis when ``serve.redis_url`` is set, else this process's memory."""
    if serve.redis_url:
        return RedisConversations(serve.redis_url, ttl_s=serve.conversation_ttl_s)
    return Conversations()
