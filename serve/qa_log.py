"""The question-and-answer log: one JSON line per answer, rotated by size, secrets redacted.

Each line holds the time, route, caller's key id, question, answer, cited sources, finish
reason, timings, token usage, the ``degraded`` flag, what injection screening did (the
question's verdict and rules, passages excluded or quoted), the answer's ``versions`` (profile,
model, quantization, prompt version, route, experiment arm) and its ``answer_id``. An answer that failed has
``error``; one whose client left before the end is logged as ``cancelled`` with the text so
far. Request headers are never logged.

Before a line is written every string in it is redacted: the values of the configured
secrets (every ``SecretStr`` in the settings), tokens whose SHA-256 is one of the
``serve.api_keys`` hashes, and anything shaped like a credential: ``Bearer``/``Basic``
tokens, ``sk-...`` keys, ``rqa_...`` keys, AWS access key ids, GitHub, Slack and Google
tokens, JWTs, private key blocks, ``user:password@`` in URLs, and ``api_key=...``,
``password: ...``, ``token=...`` and the like.

Settings: ``serve.qa_log`` (on by default; false writes nothing), ``serve.qa_log_path``
(default ``<data_dir>/logs/qa.jsonl``, ``qa-{pid}.jsonl`` with several workers: ``{pid}``
becomes the process id, since rotation is per process), ``serve.qa_log_max_bytes`` and
``serve.qa_log_backups`` (``qa.jsonl.1`` ... ``qa.jsonl.N``, oldest dropped), rotated by
:class:`logging.handlers.RotatingFileHandler`.

Example::

    qa_log = QALog.from_settings(settings)      # None when serve.qa_log is off
    qa_log.write({"question": "my key is sk-abc...", "answer": "..."})   # key redacted
    qa_log.close()
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import logging.handlers
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr

from rag.answer import AnswerEvent
from rag.config import Settings

__all__ = ["QALog", "Redactor", "entry"]

REDACTED = "[REDACTED]"
_CREDENTIALS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.DOTALL), REDACTED),
    (re.compile(r"(?i)\b(bearer|basic|token)(\s+)[A-Za-z0-9\-._~+/]{8,}=*"), rf"\1\2{REDACTED}"),
    (re.compile(r"\bsk-[A-Za-z0-9_\-]{16,}"), REDACTED),  # OpenAI, Anthropic (sk-ant-), ...
    (re.compile(r"\brqa_[A-Za-z0-9_\-]{20,}"), REDACTED),  # ragqa's own API keys
    (re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{40,})"), REDACTED),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}"), REDACTED),
    (re.compile(r"\bAIza[0-9A-Za-z_\-]{35}"), REDACTED),
    (re.compile(r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"), REDACTED),
    (re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^/\s:@]+:)[^/\s@]+@"), rf"\1{REDACTED}@"),
    # name=value and name: value, where the name says secret (OPENAI_API_KEY=..., "password": "...").
    (re.compile(r"(?i)(?<![a-z0-9])((?:[a-z0-9]+[_\-]){0,2}(?:api[_\-]?keys?|apikey|access[_\-]?keys?|"
                r"secret(?:[_\-]?access)?(?:[_\-]?keys?)?|client[_\-]?secret|"
                r"(?:access|auth|refresh|session|api|bearer|id|csrf)[_\-]?tokens?|token|passwords?|passwd|pwd|"
                r"credentials?))([\"']?\s*[:=]\s*[\"']?)(?!\[REDACTED\])[^\s\"'&,;]+"),
     rf"\1\2{REDACTED}"),
)
_TOKEN = re.compile(r"[A-Za-z0-9_\-.~+/=]{15,}[A-Za-z0-9_\-~+/=]")  # a key-like word, without a final "."
_MEMO_ENTRIES, _MEMO_MAX_CHARS = 2048, 8192  # at most 16 M characters remembered


class Redactor:
    """Replaces secrets in text with ``[REDACTED]`` (see the module docstring for what counts).

    Example::

        redact = Redactor(secrets=["hunter2-long-secret"])
        redact("Authorization: Bearer abc.def.ghi and hunter2-long-secret")
        # 'Authorization: Bearer [REDACTED] and [REDACTED]'
    """

    def __init__(self, secrets: Iterable[str] = (), key_hashes: Iterable[str] = ()) -> None:
        # Longest first, so a secret that contains another is replaced whole.
        self.secrets = sorted({s for s in secrets if len(s) >= 6}, key=len, reverse=True)
        self.key_hashes = frozenset(h.removeprefix("sha256:") for h in key_hashes)
        # The same strings recur line after line (field names; a cached answer's question, text
        # and sources on every hit), and the patterns cost ~0.5 ms over a short answer: once each.
        self._memo = functools.lru_cache(maxsize=_MEMO_ENTRIES)(self._redact)

    @classmethod
    def from_settings(cls, settings: Settings) -> Redactor:
        keys = getattr(settings.serve, "api_keys", None) or ()
        return cls(_secret_values(settings), [getattr(k, "hash", "") for k in keys])

    def __call__(self, text: str) -> str:
        return self._memo(text) if len(text) <= _MEMO_MAX_CHARS else self._redact(text)

    def _redact(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        for pattern, replacement in _CREDENTIALS:
            text = pattern.sub(replacement, text)
        if self.key_hashes:
            text = _TOKEN.sub(self._known_key, text)
        return text

    def _known_key(self, match: re.Match[str]) -> str:
        token = match.group(0)
        return REDACTED if hashlib.sha256(token.encode()).hexdigest() in self.key_hashes else token

    def scrub(self, value: Any) -> Any:
        """``value`` (JSON-like) with every string in it redacted, keys included."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, Mapping):
            return {self(str(k)): self.scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub(v) for v in value]
        return value


def _secret_values(model: BaseModel) -> Iterator[str]:
    for name in type(model).model_fields:
        yield from _secrets_in(getattr(model, name))


def _secrets_in(value: Any) -> Iterator[str]:
    if isinstance(value, SecretStr):
        yield value.get_secret_value()
    elif isinstance(value, BaseModel):
        yield from _secret_values(value)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _secrets_in(item)
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _secrets_in(item)


class QALog:
    """Writes redacted JSON lines to a size-rotated file.

    Example::

        log = QALog(Path("/var/log/ragqa/qa.jsonl"), max_bytes=10_000_000, backups=5)
        log.write(entry("chat", "What is X?", "X is ...", done_event))
    """

    def __init__(self, path: Path, max_bytes: int, backups: int, redactor: Redactor | None = None) -> None:
        self.path = Path(str(path).replace("{pid}", str(os.getpid())))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.redact = redactor or Redactor()
        self._handler = logging.handlers.RotatingFileHandler(
            self.path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8", delay=True)
        self._handler.setFormatter(logging.Formatter("%(message)s"))

    @classmethod
    def from_settings(cls, settings: Settings) -> QALog | None:
        serve = settings.serve
        if not serve.qa_log:
            return None
        default = "qa.jsonl" if serve.workers == 1 else "qa-{pid}.jsonl"  # rotation is per process
        path = serve.qa_log_path or Path(settings.data_dir) / "logs" / default
        if serve.workers > 1 and "{pid}" not in str(path):
            logging.getLogger("ragqa.serve").warning(
                "serve.qa_log_path %s has no {pid}: %d workers append to one file and each rotates it on its "
                "own, overwriting each other's backups", path, serve.workers)
        return cls(path, serve.qa_log_max_bytes, serve.qa_log_backups, Redactor.from_settings(settings))

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one record (redacted) as a JSON line; rotates first when it would not fit."""
        line = json.dumps(self.redact.scrub(dict(record)), ensure_ascii=False, default=str, separators=(",", ":"))
        self._handler.handle(logging.makeLogRecord({"msg": line, "levelno": logging.INFO, "levelname": "INFO"}))

    def close(self) -> None:
        self._handler.close()


def entry(route: str, question: str, answer: str, event: AnswerEvent | None, *,
          outcome: str = "ok", **extra: Any) -> dict[str, Any]:
    """The log record of one answer: ``event`` is its ``done`` or ``error`` event (``None``
    when it was cancelled first)."""
    record: dict[str, Any] = {"time": datetime.now(UTC).isoformat(timespec="milliseconds"), "route": route,
                              "outcome": outcome, **extra, "question": question, "answer": answer}
    if event is None:
        return record
    screening = event.screening
    record.update(
        finish_reason=event.finish_reason, degraded=event.degraded, cache=event.cache, timings=event.timings,
        usage=event.usage, versions=event.versions, answer_id=event.answer_id,
        citations=[{"label": c.label, "doc_id": c.doc_id, "chunk_id": c.chunk_id, "url": c.url}
                   for c in event.citations])
    if event.error:
        record["error"] = event.error
    if event.confidence:  # the generator's log-probabilities of the answer (llamacpp, openai)
        record["confidence"] = dict(event.confidence)
    if screening is not None:
        record["injection"] = {"question": screening.question.action, "rules": list(screening.question.rules),
                               "excluded": dict(screening.excluded), "quoted": dict(screening.quoted),
                               "history_dropped": screening.history_dropped}
    return record
