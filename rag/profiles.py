"""Generator profiles: named generators, started on first use, with their model ids and fallbacks.

A deployment has the profile ``default`` (the ``generator`` section) and any named in
``profiles`` (``RAG_PROFILES__SMALL__BACKEND=extractive``). Nothing is built or started until a
request needs it: :meth:`Profiles.start` starts a profile's generator once and remembers it,
so ``/ready`` checks only what has been started. When a profile's backend is down, the answer
goes to the next profile of :meth:`Profiles.chain` (the profile asked for, then the others in
the order ``default``, then ``profiles`` as written), and to the extractive answerer after the
last (:mod:`rag.answer` flags it degraded and says which).

Example::

    profiles = Profiles(services)
    generator = await profiles.start("small")       # builds and starts it, or raises its error
    profiles.describe("small")                      # {"model": "...", "quantization": ...}
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rag.config import ContextLimits, GeneratorSettings, Settings
from rag.errors import RequestError
from rag.types import Generator

if TYPE_CHECKING:
    from rag.services import Services

__all__ = ["DEFAULT", "Profiles", "model_id", "quantization_of"]

DEFAULT = "default"
_GGUF_QUANT = re.compile(r"[-_.](q\d(?:_[a-z0-9]+)*|f16|bf16|f32|iq\d\w*)$", re.IGNORECASE)


def model_id(cfg: GeneratorSettings) -> str:
    """The model a profile answers with, as it would name itself: a packaged GGUF's name, a
    ``.gguf`` file's stem, a served model's name, or the backend for the extractive answerer."""
    if cfg.backend == "extractive":
        return "extractive"
    if cfg.backend == "llamacpp":
        from rag.generators.gguf_models import DEFAULT_MODEL

        model = cfg.model or DEFAULT_MODEL
        return Path(model).stem if model.endswith(".gguf") else model
    return cfg.model or cfg.backend


def quantization_of(cfg: GeneratorSettings) -> str | None:
    """The profile's quantization: ``generator.quantization`` (vLLM's), else a GGUF's file type
    as its file name says (``q4_k_m`` for the packaged models), else ``None``."""
    if cfg.quantization:
        return cfg.quantization
    if cfg.backend != "llamacpp":
        return None
    from rag.generators.gguf_models import DEFAULT_MODEL, PACKAGED_MODELS

    model = cfg.model or DEFAULT_MODEL
    packaged = PACKAGED_MODELS.get(model)
    name = Path(packaged.filename if packaged else model).stem
    found = _GGUF_QUANT.search(name)
    return found.group(1).lower() if found else None


class Profiles:
    """The deployment's generator profiles: their settings, generators and start state.

    ``generators`` gives ready-made generators by profile name (tests: a
    :class:`~rag.generators.scripted.ScriptedGenerator` per profile); the others are built
    from their settings by :meth:`rag.services.Services.profile_generator` on first use.
    """

    def __init__(self, services: Services, generators: Mapping[str, Generator] | None = None) -> None:
        self.services = services
        self.settings: Settings = services.settings
        self._given = dict(generators or {})
        self._started: dict[str, Generator] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.down: dict[str, str] = {}  # profiles whose last start (or first token) failed, and why

    @property
    def names(self) -> list[str]:
        """Every profile, ``default`` first, then ``profiles`` as written (and any given only as a generator)."""
        return list(dict.fromkeys([DEFAULT, *self.settings.profiles, *self._given]))

    def check(self, name: str) -> str:
        """``name`` if it is a profile, else a :class:`~rag.errors.RequestError` naming the known ones."""
        if name not in self.names:
            raise RequestError("profile", f"no generator profile named {name!r} (known: {', '.join(self.names)})")
        return name

    def config(self, name: str) -> GeneratorSettings | None:
        """The profile's generator settings (``None`` for a profile given only as a generator)."""
        if name == DEFAULT:
            return self.settings.generator
        return self.settings.profiles.get(name)

    def generator(self, name: str) -> Generator:
        """The profile's generator, built on first use, not started."""
        if name in self._given:
            return self._given[name]
        return self.services.profile_generator(name)

    async def start(self, name: str) -> Generator:
        """The profile's generator, started (once; a failed start is tried again next time)."""
        if name in self._started:
            return self._started[name]
        async with self._locks.setdefault(name, asyncio.Lock()):
            if name not in self._started:
                generator = self.generator(name)
                try:
                    await generator.start()
                except Exception as exc:
                    self.mark_down(name, exc)
                    raise
                self._started[name] = generator
                self.down.pop(name, None)
        return self._started[name]

    def mark_down(self, name: str, error: BaseException) -> None:
        """Remember that the profile failed (``/ready`` reports it until it starts again)."""
        self.down[name] = " ".join(str(error).split())[:300]

    def health(self) -> dict[str, tuple[str, str | None]]:
        """``{name: ("ready" | "down", detail)}`` of every profile started or tried, for ``/ready``."""
        out: dict[str, tuple[str, str | None]] = {n: ("ready", None) for n in self._started if n not in self.down}
        out.update({n: ("down", why) for n, why in self.down.items()})
        return out

    @property
    def started(self) -> dict[str, Generator]:
        """The profiles whose generator has been started, by name."""
        return dict(self._started)

    def fallback_allowed(self, name: str) -> bool:
        cfg = self.config(name)
        return (cfg or self.settings.generator).fallback

    def chain(self, name: str) -> list[str]:
        """The profiles to try for ``name``, in order: itself, then (when its ``fallback`` is on)
        the others in :attr:`names` order."""
        if not self.fallback_allowed(name):
            return [name]
        return [name, *(n for n in self.names if n != name)]

    def context_limits(self, name: str) -> ContextLimits:
        """The packed context's limits for the profile (its backend's defaults unless ``retrieval`` sets them)."""
        return self.settings.context_limits_for(self.config(name) or self.settings.generator)

    def describe(self, name: str, generator: Generator | None = None) -> dict[str, str | None]:
        """``{"model", "quantization"}`` of the profile (or of ``generator`` answering for it)."""
        cfg = self.config(name)
        if name in self._given or cfg is None:
            gen = generator or self._given.get(name)
            return {"model": getattr(gen, "name", name), "quantization": None}
        return {"model": model_id(cfg), "quantization": quantization_of(cfg)}

    async def close(self) -> None:
        for name, generator in list(self._started.items()):
            self._started.pop(name, None)
            await generator.close()
