"""The sampling policy: temperature by question type and conversation turn, within limits.

A rule-based classifier sorts questions into three kinds:

* ``factual``: who/what/when/how-many questions, definitions, look-ups. They get the
  factual temperature (0.3): the answer must stay with the documents.
* ``creative``: requests to write, imagine, brainstorm or rephrase. They start at the
  creative temperature (1.2).
* ``open``: everything else (opinions, comparisons, chat). They start at the first-turn
  temperature (1.0).

Within a conversation, the temperature of creative and open questions decays by
``turn_decay`` (0.1) per turn down to ``temperature_floor`` (0.3), so a long exchange
settles. Nucleus sampling uses ``top_p`` 0.9 and ``repetition_penalty`` 1.2.

A request may override each value, within the limits of the settings; a value outside them
raises ``RequestError`` naming the field.

Example::

    policy = SamplingPolicy(settings.sampling)
    params = policy.params("Write a haiku about TLS", turn=1)        # temperature 1.2
    params = policy.params("When was 3.11 released?", overrides={"max_tokens": 64})
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from rag.config import SamplingSettings
from rag.errors import RequestError
from rag.types import GenerationParams

__all__ = ["SamplingPolicy", "classify_question", "QuestionKind"]

QuestionKind = Literal["factual", "creative", "open"]

_CREATIVE = re.compile(
    r"\b(write|compose|draft|imagine|invent|brainstorm|story|poem|haiku|limerick|song|slogan|tagline|"
    r"creative|fiction|pretend|role-?play|rewrite|rephrase|paraphrase|come up with|suggest (?:a |some )?names?)\b"
    r"|写一|写个|写首|写篇|创作|编一|编个|想象|故事|诗|口号|改写|头脑风暴|起个名|取个名",
    re.IGNORECASE)
_FACTUAL = re.compile(
    r"^\s*(who|what|when|where|which|whose|whom|how (?:many|much|long|old|often|do|does|did|can|to|is|are)|"
    r"is|are|was|were|does|do|did|can|define|list|name|give|show|find)\b"
    r"|\b(version|default|parameter|date|year|number|price|cost|definition|meaning|difference between)\b"
    r"|什么|谁|哪|何时|什么时候|多少|几|是否|吗|如何|怎么|怎样|定义|哪里|为什么",
    re.IGNORECASE)

_LIMITS = {"temperature", "top_p", "max_tokens", "repetition_penalty", "stop", "seed"}


def classify_question(question: str) -> QuestionKind:
    """``creative`` for writing/imagining requests, ``factual`` for look-ups, else ``open``."""
    if _CREATIVE.search(question):
        return "creative"
    if _FACTUAL.search(question):
        return "factual"
    return "open"


class SamplingPolicy:
    """Turns a question, its turn number and a request's overrides into ``GenerationParams``.

    Example::

        params = SamplingPolicy(SamplingSettings()).params("什么是 GIL？")   # temperature 0.3
    """

    def __init__(self, settings: SamplingSettings | None = None) -> None:
        self.settings = settings or SamplingSettings()

    def temperature(self, kind: QuestionKind, turn: int = 1) -> float:
        """The temperature of a question of ``kind`` at conversation turn ``turn`` (1-based)."""
        s = self.settings
        if kind == "factual":
            return s.factual_temperature
        start = s.creative_temperature if kind == "creative" else s.first_turn_temperature
        return round(max(s.temperature_floor, start - s.turn_decay * (max(1, turn) - 1)), 4)

    def params(self, question: str, turn: int = 1, overrides: Mapping[str, Any] | None = None,
               stop: tuple[str, ...] = ()) -> GenerationParams:
        s = self.settings
        values: dict[str, Any] = {
            "temperature": self.temperature(classify_question(question), turn),
            "top_p": s.top_p, "max_tokens": s.max_tokens, "repetition_penalty": s.repetition_penalty,
            "stop": stop, "seed": None,
        }
        for key, value in (overrides or {}).items():
            if value is None:
                continue
            if key not in _LIMITS:
                raise RequestError(key, f"unknown sampling parameter; use one of {', '.join(sorted(_LIMITS))}")
            values[key] = self._check(key, value)
        return GenerationParams(**values)

    def _check(self, key: str, value: Any) -> Any:
        s = self.settings
        try:
            if key == "temperature":
                value = float(value)
                if not 0 <= value <= s.max_temperature:
                    raise RequestError(key, f"must be between 0 and {s.max_temperature}, got {value}")
            elif key == "top_p":
                value = float(value)
                if not 0 < value <= 1:
                    raise RequestError(key, f"must be in (0, 1], got {value}")
            elif key == "max_tokens":
                if isinstance(value, bool) or int(value) != value:
                    raise RequestError(key, f"must be a whole number, got {value!r}")
                value = int(value)
                if not 1 <= value <= s.max_tokens_limit:
                    raise RequestError(key, f"must be between 1 and {s.max_tokens_limit}, got {value}")
            elif key == "repetition_penalty":
                value = float(value)
                if not 1 <= value <= 2:
                    raise RequestError(key, f"must be between 1 and 2, got {value}")
            elif key == "stop":
                value = (value,) if isinstance(value, str) else tuple(value)
                if len(value) > 4 or not all(isinstance(v, str) and 0 < len(v) <= 64 for v in value):
                    raise RequestError(key, "at most 4 stop strings of 1 to 64 characters")
            elif key == "seed":
                value = int(value)
        except (TypeError, ValueError) as exc:
            if isinstance(exc, RequestError):
                raise
            raise RequestError(key, f"not a valid value: {value!r}") from None
        return value
