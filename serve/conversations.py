"""Conversation history for ``/v1/ask``'s ``conversation_id``, kept in this process's memory.

The chat route needs none: OpenAI clients send the whole conversation each time. The
native route sends only the new question, so the server remembers the last turns of
recent conversations (least recently used ones are dropped first). A conversation belongs
to the API key that started it: another key sending the same id starts its own.

Example::

    conversations = Conversations()
    cid = conversations.new_id()
    conversations.add(cid, "What is X?", "X is ... [1]")
    conversations.history(cid)   # [{"role": "user", ...}, {"role": "assistant", ...}]
"""

from __future__ import annotations

import secrets
from collections import OrderedDict

__all__ = ["Conversations"]


class Conversations:
    def __init__(self, max_conversations: int = 10_000, max_turns: int = 10) -> None:
        self.max_conversations = max_conversations
        self.max_turns = max_turns
        self._turns: OrderedDict[tuple[str | None, str], list[dict[str, str]]] = OrderedDict()

    @staticmethod
    def new_id() -> str:
        return "conv-" + secrets.token_urlsafe(12)

    def history(self, conversation_id: str, owner: str | None = None) -> list[dict[str, str]]:
        turns = self._turns.get((owner, conversation_id))
        if turns is None:
            return []
        self._turns.move_to_end((owner, conversation_id))
        return list(turns)

    def add(self, conversation_id: str, question: str, answer: str, owner: str | None = None) -> None:
        turns = self._turns.setdefault((owner, conversation_id), [])
        turns += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        del turns[: max(0, len(turns) - 2 * self.max_turns)]
        self._turns.move_to_end((owner, conversation_id))
        while len(self._turns) > self.max_conversations:
            self._turns.popitem(last=False)
