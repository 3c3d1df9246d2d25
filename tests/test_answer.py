"""The answer pipeline on a real index: retrieve, pack, prompt, generate, cite, fall back."""

from __future__ import annotations

import asyncio

import pytest

from rag.answer import Answerer
from rag.errors import BackendUnavailable, GeneratorError
from rag.generators.extractive import ExtractiveGenerator
from rag.generators.scripted import ScriptedGenerator
from rag.prompts import UNKNOWN
from tests.corpus import doc_text
from tests.live import run


def test_a_streamed_answer_has_sources_deltas_and_cited_sources(indexed):
    _, body = doc_text(3)
    gen = ScriptedGenerator(["The note ", "says so [1", "] and [7", "]."])
    events = run(Answerer(indexed, generator=gen).stream(body.split(".")[0], top_k=4))
    assert [e.kind for e in events][0] == "sources" and events[-1].kind == "done"
    sources = events[0].citations
    assert [c.label for c in sources] == list(range(1, len(sources) + 1)) and sources[0].doc_id == "alpha:d03.md"
    text = "".join(e.text for e in events if e.kind == "delta")
    assert text == "The note says so [1] and."  # [7] was not in the context
    done = events[-1]
    assert [c.label for c in done.citations] == [1] and done.citations[0].url.endswith("d03.md")
    assert done.usage == {"prompt_tokens": 42, "completion_tokens": 4} and not done.degraded
    assert {"retrieve_ms", "generate_ms", "total_ms", "ttft_ms"} <= set(done.timings)
    prompt = gen.prompts[0]
    assert prompt.passages[0].chunk.doc_id == "alpha:d03.md" and "[1] Note zordaith" in prompt.messages[-1]["content"]


def test_the_context_fits_the_generators_window(indexed):
    gen = ScriptedGenerator(["ok"])
    gen.context_window = 700
    run(Answerer(indexed, generator=gen).stream("river mountain lantern", top_k=30,
                                                overrides={"max_tokens": 200}))
    prompt = gen.prompts[0]
    used = gen.count_tokens("\n".join(m["content"] for m in prompt.messages))
    assert used + 200 <= 700 and 0 < len(prompt.passages) < 30


def test_the_context_limits_follow_the_generator_backend_and_focus_cuts_passages(indexed, monkeypatch):
    """llamacpp packs its backend's default (the best passage); focus_sentences keeps the
    sentences around each passage's best match for the question."""
    title, body = doc_text(3)
    question = body.split(".")[0]
    retrieval = indexed.settings.retrieval
    assert indexed.settings.generator.backend == "llamacpp" and retrieval.max_context_chunks is None
    gen = ScriptedGenerator(["ok"])
    run(Answerer(indexed, generator=gen).stream(question, top_k=6))
    assert [p.chunk.doc_id for p in gen.prompts[0].passages] == ["alpha:d03.md"]
    assert gen.prompts[0].passages[0].chunk.text.startswith(title)

    monkeypatch.setattr(retrieval, "max_context_chunks", 3)
    monkeypatch.setattr(retrieval, "focus_sentences", 1)
    run(Answerer(indexed, generator=gen).stream(question, top_k=6))
    passages = gen.prompts[1].passages
    assert len(passages) == 3 and passages[0].chunk.doc_id == "alpha:d03.md"
    assert passages[0].chunk.text == f"{title} {question}. …"  # the chunk starts with its title
    assert f"\n{title} {question}. …\n\n[2] " in gen.prompts[1].messages[-1]["content"]


def test_the_example_gives_way_to_the_passages_in_a_small_window(indexed):
    roomy, small = ScriptedGenerator(["ok"]), ScriptedGenerator(["ok"])
    small.context_window = 600  # words here: the rules, the example and 200 answer tokens leave < 256
    for gen in (roomy, small):
        run(Answerer(indexed, generator=gen).stream("river mountain lantern", overrides={"max_tokens": 200}))
    assert "<examples>" in roomy.prompts[0].messages[0]["content"]
    assert "<examples>" not in small.prompts[0].messages[0]["content"] and small.prompts[0].passages


def test_a_generator_that_is_down_falls_back_to_extractive_and_is_flagged(indexed):
    _, body = doc_text(7)
    sentence = body.split(".")[0]
    answer = asyncio.run(Answerer(indexed, generator=ScriptedGenerator([], fail_start=True)).ask(sentence))
    assert answer.degraded
    assert sentence in answer.text and "[1]" in answer.text
    assert answer.citations and answer.citations[0].doc_id == "alpha:d07.md"


def test_a_failure_before_the_first_token_also_falls_back(indexed):
    _, body = doc_text(4)
    gen = ScriptedGenerator(["never"], fail_after=0)
    events = run(Answerer(indexed, generator=gen).stream(body.split(".")[0]))
    assert events[-1].kind == "done" and events[-1].degraded
    assert "never" not in "".join(e.text for e in events if e.kind == "delta")


def test_a_failure_mid_answer_ends_with_an_error_event(indexed):
    gen = ScriptedGenerator(["Half ", "an answer", "lost"], fail_after=2)
    events = run(Answerer(indexed, generator=gen).stream("copper violin"))
    assert [e.kind for e in events] == ["sources", "delta", "delta", "error"]
    assert "closed the stream" in events[-1].error
    with pytest.raises(GeneratorError):
        asyncio.run(Answerer(indexed, generator=ScriptedGenerator(["a", "b"], fail_after=1)).ask("copper violin"))


def test_no_fallback_when_turned_off(indexed, monkeypatch):
    monkeypatch.setattr(indexed.settings.generator, "fallback", False)
    with pytest.raises(BackendUnavailable):
        asyncio.run(Answerer(indexed, generator=ScriptedGenerator([], fail_start=True)).ask("copper"))


def test_closing_the_stream_early_closes_the_generator(indexed):
    gen = ScriptedGenerator(["a ", "b ", "c ", "d "])

    async def first_delta():
        agen = Answerer(indexed, generator=gen).stream("copper violin")
        async for event in agen:
            if event.kind == "delta":
                break
        await agen.aclose()

    asyncio.run(first_delta())
    assert gen.closed_early


def test_extractive_answers_from_the_context_or_says_it_does_not_know(indexed):
    _, body = doc_text(9)
    answer = asyncio.run(Answerer(indexed, generator=ExtractiveGenerator()).ask(body.split(".")[0]))
    assert body.split(".")[0] in answer.text and not answer.degraded
    none = asyncio.run(Answerer(indexed, generator=ExtractiveGenerator()).ask("qwxyzzy plughfrob?"))
    assert none.text == UNKNOWN["en"] and none.citations == ()
