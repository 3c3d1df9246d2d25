"""Online experiments in the service: which arm answers a request, what each answer leaves
behind, and the admin routes that change the split live.

- ``GET /v1/admin/experiment``: the experiment now (``null`` when none), and where it is kept.
- ``PUT /v1/admin/experiment``: start or change one (``{"name": ..., "arms": [{"name",
  "profile", "weight"}, ...]}``; the first arm is the control). Every worker and instance
  follows at its next request (:mod:`rag.experiments`).
- ``DELETE /v1/admin/experiment``: stop it, which is the rollback: every request from the next
  one on gets the control arm.
- ``GET /v1/admin/experiment/report``: per-arm figures and feedback from the answer records.

The answer routes call :meth:`Experiments.assign` before answering and wrap the answer in
:meth:`Experiments.recorded`. An admin may pin an arm for one request with the header
``X-Ragqa-Arm: <arm>`` (a query-scope key sending it gets a 403).

Example::

    assignment = await experiments.assign(request, caller, conversation_id)
    events = state.answerer.stream(question, profile=assignment.profile, arm=assignment.arm)
    async for event in experiments.recorded("ask", events, assignment): ...
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, Field

from rag.answer import AnswerEvent
from rag.config import Settings
from rag.errors import ConfigError, RequestError
from rag.experiments import Arm, Experiment, check_profiles, experiment_store
from rag.feedback import answer_records, summarise
from serve.deps import AdminCaller, Caller
from serve.errors import Forbidden, NotFound
from serve.experiment_metrics import answer_record, observe_record
from serve.schemas import ERRORS

__all__ = ["router", "Experiments", "Assignment", "PIN_HEADER", "chat_conversation"]

log = logging.getLogger("ragqa.serve")

PIN_HEADER = "X-Ragqa-Arm"
_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"

router = APIRouter(tags=["experiments"])


@dataclass(frozen=True)
class Assignment:
    """The arm a request answers with; all ``None`` outside an experiment."""

    experiment: str | None = None
    arm: str | None = None
    profile: str | None = None
    pinned: bool = False
    caller: str | None = None  # the API key id: only it (or an admin) may rate the answer


class Experiments:
    """The service's experiment store and answer records, built from the settings."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.store = experiment_store(settings)
        self.records = answer_records(settings)
        self.profiles = {"default", *settings.profiles}
        self._warned: set[str] = set()

    async def aclose(self) -> None:
        await self.store.aclose()
        self.records.close()

    async def assign(self, request: Request, caller: Caller, conversation: str | None) -> Assignment:
        """The request's arm: the pinned one (admin only), else by the caller's hash."""
        pin = request.headers.get(PIN_HEADER)
        if pin is not None and "admin" not in caller.scopes:
            raise Forbidden(f"pinning an experiment arm ({PIN_HEADER}) needs an admin key; key "
                            f"{caller.key_id!r} has the query scope only", "arm_pin_forbidden")
        exp = await self.store.current()
        if pin is not None:
            if exp is None:
                raise RequestError(PIN_HEADER, "no experiment is set, so there is no arm to pin")
            arm = exp.arm(pin.strip())
            if arm is None:
                raise RequestError(PIN_HEADER, f"experiment {exp.name!r} has no arm {pin!r}; its arms: "
                                   f"{', '.join(a.name for a in exp.arms)}")
            return Assignment(exp.name, arm.name, arm.profile, True, caller.key_id)
        if exp is None:
            return Assignment(caller=caller.key_id)
        if self.settings.experiment.assign_by == "key" and caller.key_id:
            unit: str | None = f"key:{caller.key_id}"
        else:
            unit = f"conversation:{conversation}" if conversation else None
        arm = exp.assign(unit)
        if arm.profile not in self.profiles:  # set by an instance with other profiles: this one answers as control
            if arm.profile not in self._warned:
                self._warned.add(arm.profile)
                log.warning("experiment %s: arm %s names the profile %s, which this server does not have; "
                            "its requests get the control arm here", exp.name, arm.name, arm.profile)
            arm = exp.control
            if arm.profile not in self.profiles:
                return Assignment(caller=caller.key_id)
        return Assignment(exp.name, arm.name, arm.profile, caller=caller.key_id)

    async def recorded(self, route: str, events: AsyncIterator[AnswerEvent],
                       assignment: Assignment) -> AsyncIterator[AnswerEvent]:
        """Pass the answer's events through; when it is done, count it in its arm's metrics and
        record it under its answer id for feedback. A record that cannot be written is logged,
        never the answer's failure."""
        parts: list[str] = []
        try:
            async for event in events:
                if event.kind == "delta":
                    parts.append(event.text)
                elif event.kind == "done":
                    answer_id = answer_id_of(event)
                    record = answer_record(route, event, "".join(parts), asdict(assignment), answer_id)
                    observe_record(record)
                    try:
                        await asyncio.to_thread(self.records.put, record)
                    except Exception as exc:  # noqa: BLE001 - feedback on this answer will be a 404, no more
                        log.warning("cannot record answer %s in %s: %s", answer_id, self.records.where, exc)
                yield event
        finally:
            await events.aclose()  # type: ignore[attr-defined]


def answer_id_of(event: AnswerEvent) -> str:
    """The id the response shows for this answer (the answerer gives every answer one)."""
    return event.answer_id or f"ans-{uuid.uuid4().hex}"


def chat_conversation(question: str, history: Sequence[Mapping[str, str]]) -> str:
    """What identifies a stateless chat's conversation: its first user message, hashed (every
    later request of the conversation repeats it)."""
    first = next((m["content"] for m in history if m.get("role") == "user"), question)
    return hashlib.sha256(first.encode("utf-8")).hexdigest()[:32]


async def _experiments(request: Request) -> Experiments:
    return request.app.state.experiments


Ab = Annotated[Experiments, Depends(_experiments)]


class ArmIn(BaseModel):
    model_config = {"extra": "forbid"}

    name: str = Field(pattern=_NAME, description="Recorded on every answer the arm makes (versions.arm).")
    profile: str = Field(min_length=1, description="The generator profile it answers with (default, or a key "
                         "of the profiles settings).")
    weight: float = Field(ge=0, description="Its relative share of the traffic.")


class ExperimentIn(BaseModel):
    model_config = {"extra": "forbid"}

    name: str = Field(pattern=_NAME)
    arms: list[ArmIn] = Field(min_length=1, description="The first arm is the control.")


class ArmOut(BaseModel):
    name: str
    profile: str
    weight: float


class ExperimentOut(BaseModel):
    name: str
    arms: list[ArmOut]
    stopped: bool = Field(description="Stopped: every request gets the control arm (the first).")
    shares: dict[str, float] = Field(description="Each arm's share of the traffic now.")
    updated: float = Field(description="Unix time of the last change (0: from the settings).")
    by: str | None = Field(description="Who made the last change: an API key id, cli, or settings.")


class ExperimentState(BaseModel):
    experiment: ExperimentOut | None
    store: str = Field(description="Where every worker reads it: a Redis key, or a file in the data directory.")


class ReportRow(BaseModel):
    experiment: str | None
    arm: str | None
    profiles: list[str]
    answers: int
    cached: int
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    ttft_p50_ms: float | None
    tokens_per_s: float | None
    abstention: float | None
    citation_compliance: float | None
    feedback_up: int
    feedback_down: int
    feedback_up_share: float | None


def _state(ab: Experiments, exp: Experiment | None) -> ExperimentState:
    return ExperimentState(experiment=None if exp is None else ExperimentOut(**exp.to_dict()), store=ab.store.where)


@router.get("/v1/admin/experiment", response_model=ExperimentState, responses=ERRORS,
            summary="The running experiment (admin)")
async def get_experiment(ab: Ab, caller: AdminCaller) -> ExperimentState:
    return _state(ab, await asyncio.to_thread(ab.store.load))


@router.put("/v1/admin/experiment", response_model=ExperimentState, responses=ERRORS,
            summary="Start or change the experiment; every worker follows at its next request (admin)")
async def put_experiment(body: ExperimentIn, ab: Ab, caller: AdminCaller) -> ExperimentState:
    try:
        exp = Experiment.create(body.name, (Arm(a.name, a.profile, a.weight) for a in body.arms),
                                by=caller.key_id or "anonymous")
        check_profiles(exp, ab.settings)
    except ConfigError as exc:
        raise RequestError("arms", str(exc)) from None
    await asyncio.to_thread(ab.store.save, exp)
    log.info("experiment %s set by %s: %s", exp.name, exp.by, exp.shares())
    return _state(ab, exp)


@router.delete("/v1/admin/experiment", response_model=ExperimentState,
               responses={**ERRORS, 404: {"description": "No experiment is set."}},
               summary="Stop the experiment: every request gets the control arm from the next one on (admin)")
async def stop_experiment(ab: Ab, caller: AdminCaller) -> ExperimentState:
    exp = await asyncio.to_thread(ab.store.load)
    if exp is None:
        raise NotFound("experiment", "no experiment is set")
    stopped = exp.stop(by=caller.key_id or "anonymous")
    await asyncio.to_thread(ab.store.save, stopped)
    log.info("experiment %s stopped by %s: everyone on %s", exp.name, stopped.by, exp.control.name)
    return _state(ab, stopped)


@router.get("/v1/admin/experiment/report", response_model=list[ReportRow], responses=ERRORS,
            summary="Per-arm figures and feedback from the recorded answers (admin)")
async def experiment_report(ab: Ab, caller: AdminCaller,
                            experiment: Annotated[str | None, Query(description="Only this experiment.")] = None,
                            ) -> list[dict[str, Any]]:
    def run() -> list[dict[str, Any]]:
        return summarise(ab.records.answers(), ab.records.feedback(), experiment)

    return await asyncio.to_thread(run)
