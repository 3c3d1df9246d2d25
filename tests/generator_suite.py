"""What every :class:`rag.types.Generator` promises. Subclass the suite and provide ``generator``.

A generator streams an answer as text deltas, the last one alone carrying ``finish_reason``
and the token counts; ``max_tokens`` ends the answer with ``"length"``, and a stop string
(from the params or the prompt) ends it with ``"stop"`` and is not returned. Closing the
stream early leaves the generator ready for the next one. ``count_tokens`` and
``context_window`` let the packer keep prompts inside the model, and a backend that is down
fails ``start()`` with ``BackendUnavailable`` or ``ConfigError``, one line.

Each test runs in its own event loop (``asyncio.run``): it starts the generator and, when
``close_after`` is set, closes it, so a fixture may build one generator per test (a client
bound to one loop) or share a loaded model (``close_after = False``).

Example::

    class TestMyGenerator(GeneratorSuite):
        @pytest.fixture
        def generator(self):
            return MyGenerator()

        @pytest.fixture
        def down(self):
            return MyGenerator(url="http://127.0.0.1:9")
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from rag.errors import BackendUnavailable, ConfigError
from rag.types import Chunk, GenerationDelta, GenerationParams, Generator, Passage, Prompt

__all__ = ["GeneratorSuite", "PROMPT"]

T = TypeVar("T")
_PASSAGE = "Paris is the capital and largest city of France, on the river Seine."
PROMPT = Prompt(
    messages=({"role": "system", "content": "Answer from the sources, citing them as [n]."},
              {"role": "user", "content": f"Sources:\n[1] {_PASSAGE}\n\nQuestion: What is the capital of France?"}),
    completion=f"[1] {_PASSAGE}\nQuestion: What is the capital of France?\nAnswer:",
    question="What is the capital of France?",
    passages=(Passage(1, Chunk(id="c1", doc_id="d1", source="s", text=_PASSAGE, hash="h1")),),
)
GREEDY = GenerationParams(temperature=0.0, max_tokens=24, seed=0)


async def collect(gen: Generator, prompt: Prompt, params: GenerationParams) -> list[GenerationDelta]:
    return [delta async for delta in gen.stream(prompt, params)]


def text_of(deltas: list[GenerationDelta]) -> str:
    return "".join(d.text for d in deltas)


def pick_stop(text: str) -> tuple[str, str]:
    """Three characters from the middle of ``text`` as a stop string, and the text before
    their first occurrence (any model's answer has some, spaces or not)."""
    for k in range(len(text) // 2, len(text) - 3):
        stop = text[k:k + 3]
        if "\ufffd" not in stop and stop.strip() and text.find(stop) > 0:
            return stop, text[: text.find(stop)]
    raise AssertionError(f"no usable stop string in {text!r}")


class GeneratorSuite:
    """Contract tests; ``generator`` (and optionally ``down``) are the subclass's fixtures."""

    close_after: bool = True  # close after each test (False: a shared, loaded model)

    def run(self, gen: Generator, work: Callable[[], Awaitable[T]]) -> T:
        async def session() -> T:
            await gen.start()
            try:
                return await work()
            finally:
                if self.close_after:
                    await gen.close()

        return asyncio.run(session())

    def answer(self, gen: Generator, params: GenerationParams = GREEDY) -> list[GenerationDelta]:
        return self.run(gen, lambda: collect(gen, PROMPT, params))

    def test_is_a_generator_with_a_name_and_context_window(self, generator: Generator) -> None:
        assert isinstance(generator, Generator)
        assert isinstance(generator.name, str) and generator.name
        self.run(generator, lambda: asyncio.sleep(0))  # start() then close(): the window may come from the server
        assert isinstance(generator.context_window, int) and generator.context_window > 0

    def test_deltas_join_to_the_answer_and_only_the_last_finishes(self, generator: Generator) -> None:
        deltas = self.answer(generator)
        *pieces, last = deltas
        assert pieces and text_of(pieces).strip(), deltas
        assert all(d.finish_reason is None for d in pieces)
        assert last.finish_reason in ("stop", "length") and last.text == ""
        assert isinstance(last.completion_tokens, int) and last.completion_tokens >= 0

    def test_max_tokens_ends_the_answer_with_length(self, generator: Generator) -> None:
        full = text_of(self.answer(generator))
        deltas = self.answer(generator, GenerationParams(temperature=0.0, max_tokens=2, seed=0))
        assert deltas[-1].finish_reason == "length"
        assert deltas[-1].completion_tokens is not None and deltas[-1].completion_tokens <= 2
        short = text_of(deltas)
        assert short and len(short) < len(full) and full.startswith(short)

    def test_a_stop_string_ends_the_answer_and_is_not_returned(self, generator: Generator) -> None:
        stop, expected = pick_stop(text_of(self.answer(generator)))
        for params, prompt in ((GenerationParams(temperature=0.0, max_tokens=24, seed=0, stop=(stop,)), PROMPT),
                               (GREEDY, dataclasses.replace(PROMPT, stop=(stop,)))):
            deltas = self.run(generator, lambda p=prompt, q=params: collect(generator, p, q))  # type: ignore[misc]
            assert (text_of(deltas), deltas[-1].finish_reason) == (expected, "stop")

    def test_closing_the_stream_early_leaves_it_ready_for_the_next(self, generator: Generator) -> None:
        async def first_then_whole() -> tuple[str, list[GenerationDelta]]:
            stream: Any = generator.stream(PROMPT, GREEDY)
            first = await anext(stream)
            await stream.aclose()
            return first.text, await collect(generator, PROMPT, GREEDY)

        first, whole = self.run(generator, first_then_whole)
        assert text_of(whole).startswith(first) and whole[-1].finish_reason in ("stop", "length")

    def test_count_tokens_fits_the_context_window(self, generator: Generator) -> None:
        prompt = "\n".join(m["content"] for m in PROMPT.messages)
        texts = ["", _PASSAGE, _PASSAGE + " " + _PASSAGE, prompt]

        async def counts() -> list[int]:  # started: a server's tokenizer is asked once it is known
            return [generator.count_tokens(t) for t in texts]

        empty, short, double, whole = self.run(generator, counts)
        assert empty == 0 and isinstance(short, int) and 0 < short < double
        assert whole < generator.context_window

    def test_a_backend_that_is_down_fails_start_with_one_line(self, down: Generator | None) -> None:
        if down is None:
            pytest.skip("this generator has no backend to be down")
        with pytest.raises((BackendUnavailable, ConfigError)) as info:
            asyncio.run(down.start())
        asyncio.run(down.close())
        assert str(info.value) and "\n" not in str(info.value)

    @pytest.fixture
    def down(self) -> Generator | None:
        return None
