"""The ``openai`` generator: any OpenAI-compatible chat/completions server, e.g. ``vllm serve``.

It talks to the server with the ``openai`` SDK's :class:`openai.AsyncOpenAI` (``pip install
'ragqa[openai]'``): ``chat.completions.create`` with ``stream=True`` and
``stream_options.include_usage``, ``prompt.messages`` as they are, and ``temperature``,
``top_p``, ``max_tokens``, ``stop`` (params' then the prompt's) and ``seed``; vLLM's own
sampling parameters (``repetition_penalty``; other servers may ignore it) go in ``extra_body``.
With ``params.logprobs`` (the cascade and ``ragqa eval answers`` set it) it asks for
``logprobs`` (the sampled tokens' only, no alternatives) and reports their mean and lowest on the
final delta (``logprob``, ``min_logprob``: the answer's confidence, which the
cascade reads); a server that sends none leaves them ``None``.

Failure rules:

- Before the first token, the SDK tries a request again ``connect_retries`` times (its
  ``max_retries``: connection errors, timeouts, 408/409/429 and 5xx, with exponential backoff
  from 0.5 s), then a connection error or a 502/503/504 raises ``BackendUnavailable`` naming
  the URL (the caller may fall back to the extractive answer), and a server that accepted the
  request but sent nothing for ``timeout_s`` raises ``BackendTimeout``.
- After the first token, any failure (connection lost, no next token within ``timeout_s``,
  an error event) raises ``GeneratorError``: it never hangs, and the HTTP layer can send an
  error event after the partial answer.
- A request the server rejects (4xx, e.g. a prompt longer than the context) raises
  ``GeneratorError`` with the server's message and status.

``start()`` lists the models: the server must answer and serve ``model`` (the first served
model when ``model`` is unset); ``context_window`` is its ``max_model_len`` (vLLM reports
it), else the configured ``max_model_len``, else 4096. ``count_tokens`` asks vLLM's
``POST /tokenize`` (the served model's own tokenizer; a synchronous call of a few ms, at
most 5 s, with answers cached); on a server without it (or when it fails), it estimates: one
token per CJK character plus one per 3 other characters, more than real tokenizers count for
English and Chinese, so packed prompts still fit. Closing a stream early closes its HTTP
response, and vLLM aborts the request.

Example::

    gen = OpenAIGenerator("http://127.0.0.1:8001/v1", model="Qwen/Qwen2.5-7B-Instruct")
    await gen.start()
    async for delta in gen.stream(prompt, GenerationParams(max_tokens=256)):
        print(delta.text, end="")
    await gen.close()
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import httpx

from rag.config import GeneratorSettings
from rag.errors import BackendTimeout, BackendUnavailable, ConfigError, GeneratorError
from rag.text import estimate_tokens as _estimate
from rag.text import shorten as _short
from rag.types import GenerationDelta, GenerationParams, Prompt

try:
    import openai
except ImportError:  # the SDK comes with the openai extra; constructing the generator says so
    openai = None  # type: ignore[assignment]

__all__ = ["OpenAIGenerator", "estimate_tokens"]

_NOT_READY = {502, 503, 504}
# Parameters of chat.completions.create; what else _payload() puts in the body (vLLM's
# sampling extensions) goes in extra_body.
_SDK_ARGS = frozenset({"model", "messages", "stream", "stream_options", "temperature", "top_p",
                       "max_tokens", "stop", "seed", "logprobs"})


def estimate_tokens(text: str) -> int:
    """A tokenizer-free over-estimate: one token per CJK character, one per 3 others
    (:func:`rag.text.estimate_tokens` with ``upper=True``)."""
    return _estimate(text, upper=True)


class OpenAIGenerator:
    """A ``rag.types.Generator`` for an OpenAI-compatible server. See the module docstring."""

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        connect_retries: int = 2,
        max_model_len: int | None = None,
    ) -> None:
        if openai is None:
            raise ConfigError("the openai generator needs the openai SDK: pip install 'ragqa[openai]'")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self.connect_retries = connect_retries
        self.context_window = max_model_len or 4096
        self._api_key = api_key
        self._timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        self._client: openai.AsyncOpenAI | None = None
        self._sync: httpx.Client | None = None  # for /tokenize, when the server has it
        self._tokenize_url = self.base_url.removesuffix("/v1") + "/tokenize"
        self._count_remote = functools.lru_cache(maxsize=4096)(self._count_uncached)

    @classmethod
    def from_settings(cls, settings: GeneratorSettings) -> OpenAIGenerator:
        if not settings.base_url:
            raise ConfigError("generator.base_url is required for the openai backend (e.g. http://127.0.0.1:8001/v1)")
        key = settings.api_key.get_secret_value() if settings.api_key else None
        return cls(
            settings.base_url, settings.model, api_key=key, timeout_s=settings.timeout_s,
            connect_retries=settings.connect_retries, max_model_len=settings.max_model_len,
        )

    async def start(self) -> None:
        """Check that the server answers and serves the model; learn its context window."""
        if self._client is None:
            # A server without auth takes any key; the SDK insists on one.
            self._client = openai.AsyncOpenAI(base_url=self.base_url, api_key=self._api_key or "none",
                                              timeout=self._timeout, max_retries=self.connect_retries)  # type: ignore[arg-type]
        try:
            await self._check_server()
        except BaseException:
            await self.close()
            raise

    async def _check_server(self) -> None:
        url = f"{self.base_url}/models"
        try:
            cards = {m.id: m for m in (await self._client.models.list()).data}  # type: ignore[union-attr]
        except (openai.AuthenticationError, openai.PermissionDeniedError) as exc:
            raise BackendUnavailable(f"generator server {url} refused the API key (HTTP {exc.status_code})") from exc
        except openai.APIStatusError as exc:
            if exc.status_code in _NOT_READY:
                raise self._unavailable(exc) from exc
            raise BackendUnavailable(f"generator server {url} gave no model list "
                                     f"(HTTP {exc.status_code}): {_error_text(exc)}") from exc
        except openai.APIConnectionError as exc:
            raise self._unavailable(exc) from exc
        except (openai.APIError, ValueError, TypeError) as exc:
            raise BackendUnavailable(f"generator server {url} gave no model list: {_short(exc)}") from exc
        if self.model is None and cards:
            self.model = next(iter(cards))
        if self.model not in cards:
            raise ConfigError(f"generator.model {self.model!r} is not served by {self.base_url} (it serves: {', '.join(cards) or 'nothing'})")
        if getattr(cards[self.model], "max_model_len", None):  # vLLM's extension of the model card
            self.context_window = int(cards[self.model].max_model_len)  # type: ignore[union-attr]
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        try:
            async with httpx.AsyncClient(headers=headers, timeout=self._timeout) as http:
                probe = await http.post(self._tokenize_url, json={"model": self.model, "prompt": "ok"})
            has_tokenize = probe.status_code == 200 and "count" in probe.json()
        except (httpx.HTTPError, ValueError):
            has_tokenize = False
        if has_tokenize and self._sync is None:
            # count_tokens is synchronous (it blocks the event loop): keep its wait short.
            self._sync = httpx.Client(headers=headers, timeout=min(self.timeout_s, 5.0))

    async def close(self) -> None:
        client, self._client = self._client, None
        sync, self._sync = self._sync, None
        if client is not None:
            await client.close()
        if sync is not None:
            sync.close()

    def count_tokens(self, text: str) -> int:
        """The served model's token count (vLLM ``/tokenize``), else :func:`estimate_tokens`."""
        if self._sync is None:
            return estimate_tokens(text)
        return self._count_remote(text)

    def _count_uncached(self, text: str) -> int:
        try:
            resp = self._sync.post(  # type: ignore[union-attr]
                self._tokenize_url, json={"model": self.model, "prompt": text, "add_special_tokens": False})
            resp.raise_for_status()
            return int(resp.json()["count"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return estimate_tokens(text)

    def _payload(self, prompt: Prompt, params: GenerationParams) -> dict[str, Any]:
        """The request body: the SDK's parameters, and vLLM's extensions beside them."""
        stop = list(dict.fromkeys(s for s in (*params.stop, *prompt.stop) if s))
        body: dict[str, Any] = {
            "model": self.model, "messages": [dict(m) for m in prompt.messages], "stream": True,
            "stream_options": {"include_usage": True}, "temperature": params.temperature,
            "top_p": params.top_p, "max_tokens": params.max_tokens,
            "repetition_penalty": params.repetition_penalty,
        }
        if params.logprobs:
            body["logprobs"] = True
        if stop:
            body["stop"] = stop
        if params.seed is not None:
            body["seed"] = params.seed
        return body

    def _unavailable(self, exc: openai.APIError) -> BackendUnavailable | BackendTimeout | GeneratorError:
        """The error of a request that failed before its first token."""
        if isinstance(exc, openai.APITimeoutError):
            return BackendTimeout(f"generator server {self.base_url} sent nothing in {self.timeout_s:g} s")
        if isinstance(exc, openai.APIStatusError):
            error = f"(HTTP {exc.status_code}): {_error_text(exc)}"
            if exc.status_code in _NOT_READY:
                return BackendUnavailable(f"generator server {self.base_url} is not ready {error}")
            return GeneratorError(f"generator server rejected the request {error}")
        cause = exc.__cause__ or exc
        return BackendUnavailable(f"cannot reach generator server {self.base_url}: {_short(cause) or type(cause).__name__}")

    async def stream(self, prompt: Prompt, params: GenerationParams) -> AsyncIterator[GenerationDelta]:
        """Stream the answer; see the module docstring for what each failure raises."""
        if self._client is None:
            raise GeneratorError("the openai generator is not started; call start() first")
        body = self._payload(prompt, params)
        args = {k: v for k, v in body.items() if k in _SDK_ARGS}
        extra = {k: v for k, v in body.items() if k not in _SDK_ARGS}
        try:
            chunks = await self._client.chat.completions.create(**args, extra_body=extra or None)
        except openai.APIError as exc:
            raise self._unavailable(exc) from exc
        reason: str | None = None
        usage: Any = None
        started = False
        logprobs: list[float] = []
        async with chunks:  # leaving early closes the response, and vLLM aborts the request
            try:
                async for chunk in chunks:
                    usage = chunk.usage or usage
                    for choice in chunk.choices:
                        reason = choice.finish_reason or reason
                        for token in getattr(choice.logprobs, "content", None) or ():
                            if token.logprob is not None:
                                logprobs.append(float(token.logprob))
                        if choice.delta and choice.delta.content:
                            started = True
                            yield GenerationDelta(text=choice.delta.content)
            except (openai.APITimeoutError, openai.APIConnectionError) as exc:
                if not started:
                    raise self._unavailable(exc) from exc
                if isinstance(exc, openai.APITimeoutError):
                    raise GeneratorError(f"generator server sent no token for {self.timeout_s:g} s") from exc
                cause = exc.__cause__ or exc
                raise GeneratorError(f"generator stream from {self.base_url} broke: "
                                     f"{_short(cause) or type(cause).__name__}") from exc
            except openai.APIError as exc:  # an error event inside the stream
                raise GeneratorError(f"generator server failed mid-answer: {_short(exc.body or exc.message)}") from exc
            except (ValueError, TypeError) as exc:
                raise GeneratorError(f"generator stream from {self.base_url} failed: {_short(exc)}") from exc
        if reason is None:
            raise GeneratorError("generator server ended the stream without a finish reason")
        yield GenerationDelta(
            finish_reason=reason, prompt_tokens=usage.prompt_tokens if usage else None,
            completion_tokens=usage.completion_tokens if usage else None,
            logprob=round(sum(logprobs) / len(logprobs), 6) if logprobs else None,
            min_logprob=round(min(logprobs), 6) if logprobs else None,
        )


def _error_text(exc: openai.APIStatusError) -> str:
    """The server's own message (OpenAI's ``{"error": {"message": ...}}`` or vLLM's shapes)."""
    body = exc.body
    err = body.get("error", body) if isinstance(body, dict) else body
    text = err.get("message", err) if isinstance(err, dict) else err
    return _short(text if text is not None else exc.response.text)
