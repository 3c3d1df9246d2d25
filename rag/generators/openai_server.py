"""The ``openai`` generator: any OpenAI-compatible chat/completions server, e.g. ``vllm serve``.

It speaks the HTTP API with httpx (already a dependency; the ``openai`` SDK would add a
package and its own retry and timeout layers on top of httpx, while this needs exact
control of both): ``POST /chat/completions`` with ``stream=True`` and
``stream_options.include_usage``, ``prompt.messages`` as they are, and ``temperature``,
``top_p``, ``max_tokens``, ``stop`` (params' then the prompt's), ``seed`` and
``repetition_penalty`` (a vLLM extension; other servers may ignore it).

Failure rules:

- Before the first token, connection errors and 502/503/504 are retried ``connect_retries``
  times with exponential backoff, then raise ``BackendUnavailable`` naming the URL (the
  caller may fall back to the extractive answer). A server that accepts the request but
  sends nothing for ``timeout_s`` raises ``BackendTimeout``.
- After the first token, any failure (connection lost, no next token within ``timeout_s``,
  an error event) raises ``GeneratorError``: it never hangs, and the HTTP layer can send an
  error event after the partial answer.
- A request the server rejects (4xx, e.g. a prompt longer than the context) raises
  ``GeneratorError`` with the server's message, without retries.

``start()`` checks ``GET /models``: the server must answer and serve ``model`` (the first
served model when ``model`` is unset); ``context_window`` is its ``max_model_len`` (vLLM
reports it), else the configured ``max_model_len``, else 4096. ``count_tokens`` asks vLLM's
``POST /tokenize`` (the served model's own tokenizer; a synchronous call of a few ms, at
most 5 s, with answers cached); on a server without it (or when it fails), it estimates: one token per CJK character plus one per 3 other characters,
more than real tokenizers count for English and Chinese, so packed prompts still fit.
Closing a stream early closes its HTTP response, and vLLM aborts the request.

Example::

    gen = OpenAIGenerator("http://127.0.0.1:8001/v1", model="Qwen/Qwen2.5-7B-Instruct")
    await gen.start()
    async for delta in gen.stream(prompt, GenerationParams(max_tokens=256)):
        print(delta.text, end="")
    await gen.close()
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx

from rag.config import GeneratorSettings
from rag.errors import BackendTimeout, BackendUnavailable, ConfigError, GeneratorError
from rag.types import GenerationDelta, GenerationParams, Prompt

__all__ = ["OpenAIGenerator", "estimate_tokens"]

_RETRY_STATUS = {502, 503, 504}
_CJK = re.compile(r"[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")


def estimate_tokens(text: str) -> int:
    """A tokenizer-free over-estimate: one token per CJK character, one per 3 others."""
    cjk = len(_CJK.findall(text))
    return cjk + math.ceil((len(text) - cjk) / 3)


def _short(text: object) -> str:
    text = " ".join(str(text).split())
    return text if len(text) < 300 else text[:297] + "..."


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
        backoff_s: float = 0.5,
        max_model_len: int | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self.connect_retries = connect_retries
        self.backoff_s = backoff_s
        self.context_window = max_model_len or 4096
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        self._client: httpx.AsyncClient | None = None
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
            self._client = httpx.AsyncClient(headers=self._headers, timeout=self._timeout)
        try:
            await self._check_server()
        except BaseException:
            await self.close()
            raise

    async def _check_server(self) -> None:
        url = f"{self.base_url}/models"
        resp = await self._retrying(lambda: self._client.get(url))  # type: ignore[union-attr]
        if resp.status_code in (401, 403):
            raise BackendUnavailable(f"generator server {url} refused the API key (HTTP {resp.status_code})")
        try:
            resp.raise_for_status()
            cards = {c["id"]: c for c in resp.json()["data"]}
        except (httpx.HTTPStatusError, ValueError, KeyError, TypeError) as exc:
            raise BackendUnavailable(f"generator server {url} gave no model list: {_short(exc)}") from exc
        if self.model is None and cards:
            self.model = next(iter(cards))
        if self.model not in cards:
            raise ConfigError(f"generator.model {self.model!r} is not served by {self.base_url} (it serves: {', '.join(cards) or 'nothing'})")
        if cards[self.model].get("max_model_len"):
            self.context_window = int(cards[self.model]["max_model_len"])
        try:
            probe = await self._client.post(self._tokenize_url, json={"model": self.model, "prompt": "ok"})  # type: ignore[union-attr]
            has_tokenize = probe.status_code == 200 and "count" in probe.json()
        except (httpx.HTTPError, ValueError):
            has_tokenize = False
        if has_tokenize and self._sync is None:
            # count_tokens is synchronous (it blocks the event loop): keep its wait short.
            self._sync = httpx.Client(headers=self._headers, timeout=min(self.timeout_s, 5.0))

    async def close(self) -> None:
        client, self._client = self._client, None
        sync, self._sync = self._sync, None
        if client is not None:
            await client.aclose()
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

    async def _retrying(self, send: Any) -> httpx.Response:
        """``send()`` with retries of connection errors and 502/503/504."""
        for attempt in range(self.connect_retries + 1):
            try:
                resp = await send()
                if resp.status_code not in _RETRY_STATUS or attempt == self.connect_retries:
                    return resp
                await resp.aclose()
                error: str = f"HTTP {resp.status_code}"
            except httpx.TimeoutException as exc:
                if not isinstance(exc, httpx.ConnectTimeout):
                    raise BackendTimeout(f"generator server {self.base_url} sent nothing in {self.timeout_s:g} s") from exc
                error = f"connect timeout: {_short(exc)}"
            except httpx.TransportError as exc:
                error = _short(exc) or type(exc).__name__
                if attempt == self.connect_retries:
                    raise BackendUnavailable(f"cannot reach generator server {self.base_url}: {error}") from exc
            if attempt == self.connect_retries:
                break
            await asyncio.sleep(self.backoff_s * 2**attempt)
        raise BackendUnavailable(f"cannot reach generator server {self.base_url}: {error}")

    def _payload(self, prompt: Prompt, params: GenerationParams) -> dict[str, Any]:
        stop = list(dict.fromkeys(s for s in (*params.stop, *prompt.stop) if s))
        body: dict[str, Any] = {
            "model": self.model, "messages": [dict(m) for m in prompt.messages], "stream": True,
            "stream_options": {"include_usage": True}, "temperature": params.temperature,
            "top_p": params.top_p, "max_tokens": params.max_tokens,
            "repetition_penalty": params.repetition_penalty,
        }
        if stop:
            body["stop"] = stop
        if params.seed is not None:
            body["seed"] = params.seed
        return body

    async def stream(self, prompt: Prompt, params: GenerationParams) -> AsyncIterator[GenerationDelta]:
        """Stream the answer; see the module docstring for what each failure raises."""
        if self._client is None:
            raise GeneratorError("the openai generator is not started; call start() first")
        client, url, body = self._client, f"{self.base_url}/chat/completions", self._payload(prompt, params)
        started = False
        for attempt in range(self.connect_retries + 1):
            last = attempt == self.connect_retries
            try:
                async with client.stream("POST", url, json=body) as resp:
                    if resp.status_code in _RETRY_STATUS and not last:
                        await asyncio.sleep(self.backoff_s * 2**attempt)
                        continue
                    if resp.status_code >= 400:
                        await resp.aread()
                        error = f"(HTTP {resp.status_code}): {_error_text(resp)}"
                        if resp.status_code in _RETRY_STATUS:
                            raise BackendUnavailable(f"generator server {self.base_url} is not ready {error}")
                        raise GeneratorError(f"generator server rejected the request {error}")
                    reason: str | None = None
                    usage: dict[str, Any] = {}
                    async for line in resp.aiter_lines():
                        if not line.startswith("data:"):
                            continue
                        data = line[5:].strip()
                        if data == "[DONE]":
                            break
                        event = json.loads(data)
                        if event.get("error"):
                            raise GeneratorError(f"generator server failed mid-answer: {_short(event['error'])}")
                        usage = event.get("usage") or usage
                        for choice in event.get("choices") or ():
                            text = (choice.get("delta") or {}).get("content") or ""
                            reason = choice.get("finish_reason") or reason
                            if text:
                                started = True
                                yield GenerationDelta(text=text)
                    if reason is None:
                        raise GeneratorError("generator server ended the stream without a finish reason")
                    yield GenerationDelta(
                        finish_reason=reason, prompt_tokens=usage.get("prompt_tokens"),
                        completion_tokens=usage.get("completion_tokens"),
                    )
                    return
            except httpx.TimeoutException as exc:
                if started:
                    raise GeneratorError(f"generator server sent no token for {self.timeout_s:g} s") from exc
                if not isinstance(exc, httpx.ConnectTimeout):
                    raise BackendTimeout(f"generator server {self.base_url} sent nothing in {self.timeout_s:g} s") from exc
                if last:
                    raise BackendUnavailable(f"cannot reach generator server {self.base_url}: connect timeout") from exc
            except httpx.TransportError as exc:
                error = _short(exc) or type(exc).__name__
                if started:
                    raise GeneratorError(f"generator stream from {self.base_url} broke: {error}") from exc
                if last:
                    raise BackendUnavailable(f"cannot reach generator server {self.base_url}: {error}") from exc
            except (httpx.HTTPError, ValueError) as exc:
                raise GeneratorError(f"generator stream from {self.base_url} failed: {_short(exc)}") from exc
            await asyncio.sleep(self.backoff_s * 2**attempt)


def _error_text(resp: httpx.Response) -> str:
    try:
        body = resp.json()
        err = body.get("error", body) if isinstance(body, dict) else body
        return _short(err.get("message", err) if isinstance(err, dict) else err)
    except ValueError:
        return _short(resp.text)
