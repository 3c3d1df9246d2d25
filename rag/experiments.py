"""Online A/B experiments: traffic split between generator profiles, changed live, shared by
every worker and instance.

An experiment has a name and arms; each arm names a generator profile (``profiles.*`` in
the settings, ``default`` being the ``generator`` section) and a weight. The first arm is
the **control**. A request is assigned an arm by a stable hash of its unit (the API key id,
or the conversation id, by ``experiment.assign_by``) and the experiment's name, so a caller
stays in its arm for as long as the experiment runs, and moving weight from one arm to
another moves only the callers that must move.

**Rollback** is a write to the store every worker reads: ``ragqa experiment stop`` (or
``DELETE /v1/admin/experiment``) marks the experiment stopped, and from the next request on
every caller gets the control arm. The store is Redis when ``serve.redis_url`` is set (read
on every request: one GET on the serving loop's connection), else the file
``<data_dir>/experiment.json`` (written atomically; a worker stats it on every request and
reads it again only when it changed, or after ``experiment.refresh_s`` at the latest). A
stopped experiment stays recorded, so a restart does not bring back the experiment the
settings start with.

Example::

    exp = Experiment.create("small-vs-default", [Arm("control", "default", 90), Arm("small", "small", 10)])
    exp.assign("key:analytics-bot").name          # the same arm for this key every time
    store = experiment_store(settings)
    store.save(exp)                                 # every worker follows at its next request
    store.save(exp.stop())                          # and now everyone is on "control"
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from rag.config import Settings
from rag.errors import BackendUnavailable, ConfigError

__all__ = ["Arm", "Experiment", "ExperimentStore", "FileExperimentStore", "RedisExperimentStore",
           "experiment_store", "parse_arm", "unit_hash"]

log = logging.getLogger("ragqa.experiments")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_SCALE = float(2**64)


def unit_hash(experiment: str, unit: str) -> float:
    """Where ``unit`` falls in ``[0, 1)`` for ``experiment``: stable across processes and
    machines (BLAKE2b, not Python's salted ``hash``), and independent between experiments."""
    digest = hashlib.blake2b(f"{experiment}\0{unit}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE


@dataclass(frozen=True)
class Arm:
    """One arm: its name (recorded on every answer it makes), the generator profile it answers
    with, and its share of the traffic (weights are relative: 90 and 10 make 90%/10%)."""

    name: str
    profile: str
    weight: float


@dataclass(frozen=True)
class Experiment:
    """A named split of traffic between arms; the first arm is the control.

    ``stopped``: everyone gets the control arm (a rollback). ``updated`` and ``by`` say when
    and by whom it was last changed.
    """

    name: str
    arms: tuple[Arm, ...]
    stopped: bool = False
    updated: float = field(default=0.0, compare=False)
    by: str | None = field(default=None, compare=False)

    @classmethod
    def create(cls, name: str, arms: Iterable[Arm], *, by: str | None = None) -> Experiment:
        """A checked experiment: ``ConfigError`` names what is wrong."""
        arms = tuple(arms)
        if not NAME.match(name or ""):
            raise ConfigError(f"experiment name {name!r}: use letters, digits, '_', '.', '-' (at most 64)")
        if not arms:
            raise ConfigError(f"experiment {name!r} has no arms: give at least one (the control)")
        seen: set[str] = set()
        for arm in arms:
            if not NAME.match(arm.name):
                raise ConfigError(f"arm name {arm.name!r}: use letters, digits, '_', '.', '-' (at most 64)")
            if arm.name in seen:
                raise ConfigError(f"experiment {name!r} names the arm {arm.name!r} twice")
            seen.add(arm.name)
            if not arm.profile:
                raise ConfigError(f"arm {arm.name!r} names no profile")
            if not (arm.weight >= 0 and arm.weight < float("inf")):
                raise ConfigError(f"arm {arm.name!r}: weight {arm.weight!r} must be a number >= 0")
        if sum(a.weight for a in arms) <= 0:
            raise ConfigError(f"experiment {name!r}: the weights add up to 0; give some arm a weight above 0")
        return cls(name, arms, updated=time.time(), by=by)

    @property
    def control(self) -> Arm:
        return self.arms[0]

    def arm(self, name: str) -> Arm | None:
        return next((a for a in self.arms if a.name == name), None)

    def assign(self, unit: str | None) -> Arm:
        """The arm of ``unit`` (a key or conversation id); ``None``: a random arm by weight."""
        if self.stopped:
            return self.control
        total = sum(a.weight for a in self.arms)
        point = (random.random() if unit is None else unit_hash(self.name, unit)) * total
        for arm in self.arms:
            if point < arm.weight:
                return arm
            point -= arm.weight
        return next(a for a in reversed(self.arms) if a.weight > 0)  # rounding at the very top

    def stop(self, *, by: str | None = None) -> Experiment:
        return replace(self, stopped=True, updated=time.time(), by=by)

    def shares(self) -> dict[str, float]:
        """Each arm's share of the traffic now (the control's is 1 once stopped)."""
        if self.stopped:
            return {a.name: float(a is self.control) for a in self.arms}
        total = sum(a.weight for a in self.arms)
        return {a.name: a.weight / total for a in self.arms}

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["arms"] = [asdict(a) for a in self.arms]
        out["shares"] = self.shares()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Experiment:
        arms = tuple(Arm(str(a["name"]), str(a["profile"]), float(a["weight"])) for a in data["arms"])
        return cls(str(data["name"]), arms, bool(data.get("stopped", False)),
                   float(data.get("updated") or 0.0), data.get("by"))

    @classmethod
    def from_settings(cls, settings: Settings) -> Experiment | None:
        """The experiment the settings start with (``experiment.name`` and ``experiment.arms``)."""
        cfg = settings.experiment
        if not cfg.name:
            return None
        exp = cls.create(cfg.name, (Arm(a.name, a.profile, a.weight) for a in cfg.arms), by="settings")
        check_profiles(exp, settings)
        return replace(exp, updated=0.0)


def parse_arm(text: str) -> Arm:
    """``NAME=PROFILE:WEIGHT`` (``control=default:90``), as ``ragqa experiment set --arm`` takes it."""
    match = re.fullmatch(r"\s*([^=\s]+)\s*=\s*([^:\s]+)\s*:\s*([0-9]+(?:\.[0-9]*)?)\s*", text)
    if match is None:
        raise ConfigError(f"arm {text!r}: write NAME=PROFILE:WEIGHT, e.g. control=default:90")
    return Arm(match[1], match[2], float(match[3]))


def check_profiles(experiment: Experiment, settings: Settings) -> None:
    """Every arm names a profile the settings define (``default`` always exists)."""
    known = {"default", *settings.profiles}
    for arm in experiment.arms:
        if arm.profile not in known:
            raise ConfigError(f"arm {arm.name!r}: no generator profile {arm.profile!r}; "
                              f"known: {', '.join(sorted(known))}")


class ExperimentStore(Protocol):
    """Where the live experiment is kept: ``load``/``save`` for commands, ``current`` per request."""

    where: str

    def load(self) -> Experiment | None: ...

    def save(self, experiment: Experiment) -> None: ...

    async def current(self) -> Experiment | None: ...

    async def aclose(self) -> None: ...


def _decode(raw: bytes | str | None, where: str) -> Experiment | None:
    if not raw:
        return None
    try:
        return Experiment.from_dict(json.loads(raw))
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"the experiment stored in {where} is unreadable: {exc}") from exc


def _encode(experiment: Experiment) -> str:
    data = experiment.to_dict()
    data.pop("shares")
    return json.dumps(data, sort_keys=True)


class FileExperimentStore:
    """The experiment in a JSON file, replaced atomically; readers follow it by its stat."""

    def __init__(self, path: Path, initial: Experiment | None = None, refresh_s: float = 1.0) -> None:
        self.path, self.initial, self.refresh_s = Path(path), initial, refresh_s
        self.where = str(self.path)
        self._seen: tuple[int, int, int] | None = None
        self._read_at = 0.0
        self._value: Experiment | None = initial

    def load(self) -> Experiment | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return self.initial
        return _decode(raw, self.where) or self.initial

    def save(self, experiment: Experiment) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".experiment-", suffix=".json", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(_encode(experiment))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)  # readers see the old file or the new one, never half of one
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    async def current(self) -> Experiment | None:
        try:
            st = os.stat(self.path)
            seen: tuple[int, int, int] | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:  # absent, or a data dir this process may not read: load() says which
            seen = None
        now = time.monotonic()
        if seen != self._seen or now - self._read_at >= self.refresh_s:
            try:
                self._value = self.load()
            except ConfigError as exc:  # keep serving the last good one
                log.warning("%s", exc)
            except OSError as exc:
                log.warning("cannot read the experiment file %s (%s); keeping the last one read", self.path, exc)
            self._seen, self._read_at = seen, now
        return self._value

    async def aclose(self) -> None:
        return None


class RedisExperimentStore:
    """The experiment under one Redis key, read on every request. With Redis unreachable the
    last experiment read goes on (the settings' one before any), and Redis is tried again
    after ``retry_s``."""

    def __init__(self, url: str, key: str = "ragqa:experiment", initial: Experiment | None = None,
                 retry_s: float = 5.0, timeout_s: float = 0.5) -> None:
        from rag.redis_loop import LoopClients

        self.url, self.key, self.initial, self.retry_s, self.timeout_s = url, key, initial, retry_s, timeout_s
        self.where = f"Redis key {key}"
        self._clients = LoopClients(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._value: Experiment | None = initial
        self._down_until = 0.0

    def _sync(self) -> Any:
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=5, socket_connect_timeout=5)

    def load(self) -> Experiment | None:
        import redis

        try:
            with self._sync() as client:
                raw = client.get(self.key)
        except redis.RedisError as exc:
            raise BackendUnavailable(f"cannot read the experiment from Redis ({self.url}): {exc}") from exc
        return _decode(raw, self.where) or self.initial

    def save(self, experiment: Experiment) -> None:
        import redis

        try:
            with self._sync() as client:
                client.set(self.key, _encode(experiment))
        except redis.RedisError as exc:
            raise BackendUnavailable(f"cannot write the experiment to Redis ({self.url}): {exc}") from exc

    async def current(self) -> Experiment | None:
        if time.monotonic() < self._down_until:
            return self._value
        import redis

        try:
            raw = await self._clients.client().get(self.key)
            self._value = _decode(raw, self.where) or self.initial
        except redis.RedisError as exc:
            self._down_until = time.monotonic() + self.retry_s
            log.warning("cannot read the experiment from Redis (%s), keeping the last one for %g s: %s",
                        self.url, self.retry_s, exc)
        except ConfigError as exc:
            log.warning("%s", exc)
        return self._value

    async def aclose(self) -> None:
        await self._clients.aclose()


def experiment_store(settings: Settings) -> ExperimentStore:
    """Redis (``serve.redis_url``) when set, else ``<data_dir>/experiment.json``; either starts
    from the settings' experiment until one is saved."""
    initial = Experiment.from_settings(settings)
    cfg = settings.experiment
    if settings.serve.redis_url:
        return RedisExperimentStore(settings.serve.redis_url, f"{cfg.redis_prefix}:experiment", initial)
    return FileExperimentStore(settings.data_dir / "experiment.json", initial, cfg.refresh_s)
