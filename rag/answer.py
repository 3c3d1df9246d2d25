"""The answer pipeline: retrieve, pack, prompt, generate, cite. Streams events.

``Answerer.stream`` yields, in order: one ``sources`` event with every packed passage's
citation, ``delta`` events with answer text (labels already checked against the context),
and one ``done`` event with the cited sources, finish reason, token counts, per-stage
timings and the ``degraded`` flag. When the generator is down before its first token, the
extractive answerer takes over and the answer is flagged degraded; a failure after the
first token ends the stream with an ``error`` event.

Example::

    answerer = Answerer(services)
    async for event in answerer.stream("How do I read a file?"):
        if event.kind == "delta":
            print(event.text, end="")
    answer = await answerer.ask("什么是 GIL？")     # the whole Answer at once
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from rag.errors import BackendError, GeneratorError
from rag.generators.extractive import ExtractiveGenerator
from rag.packing import ContextPacker, PackedContext, context_budget
from rag.prompts import CitationStream, PromptExample, build_prompt, question_lang
from rag.retrieval import HybridRetriever
from rag.sampling import SamplingPolicy
from rag.types import Answer, Citation, Filters, GenerationParams, Generator, Prompt

if TYPE_CHECKING:
    from rag.services import Services

__all__ = ["Answerer", "AnswerEvent"]

log = logging.getLogger(__name__)
HEADROOM_TOKENS = 16  # chat-template tokens the count of the bare prompt may miss


@dataclass(slots=True)
class AnswerEvent:
    """One step of a streamed answer (see the module docstring for the order)."""

    kind: Literal["sources", "delta", "done", "error"]
    text: str = ""
    citations: tuple[Citation, ...] = ()
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    degraded: bool = False
    error: str | None = None


class Answerer:
    """Answers questions over a deployment's indexes with its generator.

    Example::

        answer = await Answerer(services).ask("When was Python 3.11 released?", top_k=5)
        print(answer.text, [c.url for c in answer.citations])
    """

    def __init__(self, services: Services, generator: Generator | None = None,
                 retriever: HybridRetriever | None = None) -> None:
        self.services = services
        self.generator = generator or services.generator
        self.retriever = retriever or HybridRetriever.from_services(services)
        self.policy = SamplingPolicy(services.settings.sampling)
        self.fallback = ExtractiveGenerator()
        self.examples = [PromptExample(e.question, e.context, e.answer, e.lang)
                         for e in services.settings.prompt.examples]
        self._started = False
        self._start_lock = asyncio.Lock()

    async def start(self) -> None:
        """Load the model or check the server; raises its one-line error."""
        async with self._start_lock:
            if not self._started:
                await self.generator.start()
                self._started = True

    async def close(self) -> None:
        if self._started:
            await self.generator.close()
            self._started = False

    async def ask(self, question: str, **kwargs: Any) -> Answer:
        parts: list[str] = []
        async for event in self.stream(question, **kwargs):
            if event.kind == "delta":
                parts.append(event.text)
            elif event.kind == "error":
                raise GeneratorError(event.error or "generation failed")
            elif event.kind == "done":
                return Answer("".join(parts).strip(), event.citations, event.degraded, "miss", event.timings)
        raise GeneratorError("the answer stream ended without a result")

    async def stream(self, question: str, *, history: Sequence[Mapping[str, str]] = (),
                     filters: Filters | None = None, top_k: int | None = None,
                     overrides: Mapping[str, Any] | None = None) -> AsyncIterator[AnswerEvent]:
        started = time.perf_counter()
        k = top_k or self.services.settings.retrieval.top_k
        turn = 1 + sum(1 for t in history if t.get("role") == "user")
        params = self.policy.params(question, turn=turn, overrides=overrides)
        retrieval = await asyncio.to_thread(self.retriever.search, question, k, filters)
        timings = dict(retrieval.timings)
        timings["retrieve_ms"] = (time.perf_counter() - started) * 1000

        generator: Generator = self.generator
        degraded = False
        try:
            await self.start()
        except (BackendError, GeneratorError) as exc:
            if not self.services.settings.generator.fallback:
                raise
            log.warning("generator %s unavailable, answering extractively: %s", generator.name, exc)
            generator, degraded = self.fallback, True

        packed, prompt = self._prompt(generator, question, retrieval.hits, history, params)
        timings["pack_ms"] = (time.perf_counter() - started) * 1000 - timings["retrieve_ms"]
        yield AnswerEvent("sources", citations=tuple(packed.citations.values()), degraded=degraded)

        cites = CitationStream(packed.citations)
        gen_started = time.perf_counter()
        first = True
        final = None
        stream = generator.stream(prompt, params)
        try:
            while True:
                try:
                    delta = await stream.__anext__()
                except StopAsyncIteration:
                    break
                except (BackendError, GeneratorError) as exc:
                    if not first or degraded or not self.services.settings.generator.fallback:
                        yield AnswerEvent("error", error=str(exc), degraded=degraded,
                                          timings=_finish(timings, started, gen_started))
                        return
                    log.warning("generator %s failed before its first token, answering extractively: %s",
                                generator.name, exc)
                    generator, degraded = self.fallback, True
                    packed, prompt = self._prompt(generator, question, retrieval.hits, history, params)
                    cites = CitationStream(packed.citations)
                    stream = generator.stream(prompt, params)
                    continue
                if first and delta.text:
                    timings["ttft_ms"] = (time.perf_counter() - started) * 1000
                    first = False
                if delta.text:
                    text = cites.feed(delta.text)
                    if text:
                        yield AnswerEvent("delta", text=text)
                if delta.finish_reason is not None:
                    final = delta
        finally:
            await stream.aclose()
        tail = cites.flush()
        if tail:
            yield AnswerEvent("delta", text=tail)
        usage = {"prompt_tokens": (final.prompt_tokens if final else None) or 0,
                 "completion_tokens": (final.completion_tokens if final else None) or 0}
        yield AnswerEvent("done", citations=tuple(cites.cited),
                          finish_reason=final.finish_reason if final else "stop", usage=usage,
                          timings=_finish(timings, started, gen_started), degraded=degraded)

    def _prompt(self, generator: Generator, question: str, hits: list, history: Sequence[Mapping[str, str]],
                params: GenerationParams) -> tuple[PackedContext, Prompt]:
        """Pack the hits into what is left of the model's window, then build the prompt."""
        empty = PackedContext("", (), {}, 0, 0)
        bare = build_prompt(question, empty, lang=question_lang(question), history=history,
                            examples=self.examples)
        overhead = generator.count_tokens("\n".join(m["content"] for m in bare.messages))
        budget = context_budget(generator.context_window, self.services.settings.retrieval.max_context_tokens,
                                overhead + params.max_tokens + HEADROOM_TOKENS)
        packed = ContextPacker(generator.count_tokens, budget).pack(hits)
        prompt = build_prompt(question, packed, history=history, examples=self.examples)
        return packed, prompt


def _finish(timings: dict[str, float], started: float, gen_started: float) -> dict[str, float]:
    now = time.perf_counter()
    out = {**timings, "generate_ms": (now - gen_started) * 1000, "total_ms": (now - started) * 1000}
    return {k: round(v, 2) for k, v in out.items()}

