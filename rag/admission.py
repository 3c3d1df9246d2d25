"""Admission control: a bound on the answers generated at once, and on those waiting for a turn.

A burst of questions larger than the service can answer is not accepted whole (where everyone
would wait for all of it): at most ``max_in_flight`` answers are retrieved and generated at a
time (``serve.max_in_flight``; see :func:`admission_for` for ``auto``), at most
``max_queued`` more wait for a slot, and past that a question is refused at once
with :class:`Overloaded` (the service answers ``503`` with ``Retry-After``). Answers from the
answer cache never take a slot. ``answers_in_flight`` and ``answers_queued`` are gauges and
``answers_rejected_total`` counts the refusals. The bound is per process (per worker).

Example::

    admission = Admission(max_in_flight=4, max_queued=32)
    async with admission.slot():
        ...  # retrieve and generate
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from rag.errors import Overloaded
from rag.metrics import ANSWERS_IN_FLIGHT, ANSWERS_QUEUED, ANSWERS_REJECTED

if TYPE_CHECKING:
    from rag.config import Settings

__all__ = ["Admission", "admission_for"]

REMOTE_GENERATORS = ("vllm", "openai")
REMOTE_IN_FLIGHT = 32  # a generator server batches: many answers at once cost little more than one


class Admission:
    """Per-process slots for answers (create and use it on one event loop)."""

    def __init__(self, max_in_flight: int, max_queued: int, retry_after_s: float = 2.0) -> None:
        if max_in_flight < 1 or max_queued < 0:
            raise ValueError("max_in_flight must be >= 1 and max_queued >= 0")
        self.max_in_flight, self.max_queued, self.retry_after_s = max_in_flight, max_queued, retry_after_s
        self._slots = asyncio.Semaphore(max_in_flight)
        self.in_flight = 0
        self.queued = 0

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """A slot for one answer; raises :class:`Overloaded` when every slot is taken and the
        queue is full."""
        if self._slots.locked() and self.queued >= self.max_queued:
            ANSWERS_REJECTED.inc()
            raise Overloaded(
                f"the service is answering {self.in_flight} questions with {self.queued} waiting, its limit "
                f"(serve.max_in_flight {self.max_in_flight}, serve.max_queued {self.max_queued}); "
                f"try again in {self.retry_after_s:g} s", retry_after_s=self.retry_after_s)
        self.queued += 1
        ANSWERS_QUEUED.set(self.queued)
        try:
            await self._slots.acquire()
        finally:
            self.queued -= 1
            ANSWERS_QUEUED.set(self.queued)
        self.in_flight += 1
        ANSWERS_IN_FLIGHT.set(self.in_flight)
        try:
            yield
        finally:
            self.in_flight -= 1
            ANSWERS_IN_FLIGHT.set(self.in_flight)
            self._slots.release()


def admission_for(settings: Settings) -> Admission | None:
    """The bound ``serve.max_in_flight`` and ``serve.max_queued`` ask for; ``None`` for no bound.

    ``auto``: as many answers at once as CPU cores when the generator runs in this process
    (the llamacpp model, the extractive answerer: more would only slow each down), 32 with a
    generator server; and a queue as deep as that. On 2 cores with the extractive generator
    this keeps the accepted answers' p99 within the unloaded p99 at 2x and 5x the sustainable
    rate, where 8 at once and 64 waiting made it 60x (``bench/RESULTS-overload.md``).
    """
    serve = settings.serve
    if serve.max_in_flight is None or serve.max_in_flight == 0:
        return None
    if serve.max_in_flight == "auto":
        remote = settings.generator.backend in REMOTE_GENERATORS
        in_flight = REMOTE_IN_FLIGHT if remote else max(1, os.cpu_count() or 1)
    else:
        in_flight = int(serve.max_in_flight)
    queued = in_flight if serve.max_queued == "auto" else int(serve.max_queued)
    return Admission(in_flight, queued, serve.retry_after_s)
