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

**Profiles and routing** (:mod:`rag.profiles`, ``docs/profiles.md``): each question is answered
by one generator profile, chosen after retrieval and before generation: ``profile=`` when
given (an experiment arm, a test), else with ``routing.mode`` ``rules`` the
:class:`~rag.routing.Router`'s decision, with ``cascade`` ``routing.small`` first, else
``default`` (the ``generator`` section: one profile, today's answers). A profile whose backend is
down falls back to the next profile, then to the extractive answerer, flagged degraded. In the
cascade the small profile's answer is **buffered**, not streamed: when it abstains (the "I don't
know" sentence), cites nothing or, with ``routing.min_confidence`` set, its confidence is below
that (a generator that reports none is not checked), it is dropped and ``routing.large``
answers, streamed as usual (its ``sources`` event follows the first one when its context
differs); else the buffered text is sent. The confidence is the generator's mean
log-probability of the answer's tokens (``GenerationDelta.logprob``), carried on ``done`` as
``confidence`` (``logprob`` and ``min_logprob``; empty when the generator does not report it,
as the extractive one). Every ``done`` event (and ``sources``) carries ``versions``: the
profile, model, quantization, prompt version, the route (``{"decision", "reason"}`` or
``None``) and the
experiment ``arm``; the answer cache keys on them.

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
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from rag import metrics as M
from rag.admission import Admission
from rag.answer_events import (
    AnswerEvent,
    abstained,
    answer_id,
    attribution_counts,
    cacheable,
    confidence_of,
    confident,
    finish_timings,
    observe_profile,
    prepend,
    reason_label,
    replay,
    shown_confidence,
    with_inferred,
    with_lookup,
)
from rag.attribution import Attributor
from rag.cache import AnswerCacheLayer, CachedAnswer, Lookup, make_answer_cache
from rag.config import ContextLimits
from rag.errors import BackendError, BackendUnavailable, GeneratorError
from rag.focus import focus_hits
from rag.generators.extractive import ExtractiveGenerator
from rag.injection import InjectionFilter, Screening, Verdict, refusal
from rag.lang import detect_lang
from rag.packing import ContextPacker, PackedContext, context_budget
from rag.profiles import DEFAULT, Profiles
from rag.prompts import EXAMPLES, UNKNOWN, CitationStream, PromptExample, build_prompt, prompt_version
from rag.retrieval import HybridRetriever
from rag.sampling import SamplingPolicy
from rag.types import Answer, Citation, Filters, GenerationParams, Generator, Prompt, Warmable

if TYPE_CHECKING:
    from rag.routing import Router
    from rag.services import Services

__all__ = ["Answerer", "AnswerEvent", "abstained", "confident"]

log = logging.getLogger(__name__)
HEADROOM_TOKENS = 16  # chat-template tokens the count of the bare prompt may miss
_EMPTY = PackedContext("", (), {}, 0, 0)
EXAMPLE_ROOM = 256  # least context left beside the few-shot examples, else they are left out


class Answerer:
    """Answers questions over a deployment's indexes with its generator.

    Example::

        answer = await Answerer(services).ask("When was Python 3.11 released?", top_k=5)
        print(answer.text, [c.url for c in answer.citations])
    """

    def __init__(self, services: Services, generator: Generator | None = None,
                 retriever: HybridRetriever | None = None, injection: InjectionFilter | None = None,
                 cache: AnswerCacheLayer | None = None, admission: Admission | None = None, *,
                 generators: Mapping[str, Generator] | None = None, router: Router | None = None) -> None:
        self.services = services
        self.injection = injection or InjectionFilter(services.settings.injection)
        given = dict(generators or {})
        if generator is not None:
            given[DEFAULT] = generator
        self.profiles = Profiles(services, given)  # generator: the default profile's; generators: by profile
        self.routing = services.settings.routing
        self._router = router  # routing.mode rules: built on first use unless given
        self.retriever = retriever or HybridRetriever.from_services(services)
        self.policy = SamplingPolicy(services.settings.sampling)
        self.fallback = ExtractiveGenerator()
        configured = services.settings.prompt.examples
        self.examples = list(EXAMPLES) if configured is None else [
            PromptExample(e.question, e.context, e.answer, e.lang) for e in configured]
        self.system = dict(services.settings.prompt.system)
        self.prompt_version = prompt_version(self.examples, self.system)  # type: ignore[arg-type]
        self.cache = cache if cache is not None else make_answer_cache(services, salt=self.generator.name)
        self.admission = admission  # bounds the answers generated at once (the server sets it)
        # Ask every generator for the answer's confidence (the openai one only sends ``logprobs``
        # when asked: the server pays for them). The cascade asks on its own; eval answers sets it.
        self.record_confidence = False

    @property
    def generator(self) -> Generator:
        """The default profile's generator (the ``generator`` section, or the one given)."""
        return self.profiles.generator(DEFAULT)

    @property
    def router(self) -> Router:
        if self._router is None:
            from rag.routing import Router

            self._router = Router(self.routing)
        return self._router

    async def start(self) -> None:
        """Load the default profile's model or check its server; raises its one-line error."""
        await self.profiles.start(DEFAULT)

    async def warm(self) -> None:
        """Start the default profile's generator and have it read both languages' system
        messages (rules and examples) now, when it can keep them (:class:`rag.types.Warmable`):
        a long-running service calls this at start, so its first questions read only their own
        text. With routing on, the small and large profiles are started too (a failure there is
        logged and reported by ``/ready``; their answers fall back)."""
        names = [DEFAULT]
        if self.routing.mode != "off":
            names += [n for n in (self.routing.large, self.routing.small) if n not in names]
        for name in names:
            try:
                generator = await self.profiles.start(name)
            except (BackendError, GeneratorError) as exc:
                if name == DEFAULT:
                    raise
                log.warning("profile %s unavailable at start-up: %s", name, exc)
                continue
            if isinstance(generator, Warmable):
                for lang in ("zh", "en"):
                    await generator.warm(build_prompt("", _EMPTY, lang=lang, examples=self.examples,
                                                      instructions=self.system))  # type: ignore[arg-type]

    async def close(self) -> None:
        await self.profiles.close()

    async def ask(self, question: str, **kwargs: Any) -> Answer:
        parts: list[str] = []
        async for event in self.stream(question, **kwargs):
            if event.kind == "delta":
                parts.append(event.text)
            elif event.kind == "error":
                raise GeneratorError(event.error or "generation failed")
            elif event.kind == "done":
                return Answer("".join(parts).strip(), event.citations, event.degraded, event.cache or "miss",
                              event.timings, dict(event.versions or {}))
        raise GeneratorError("the answer stream ended without a result")

    async def stream(self, question: str, *, history: Sequence[Mapping[str, str]] = (),
                     filters: Filters | None = None, top_k: int | None = None,
                     overrides: Mapping[str, Any] | None = None, no_cache: bool = False,
                     profile: str | None = None, arm: str | None = None) -> AsyncIterator[AnswerEvent]:
        """The answer's events, from the answer cache when it has them (see the module docstring).
        A question the injection filter blocks never reaches the cache. ``profile`` forces a
        generator profile (no routing; an unknown one is a ``RequestError``); ``arm`` (an
        experiment's) is recorded in the answer's versions and keys the cache."""
        started = time.perf_counter()
        if profile is not None:
            self.profiles.check(profile)
        args: dict[str, Any] = {"history": history, "filters": filters, "top_k": top_k, "overrides": overrides}
        key = {**args, "variant": self._variant(profile, arm)}
        cache = None if no_cache else self.cache
        verdict = self.injection.check_question(question)  # screened (and counted) once, here
        if verdict.blocked:
            cache = None
        lookup: Lookup | None = None
        if cache is not None:
            try:
                # The exact lookup of a memory cache costs less than a thread hop: on the loop.
                if cache.inline:
                    lookup = cache.lookup_exact(question, **key)
                else:
                    lookup = await asyncio.to_thread(cache.lookup_exact, question, **key)
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
                for event in replay(lookup, started):
                    yield event
                return
            # Its sources gained chunks since it was stored: serve it only if the context is
            # still the same passages. The answer's own retrieval and packing decide, and on a
            # difference they go on to generate.
            events = self._answer(question, verdict=verdict, query_vector=vector, profile=profile, arm=arm, **args)
            first = await events.__anext__()
            if first.kind == "sources" and await self._recheck(cache, lookup, first.citations):  # type: ignore[arg-type]
                await events.aclose()  # type: ignore[attr-defined]
                for event in replay(lookup, started):
                    yield event
                return
            events = prepend(first, events)
        if events is None:
            events = self._answer(question, verdict=verdict, query_vector=vector, profile=profile, arm=arm, **args)
        parts: list[str] = []
        sources: tuple[Citation, ...] = ()
        try:
            async for event in events:
                if event.kind == "done":
                    event.answer_id = answer_id()
                if lookup is not None and event.kind in ("sources", "done"):
                    event.cache = "miss"
                if event.kind == "sources":
                    sources = event.citations
                elif event.kind == "delta":
                    parts.append(event.text)
                elif event.kind == "done" and lookup is not None:
                    event.timings = with_lookup(event.timings, lookup)
                    if cacheable(event, parts):
                        await self._store(cache, lookup, CachedAnswer(  # type: ignore[arg-type]
                            "".join(parts), sources, event.citations, event.finish_reason or "stop", dict(event.usage),
                            versions=dict(event.versions or {})))
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

    def _variant(self, profile: str | None, arm: str | None) -> str:
        """What decides an answer besides its question and scope, for the cache key: the profile
        (or how it is chosen: under ``rules`` the decision follows from the question and its
        retrieval, which the key and the recheck already cover), the prompt version and the arm."""
        mode = self.routing.mode
        if profile is not None:
            how = f"profile={profile}"
        elif mode == "rules":
            how = "route=rules"
        elif mode == "cascade":
            how = f"cascade={self.routing.small}>{self.routing.large}"
            if self.routing.min_confidence is not None:
                how += f"@{self.routing.min_confidence:g}"
        else:
            how = f"profile={DEFAULT}"
        return f"{how}|prompt={self.prompt_version}|arm={arm or ''}"

    def _versions(self, answering: str | None, generator: Generator | None, route: dict[str, str] | None,
                  arm: str | None) -> dict[str, Any]:
        if answering is None:  # refused before any generator
            model: dict[str, str | None] = {"model": None, "quantization": None}
        elif answering == "extractive":
            model = {"model": "extractive", "quantization": None}
        else:
            model = self.profiles.describe(answering, generator)
        return {"profile": answering, **model, "prompt_version": self.prompt_version, "route": route, "arm": arm}

    def _choose(self, question: str, profile: str | None, arm: str | None, retrieval: Any, hits: list,
                turn: int) -> tuple[str, dict[str, str] | None]:
        """The profile that answers and the route that chose it (``None`` when nothing was routed)."""
        if profile is not None:
            M.ROUTER_DECISIONS.labels(profile, "experiment" if arm else "forced").inc()
            return profile, None
        mode = self.routing.mode
        if mode == "off":
            M.ROUTER_DECISIONS.labels(DEFAULT, "routing off").inc()
            return DEFAULT, None
        if mode == "cascade":
            small = self.routing.small
            M.ROUTER_DECISIONS.labels(small, "cascade: first").inc()
            return small, {"decision": small, "reason": f"cascade: {small} first"}
        from rag.routing import route_signals

        limits = self.profiles.context_limits(self.routing.large)
        packed = min(len(hits), limits.chunks) if limits.chunks else len(hits)
        signals = route_signals(question, lang=detect_lang(question), hits=hits,
                                legs=getattr(retrieval, "legs", None), packed_chunks=packed, turn=turn)
        decision = self.router.decide(signals)
        name = self.profiles.check(decision.profile)
        M.ROUTER_DECISIONS.labels(name, reason_label(decision.reason)).inc()
        return name, {"decision": name, "reason": decision.reason}

    async def _generate(self, question: str, *, verdict: Verdict, history: Sequence[Mapping[str, str]] = (),
                        filters: Filters | None = None, top_k: int | None = None,
                        overrides: Mapping[str, Any] | None = None, query_vector: Any = None,
                        profile: str | None = None, arm: str | None = None) -> AsyncIterator[AnswerEvent]:
        started = time.perf_counter()
        if verdict.blocked:  # refused before retrieval: nothing of it reaches the model
            yield AnswerEvent("sources")
            yield AnswerEvent("delta", text=refusal(question))
            yield AnswerEvent("done", finish_reason="content_filter", screening=Screening(verdict),
                              timings={"total_ms": round((time.perf_counter() - started) * 1000, 2)},
                              versions=self._versions(None, None, None, arm))
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
        run = _Run(started, timings, list(retrieval.degraded), screening, question, hits, history, params, arm)
        name, route = self._choose(question, profile, arm, retrieval, hits, turn)
        if profile is None and self.routing.mode == "cascade":
            events = self._cascade(run, route)
        else:
            events = self._attempt(run, name, route)
        try:
            async for event in events:
                yield event
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    async def _cascade(self, run: _Run, route: dict[str, str] | None) -> AsyncIterator[AnswerEvent]:
        """``routing.small`` first, buffered; ``routing.large`` when its answer abstains, cites
        nothing, is less confident than ``routing.min_confidence`` or fails (see the module docstring)."""
        small, large = self.routing.small, self.routing.large
        sources: tuple[Citation, ...] | None = None
        buffered: list[AnswerEvent] = []
        attempt = self._attempt(run, small, route)
        try:
            async for event in attempt:
                if event.kind == "sources":
                    sources = event.citations
                    yield event
                else:
                    buffered.append(event)
        finally:
            await attempt.aclose()  # type: ignore[attr-defined]
        last = buffered[-1] if buffered else None
        text = "".join(e.text for e in buffered if e.kind == "delta")
        why = None
        if last is None or last.kind == "error":
            why = "failed"
        elif abstained(text):
            why = "abstained"
        elif not last.citations:
            why = "cited nothing"
        elif not confident(last.confidence, self.routing.min_confidence):
            why = "low confidence"
        answered = (last.versions or {}).get("profile") if last is not None else None
        if why is None or answered == large:
            released = round((time.perf_counter() - run.started) * 1000, 2)  # the text reaches the client now
            for event in buffered:
                if event.kind == "done":
                    event.timings = {**event.timings, "ttft_ms": released}
                yield event
            return
        small_ms = round((time.perf_counter() - run.started) * 1000, 2)
        M.ROUTER_DECISIONS.labels(large, f"cascade: {why}").inc()
        said = f"has confidence {shown_confidence(last)} < {self.routing.min_confidence}" if why == "low confidence" else why
        escalated = {"decision": large, "reason": f"cascade: the {small} answer {said}; escalated to {large}"}
        attempt = self._attempt(run, large, escalated, previous=sources)
        try:
            async for event in attempt:
                if event.kind in ("done", "error"):
                    event.timings = {**event.timings, "cascade_small_ms": small_ms}
                yield event
        finally:
            await attempt.aclose()  # type: ignore[attr-defined]

    async def _start_from(self, chain: Sequence[str], pos: int, failures: list[tuple[str, str, str, Exception]],
                          allow: bool, verb: str = "unavailable") -> tuple[Generator, str, int]:
        """The first profile of ``chain`` from ``pos`` whose generator starts, else the extractive
        answerer (``allow``: the asked profile's ``fallback``; without it the error is raised)."""
        for i in range(pos, len(chain)):
            name = chain[i]
            try:
                return await self.profiles.start(name), name, i
            except (BackendError, GeneratorError) as exc:
                if not allow:
                    raise
                failures.append((name, self._generator_name(name), verb, exc))
        return self.fallback, "extractive", len(chain)

    def _generator_name(self, name: str) -> str:
        try:
            return self.profiles.generator(name).name
        except Exception:  # noqa: BLE001 - only for the warning's words
            return name

    @staticmethod
    def _warn(run: _Run, failures: list[tuple[str, str, str, Exception]], answering: str) -> None:
        how = "extractively" if answering == "extractive" else f"with profile {answering}"
        for name, generator, verb, exc in failures:
            who = generator if name == DEFAULT else f"{generator} (profile {name})"
            log.warning("generator %s %s, answering %s: %s", who, verb, how, exc)
            run.warnings.append(f"generator {who} {verb}, answered {how}: {exc}")
        run.fallback = run.fallback or (bool(failures) and answering == "extractive")

    def _limits(self, answering: str, asked: str) -> ContextLimits:
        return self.profiles.context_limits(asked if answering == "extractive" else answering)

    async def _attempt(self, run: _Run, name: str, route: dict[str, str] | None, *,
                       previous: tuple[Citation, ...] | None = None) -> AsyncIterator[AnswerEvent]:
        """Answer with profile ``name`` (falling back along :meth:`Profiles.chain`): ``sources``
        (unless ``previous`` already listed the same passages), deltas, then ``done`` or ``error``."""
        chain = self.profiles.chain(name)
        allow = self.profiles.fallback_allowed(name)
        timings = dict(run.timings)
        failures: list[tuple[str, str, str, Exception]] = []
        generator, answering, pos = await self._start_from(chain, 0, failures, allow)
        self._warn(run, failures, answering)
        if not run.params.logprobs and (self.record_confidence or self.routing.mode == "cascade"):
            run.params = replace(run.params, logprobs=True)
        args = (run.question, run.hits, run.history, run.params)
        packed, prompt = await asyncio.to_thread(self._prompt, generator, *args, self._limits(answering, name))
        timings["pack_ms"] = (time.perf_counter() - run.started) * 1000 - timings["retrieve_ms"]
        versions = self._versions(answering, generator, route, run.arm)
        context = tuple(packed.citations.values())
        if previous is None or [c.chunk_id for c in previous] != [c.chunk_id for c in context]:
            yield AnswerEvent("sources", citations=context, versions=versions, **run.state())

        cites, infer = CitationStream(packed.citations), self._attributor(packed)
        gen_started = time.perf_counter()
        first = True
        final = None
        stream = generator.stream(prompt, run.params)
        try:
            while True:
                try:
                    delta = await stream.__anext__()
                except StopAsyncIteration:
                    break
                except (BackendError, GeneratorError) as exc:
                    if not first or answering == "extractive" or not allow:
                        M.PROFILE_REQUESTS.labels(answering, "error").inc()
                        yield AnswerEvent("error", error=str(exc), timings=finish_timings(timings, run.started, gen_started),
                                          versions=versions, **run.state())
                        return
                    failed: list[tuple[str, str, str, Exception]] = [(answering, generator.name, "failed", exc)]
                    self.profiles.mark_down(answering, exc)
                    generator, answering, pos = await self._start_from(chain, pos + 1, failed, allow, "failed")
                    self._warn(run, failed, answering)
                    packed, prompt = self._prompt(generator, *args, self._limits(answering, name))
                    cites, infer = CitationStream(packed.citations), self._attributor(packed)
                    versions = self._versions(answering, generator, route, run.arm)
                    stream = generator.stream(prompt, run.params)
                    continue
                if first and delta.text:
                    timings["ttft_ms"] = (time.perf_counter() - run.started) * 1000
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
        observe_profile(answering, timings, usage)
        self.profiles.down.pop(answering, None)  # it answered: up again
        yield AnswerEvent("done", citations=with_inferred(cites.cited, infer, packed),
                          finish_reason=final.finish_reason if final else "stop", usage=usage,
                          timings=finish_timings(timings, run.started, gen_started), screening=run.screening, **run.state(),
                          attribution=attribution_counts(infer), versions=versions, confidence=confidence_of(final))

    def _attributor(self, packed: PackedContext) -> Attributor | None:
        """Labels for the sentences the model leaves unlabelled (``citations.infer``)."""
        cfg = self.services.settings.citations
        if not cfg.infer:
            return None
        return Attributor({p.label: p.chunk.text for p in packed.passages}, min_support=cfg.min_support,
                          skip=UNKNOWN.values())

    def _prompt(self, generator: Generator, question: str, hits: list, history: Sequence[Mapping[str, str]],
                params: GenerationParams, limits: ContextLimits) -> tuple[PackedContext, Prompt]:
        """Pack the hits into what is left of the model's window (within the profile's ``limits``),
        then build the prompt. The examples go when they would leave the context less than
        ``EXAMPLE_ROOM`` tokens."""
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


@dataclass(slots=True)
class _Run:
    """One question's state across its generation attempts (fallbacks, the cascade's two)."""

    started: float
    timings: dict[str, float]
    warnings: list[str]
    screening: Screening
    question: str
    hits: list
    history: Sequence[Mapping[str, str]]
    params: GenerationParams
    arm: str | None
    fallback: bool = False  # every profile tried was down: the extractive answerer answered

    def state(self) -> dict[str, Any]:
        return {"degraded": bool(self.warnings), "warnings": tuple(self.warnings), "fallback": self.fallback}


