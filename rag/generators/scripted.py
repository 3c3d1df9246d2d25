"""A generator that replays the text you give it: for testing code that uses a ``Generator``.

It speaks the whole ``rag.types.Generator`` Protocol without a model, so an application's
own tests (and ragqa's) can drive an :class:`~rag.answer.Answerer`, the service or the cache
deterministically: the answer is the scripted pieces, streamed as deltas, and it can be told
to fail at start (a model server that is down) or mid-stream (one that drops the connection).
Like :class:`rag.embedders.HashEmbedder`, it is a test tool, not a settings backend.

Example::

    gen = ScriptedGenerator(["Paris is the capital ", "of France [1]."])
    answer = await Answerer(services, generator=gen).ask("What is the capital of France?")
    gen.prompts[0]          # the prompt the answerer built
    ScriptedGenerator([], fail_start=True)          # raises BackendUnavailable on start()
    ScriptedGenerator(["a", "b"], fail_after=1)     # GeneratorError after the first piece
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from rag.errors import BackendUnavailable, GeneratorError
from rag.types import GenerationDelta, GenerationParams, Prompt

__all__ = ["ScriptedGenerator"]


class ScriptedGenerator:
    """Replays ``pieces`` as the answer, optionally failing at start or after ``fail_after`` pieces.

    ``prompts`` records every prompt it was asked; ``closed_early`` tells whether a consumer
    stopped reading before the end (the answerer aborting a stream).
    """

    name = "scripted"
    context_window = 4096

    def __init__(self, pieces: Sequence[str], fail_start: bool = False, fail_after: int | None = None) -> None:
        self.pieces, self.fail_start, self.fail_after = list(pieces), fail_start, fail_after
        self.prompts: list[Prompt] = []
        self.closed_early = False

    async def start(self) -> None:
        if self.fail_start:
            raise BackendUnavailable("http://127.0.0.1:9/v1: connection refused")

    async def close(self) -> None:
        return None

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    async def stream(self, prompt: Prompt, params: GenerationParams) -> AsyncIterator[GenerationDelta]:
        """The pieces, one token each, as a model would send them: ``params.max_tokens`` ends
        the answer (``"length"``), and a stop string of the params or the prompt ends it
        (``"stop"``) and is not sent."""
        self.prompts.append(prompt)
        pieces, reason = _generated(self.pieces, params.max_tokens, (*params.stop, *prompt.stop))
        try:
            for i, piece in enumerate(pieces):
                if self.fail_after is not None and i == self.fail_after:
                    raise GeneratorError("the model server closed the stream")
                await asyncio.sleep(0)
                yield GenerationDelta(text=piece)
            yield GenerationDelta(finish_reason=reason, prompt_tokens=42, completion_tokens=len(pieces))
        except GeneratorExit:
            self.closed_early = True
            raise


def _generated(pieces: list[str], max_tokens: int, stops: tuple[str, ...]) -> tuple[list[str], str]:
    out: list[str] = []
    for piece in pieces:
        if len(out) >= max_tokens:
            return out, "length"
        sent = "".join(out)
        cuts = [(sent + piece).find(s) for s in stops if s and s in sent + piece]
        if cuts:
            rest = (sent + piece)[: min(cuts)][len(sent):]
            return out + [rest] if rest else out, "stop"
        out.append(piece)
    return out, "stop"
