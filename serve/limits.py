"""Input limits: body size (413, before the body is parsed), message count and question length (422).

Example::

    app.add_middleware(BodyLimit, max_bytes=settings.serve.max_body_bytes)
    check_question(question, settings.serve, "messages.3.content")
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag.config import ServeSettings
from rag.errors import RequestError
from serve.errors import error_body

__all__ = ["BodyLimit", "check_question", "check_messages"]


DRAIN_BYTES = 16 * 1024 * 1024


class BodyLimit:
    """Refuse bodies over ``max_bytes`` with a 413: by ``Content-Length`` before parsing, or
    while reading a chunked body (a body within the limit is buffered and replayed to the app).

    A refused body of up to ``DRAIN_BYTES`` is read and dropped before answering: closing a
    socket with unread data resets it, and the client would see a broken connection instead
    of the 413. Larger ones get the answer at once, and the connection is closed.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            drained = int(length) <= DRAIN_BYTES and await self._drain(receive, 0)
            await self._refuse(send, int(length), close=not drained)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                drained = not message.get("more_body", False) or await self._drain(receive, size)
                await self._refuse(send, None, close=not drained)
                return
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: wait for the disconnect

        await self.app(scope, replay, send)

    @staticmethod
    async def _drain(receive: Receive, size: int) -> bool:
        """Read the rest of the body, up to ``DRAIN_BYTES`` in all; whether it all came."""
        while size <= DRAIN_BYTES:
            message = await receive()
            if message["type"] != "http.request":
                return False
            size += len(message.get("body", b""))
            if not message.get("more_body", False):
                return True
        return False

    async def _refuse(self, send: Send, length: int | None, close: bool) -> None:
        got = f"{length} bytes" if length is not None else "more than that"
        body = json.dumps(error_body(f"the request body is too large: at most {self.max_bytes} bytes "
                                     f"(serve.max_body_bytes), got {got}", "invalid_request_error",
                                     None, "too_large")).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def check_messages(count: int, limits: ServeSettings) -> None:
    if count > limits.max_messages:
        raise RequestError("messages", f"at most {limits.max_messages} messages per request "
                           f"(serve.max_messages), got {count}")


def check_question(question: str, limits: ServeSettings, param: str) -> None:
    if not question.strip():
        raise RequestError(param, "the question is empty")
    if len(question) > limits.max_question_chars:
        raise RequestError(param, f"the question is {len(question)} characters long; at most "
                           f"{limits.max_question_chars} are allowed (serve.max_question_chars)")
