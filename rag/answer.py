"""The answer pipeline: retrieve, pack, prompt, generate, cite. Streams events.

``Answerer.stream`` yields, in order: one ``sources`` event with every packed passage's
citation, ``delta`` events with answer text (labels already checked against the context),
and one ``done`` event with the cited sources, finish reason, token counts, per-stage
timings and the ``degraded`` flag with its ``warnings``. A retrieval leg whose backend is
down is left out (:mod:`rag.retrieval.legs`) and the answer is flagged degraded, saying which.
When the generator is down before its first token, the extractive answerer takes over
(``fallback``) and the answer is flagged degraded; a failure after the
first token ends the stream with an ``error`` event.

Questions and passages are screened for prompt injection (:mod:`rag.injection`). A blocked
question is refused before retrieval: ``sources`` (empty), one ``delta`` with the refusal,
and ``done`` with ``finish_reason="content_filter"`` (OpenAI's value for a filtered answer).
Suspicious passages are excluded or quoted before packing; ``done.screening`` says which.

An answer cache (:mod:`rag.cache`, ``cache.*`` settings) sits in front: a hit replays the
cached answer as the same events (``sources``, the text as one ``delta``, ``done``), with
``cache`` ``"hit"`` (the same question) or ``"semantic"`` (a near-identical one) on the
``sources`` and ``done`` events, and ``"miss"`` when it was looked up in vain. Only complete,
non-degraded, unblocked answers are stored; ``no_cache=True`` skips the cache both ways.

Example::

    answerer = Answerer(services)
    async for event in answerer.stream("How do I read a file?"):
        if event.kind == "delta":
            print(event.text, end="")
    answer = await answerer.ask("什么是 GIL？")     # the whole Answer at once
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from rag.admission import Admission
from rag.attribution import Attributor
from rag.cache import AnswerCacheLayer, CachedAnswer, Lookup, make_answer_cache
from rag.errors import BackendError, BackendUnavailable, GeneratorError
from rag.focus import focus_hits
from rag.generators.extractive import ExtractiveGenerator
from rag.injection import InjectionFilter, Screening, Verdict, refusal
from rag.lang import detect_lang
from rag.packing import ContextPacker, PackedContext, context_budget
from rag.prompts import EXAMPLES, UNKNOWN, CitationStream, PromptExample, build_prompt
from rag.retrieval import HybridRetriever
from rag.sampling import SamplingPolicy
from rag.types import Answer, Citation, Filters, GenerationParams, Generator, Prompt, Warmable

if TYPE_CHECKING:
    from rag.services import Services

__all__ = ["Answerer", "AnswerEvent"]

log = logging.getLogger(__name__)
HEADROOM_TOKENS = 16  # chat-template tokens the count of the bare prompt may miss
_EMPTY = PackedContext("", (), {}, 0, 0)
EXAMPLE_ROOM = 256  # least context left beside the few-shot examples, else they are left out


@dataclass(slots=True)
class AnswerEvent:
    """One step of a streamed answer (see the module docstring for the order)."""

    kind: Literal["sources", "delta", "done", "error"]
    text: str = ""
    citations: tuple[Citation, ...] = ()
    finish_reason: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    degraded: bool = False  # a retrieval leg or the generator was down: see ``warnings``
    warnings: tuple[str, ...] = ()  # on sources/done/error: what was missing, in words
    fallback: bool = False  # the generator was down and the answer is extractive
    error: str | None = None
    cache: str | None = None  # on sources/done: hit | semantic | miss; None when not looked up
    screening: Screening | None = None  # on ``done``: the question's verdict, passages excluded or quoted
    attribution: dict[str, int] = field(default_factory=dict)  # on ``done``: sentences labelled by inference, unsupported


class Answerer:
    """Answers questions over a deployment's indexes with its generator.

    Example::

        answer = await Answerer(services).ask("When was Python 3.11 released?", top_k=5)
        print(answer.text, [c.url for c in answer.citations])
    """

    def __init__(self, services: Services, generator: Generator | None = None,
                 retriever: HybridRetriever | None = None, injection: InjectionFilter | None = None,
                 cache: AnswerCacheLayer | None = None, admission: Admission | None = None) -> None:
        self.services = services
        self.injection = injection or InjectionFilter(services.settings.injection)
        self.generator = generator or services.generator
        self.retriever = retriever or HybridRetriever.from_services(services)
        self.policy = SamplingPolicy(services.settings.sampling)
        self.fallback = ExtractiveGenerator()
        configured = services.settings.prompt.examples
        self.examples = list(EXAMPLES) if configured is None else [
            PromptExample(e.question, e.context, e.answer, e.lang) for e in configured]
        self.system = dict(services.settings.prompt.system)
        self._started = False
        self._start_lock = asyncio.Lock()
        self.cache = cache if cache is not None else make_answer_cache(services, salt=self.generator.name)
        self.admission = admission  # bounds the answers generated at once (the server sets it)

    async def start(self) -> None:
        """Load the model or check the server; raises its one-line error."""
        async with self._start_lock:
            if not self._started:
                await self.generator.start()
                self._started = True

    async def warm(self) -> None:
        """Start the generator and have it read both languages' system messages (rules and
        examples) now, when it can keep them (:class:`rag.types.Warmable`): a long-running
        service calls this at start, so its first questions read only their own text."""
        await self.start()
        if isinstance(self.generator, Warmable):
            for lang in ("zh", "en"):
                await self.generator.warm(build_prompt("", _EMPTY, lang=lang, examples=self.examples,
                                                       instructions=self.system))  # type: ignore[arg-type]

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
                return Answer("".join(parts).strip(), event.citations, event.degraded, event.cache or "miss",
                              event.timings)
        raise GeneratorError("the answer stream ended without a result")

    async def stream(self, question: str, *, history: Sequence[Mapping[str, str]] = (),
                     filters: Filters | None = None, top_k: int | None = None,
                     overrides: Mapping[str, Any] | None = None, no_cache: bool = False) -> AsyncIterator[AnswerEvent]:
        """The answer's events, from the answer cache when it has them (see the module docstring).
        A question the injection filter blocks never reaches the cache."""
        started = time.perf_counter()
        args: dict[str, Any] = {"history": history, "filters": filters, "top_k": top_k, "overrides": overrides}
        cache = None if no_cache else self.cache
        verdict = self.injection.check_question(question)  # screened (and counted) once, here
        if verdict.blocked:
            cache = None
        lookup: Lookup | None = None
        if cache is not None:
            try:
                # The exact lookup of a memory cache costs less than a thread hop: on the loop.
                if cache.inline:
                    lookup = cache.lookup_exact(question, **args)
                else:
                    lookup = await asyncio.to_thread(cache.lookup_exact, question, **args)
                if lookup.kind == "miss":
                    lookup = await asyncio.to_thread(cache.lookup_semantic, lookup)
            except BackendUnavailable as exc:  # the store said so once; a cache that is down is a miss
                log.debug("answer cache lookup failed, answering without it: %s", exc)
            except Exception as exc:  # noqa: BLE001 - a cache that fails is a miss, not an error
                log.warning("answer cache lookup failed, answering without it: %s", exc)
        vector = lookup.vector if lookup is not None else None
        events = None
        if lookup is not None and lookup.answer is not None:
            if not lookup.recheck:
                for event in _replay(lookup, started):
                    yield event
                return
            # Its sources gained chunks since it was stored: serve it only if the context is
            # still the same passages. The answer's own retrieval and packing decide, and on a
            # difference they go on to generate.
            events = self._answer(question, verdict=verdict, query_vector=vector, **args)
            first = await events.__anext__()
            if first.kind == "sources" and await self._recheck(cache, lookup, first.citations):  # type: ignore[arg-type]
                await events.aclose()  # type: ignore[attr-defined]
                for event in _replay(lookup, started):
                    yield event
                return
            events = _prepend(first, events)
        if events is None:
            events = self._answer(question, verdict=verdict, query_vector=vector, **args)
        parts: list[str] = []
        sources: tuple[Citation, ...] = ()
        try:
            async for event in events:
                if lookup is not None and event.kind in ("sources", "done"):
                    event.cache = "miss"
                if event.kind == "sources":
                    sources = event.citations
                elif event.kind == "delta":
                    parts.append(event.text)
                elif event.kind == "done" and lookup is not None:
                    event.timings = _with_lookup(event.timings, lookup)
                    if _cacheable(event, parts):
                        await self._store(cache, lookup, CachedAnswer(  # type: ignore[arg-type]
                            "".join(parts), sources, event.citations, event.finish_reason or "stop", dict(event.usage)))
                yield event
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    @staticmethod
    async def _recheck(cache: AnswerCacheLayer, lookup: Lookup, context: tuple[Citation, ...]) -> bool:
        try:
            return await asyncio.to_thread(cache.recheck, lookup, context)
        except Exception as exc:  # noqa: BLE001 - unchecked is answered afresh
            log.warning("answer cache recheck failed, answering afresh: %s", exc)
            return False

    @staticmethod
    async def _store(cache: AnswerCacheLayer, lookup: Lookup, answer: CachedAnswer) -> None:
        try:
            await asyncio.to_thread(cache.store, lookup, answer)
        except Exception as exc:  # noqa: BLE001 - the answer stands; only its caching failed
            log.warning("answer cache store failed: %s", exc)

    async def _answer(self, question: str, **kwargs: Any) -> AsyncIterator[AnswerEvent]:
        """:meth:`_generate` in an answer slot when admission control is on (a cache hit never
        gets here); a full queue raises :class:`~rag.errors.Overloaded` before any event."""
        unbounded = self.admission is None or kwargs["verdict"].blocked
        async with contextlib.nullcontext() if unbounded else self.admission.slot():  # type: ignore[union-attr]
            async for event in self._generate(question, **kwargs):
                yield event

    async def _generate(self, question: str, *, verdict: Verdict, history: Sequence[Mapping[str, str]] = (),
                        filters: Filters | None = None, top_k: int | None = None,
                        overrides: Mapping[str, Any] | None = None,
                        query_vector: Any = None) -> AsyncIterator[AnswerEvent]:
        started = time.perf_counter()
        if verdict.blocked:  # refused before retrieval: nothing of it reaches the model
            yield AnswerEvent("sources")
            yield AnswerEvent("delta", text=refusal(question))
            yield AnswerEvent("done", finish_reason="content_filter", screening=Screening(verdict),
                              timings={"total_ms": round((time.perf_counter() - started) * 1000, 2)})
            return
        history, dropped = self.injection.screen_history(history)
        k = top_k or self.services.settings.retrieval.top_k
        turn = 1 + sum(1 for t in history if t.get("role") == "user")
        params = self.policy.params(question, turn=turn, overrides=overrides)

        def retrieve_and_screen() -> tuple[Any, list, Any]:  # CPU work, off the event loop
            reuse = {} if query_vector is None else {"query_vector": query_vector}  # the cache's embedding
            found = self.retriever.search(question, k, filters, **reuse)
            return (found, *self.injection.screen_hits(found.hits))

        retrieval, hits, screening = await asyncio.to_thread(retrieve_and_screen)
        timings = dict(retrieval.timings)
        timings["retrieve_ms"] = (time.perf_counter() - started) * 1000
        screening = replace(screening, question=verdict, history_dropped=dropped)

        generator: Generator = self.generator
        warnings = list(retrieval.degraded)
        fallback = False
        try:
            await self.start()
        except (BackendError, GeneratorError) as exc:
            if not self.services.settings.generator.fallback:
                raise
            log.warning("generator %s unavailable, answering extractively: %s", generator.name, exc)
            warnings.append(f"generator {generator.name} unavailable, answered extractively: {exc}")
            generator, fallback = self.fallback, True

        def state() -> dict[str, Any]:
            return {"degraded": bool(warnings), "warnings": tuple(warnings), "fallback": fallback}

        packed, prompt = await asyncio.to_thread(self._prompt, generator, question, hits, history, params)
        timings["pack_ms"] = (time.perf_counter() - started) * 1000 - timings["retrieve_ms"]
        yield AnswerEvent("sources", citations=tuple(packed.citations.values()), **state())

        cites, infer = CitationStream(packed.citations), self._attributor(packed)
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
                    if not first or fallback or not self.services.settings.generator.fallback:
                        yield AnswerEvent("error", error=str(exc), timings=_finish(timings, started, gen_started),
                                          **state())
                        return
                    log.warning("generator %s failed before its first token, answering extractively: %s",
                                generator.name, exc)
                    warnings.append(f"generator {generator.name} failed, answered extractively: {exc}")
                    generator, fallback = self.fallback, True
                    packed, prompt = self._prompt(generator, question, hits, history, params)
                    cites, infer = CitationStream(packed.citations), self._attributor(packed)
                    stream = generator.stream(prompt, params)
                    continue
                if first and delta.text:
                    timings["ttft_ms"] = (time.perf_counter() - started) * 1000
                    first = False
                if delta.text:
                    text = cites.feed(delta.text)
                    if infer is not None:
                        text = infer.feed(text)
                    if text:
                        yield AnswerEvent("delta", text=text)
                if delta.finish_reason is not None:
                    final = delta
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        tail = cites.flush()
        if infer is not None:
            tail = infer.feed(tail) + infer.flush()
        if tail:
            yield AnswerEvent("delta", text=tail)
        usage = {"prompt_tokens": (final.prompt_tokens if final else None) or 0,
                 "completion_tokens": (final.completion_tokens if final else None) or 0}
        yield AnswerEvent("done", citations=_with_inferred(cites.cited, infer, packed),
                          finish_reason=final.finish_reason if final else "stop", usage=usage,
                          timings=_finish(timings, started, gen_started), screening=screening, **state(),
                          attribution=_counts(infer))

    def _attributor(self, packed: PackedContext) -> Attributor | None:
        """Labels for the sentences the model leaves unlabelled (``citations.infer``)."""
        cfg = self.services.settings.citations
        if not cfg.infer:
            return None
        return Attributor({p.label: p.chunk.text for p in packed.passages}, min_support=cfg.min_support,
                          skip=UNKNOWN.values())

    def _prompt(self, generator: Generator, question: str, hits: list, history: Sequence[Mapping[str, str]],
                params: GenerationParams) -> tuple[PackedContext, Prompt]:
        """Pack the hits into what is left of the model's window, then build the prompt. The
        examples go when they would leave the context less than ``EXAMPLE_ROOM`` tokens."""
        limits = self.services.settings.context_limits
        examples: Sequence[PromptExample] = self.examples
        while True:
            bare = build_prompt(question, _EMPTY, lang=detect_lang(question), history=history,
                                examples=examples, instructions=self.system)  # type: ignore[arg-type]
            reserved = generator.count_tokens("\n".join(m["content"] for m in bare.messages)) \
                + params.max_tokens + HEADROOM_TOKENS
            if not examples or generator.context_window - reserved >= min(limits.tokens, EXAMPLE_ROOM):
                break
            examples = ()  # a small window: the passages matter more than the example
        budget = context_budget(generator.context_window, limits.tokens, reserved)
        if limits.sentences:
            hits = focus_hits(question, hits[: limits.chunks] if limits.chunks else hits, limits.sentences)
        packed = ContextPacker(generator.count_tokens, budget, max_chunks=limits.chunks).pack(hits)
        prompt = build_prompt(question, packed, history=history, examples=examples, instructions=self.system)  # type: ignore[arg-type]
        return packed, prompt


def _with_inferred(cited: Sequence[Citation], infer: Attributor | None,
                   packed: PackedContext) -> tuple[Citation, ...]:
    """The model's citations, then those only inferred (``inferred=True``), each label once."""
    out = list(cited)
    if infer is not None:
        have = {c.label for c in out}
        out += [replace(packed.citations[n], inferred=True) for n in infer.inferred
                if n not in have and n in packed.citations]
    return tuple(out)


def _counts(infer: Attributor | None) -> dict[str, int]:
    if infer is None:
        return {}
    return {"inferred": infer.attributed, "unsupported": infer.unsupported}


async def _prepend(first: AnswerEvent, rest: AsyncIterator[AnswerEvent]) -> AsyncIterator[AnswerEvent]:
    try:
        yield first
        async for event in rest:
            yield event
    finally:
        await rest.aclose()  # type: ignore[attr-defined]


def _replay(lookup: Lookup, started: float) -> list[AnswerEvent]:
    """A cached answer as the events of a generated one."""
    answer = lookup.answer
    assert answer is not None
    timings = {**lookup.timings, "total_ms": (time.perf_counter() - started) * 1000}
    return [AnswerEvent("sources", citations=answer.sources, cache=lookup.kind),
            AnswerEvent("delta", text=answer.text),
            AnswerEvent("done", citations=answer.citations, finish_reason=answer.finish_reason,
                        usage=dict(answer.usage), timings={k: round(v, 2) for k, v in timings.items()},
                        cache=lookup.kind)]


def _with_lookup(timings: dict[str, float], lookup: Lookup) -> dict[str, float]:
    """A generated answer's timings, counting the cache lookup before it."""
    spent = lookup.timings.get("cache_ms", 0.0)
    out = {**timings, "cache_ms": spent}
    for key in ("ttft_ms", "total_ms"):
        if key in out:
            out[key] += spent
    return {k: round(v, 2) for k, v in out.items()}


def _cacheable(done: AnswerEvent, parts: list[str]) -> bool:
    """Only complete answers are cached: not cut short, not degraded, not refused, not empty."""
    screening = getattr(done, "screening", None)
    blocked = screening is not None and getattr(getattr(screening, "question", None), "blocked", False)
    return done.finish_reason == "stop" and not done.degraded and not blocked and bool("".join(parts).strip())


def _finish(timings: dict[str, float], started: float, gen_started: float) -> dict[str, float]:
    now = time.perf_counter()
    out = {**timings, "generate_ms": (now - gen_started) * 1000, "total_ms": (now - started) * 1000}
    return {k: round(v, 2) for k, v in out.items()}

