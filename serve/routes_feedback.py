"""``POST /v1/feedback``: a thumbs up or down on an answer, with an optional comment.

The answer is named by the id its response carried (``answer_id`` in ``/v1/ask``'s response,
``ragqa.answer_id`` in a chat completion). The feedback is stored with that answer's versions
and experiment arm (:mod:`rag.feedback`), counted in ``experiment_feedback_total``, and read by
``ragqa experiment report``. An id that was never recorded, whose record has expired
(``experiment.records_ttl_s``), or that another API key's request got (only that key or an
admin key may rate it) is a 404.

Example::

    curl -s localhost:8000/v1/feedback -H 'Content-Type: application/json' \\
         -d '{"answer_id": "ans-3f...", "rating": "down", "comment": "cites the wrong release"}'
"""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import APIRouter
from pydantic import BaseModel, Field

from rag.feedback import feedback_record
from serve.deps import QueryCaller
from serve.errors import NotFound
from serve.experiment_metrics import observe_feedback
from serve.routes_experiments import Ab
from serve.schemas import ERRORS, ErrorResponse

__all__ = ["router"]

router = APIRouter(tags=["feedback"])

MAX_COMMENT = 2000


class FeedbackIn(BaseModel):
    model_config = {"extra": "forbid"}

    answer_id: str = Field(min_length=1, max_length=128, description="The id the answer's response carried.")
    rating: Literal["up", "down"]
    comment: str | None = Field(default=None, max_length=MAX_COMMENT, description="Optional, in words.")


class FeedbackOut(BaseModel):
    answer_id: str
    rating: Literal["up", "down"]
    experiment: str | None = Field(description="The experiment the answer was part of, if any.")
    arm: str | None = Field(description="Its arm.")
    versions: dict | None = Field(description="The answer's versions: profile, model, prompt version, route, arm.")


@router.post("/v1/feedback", response_model=FeedbackOut,
             responses={**ERRORS, 404: {"model": ErrorResponse, "description": "No recorded answer has this id."}},
             summary="Rate an answer up or down, with an optional comment")
async def feedback(body: FeedbackIn, ab: Ab, caller: QueryCaller) -> FeedbackOut:
    answer = await asyncio.to_thread(ab.records.get, body.answer_id)
    if answer is not None and answer.get("caller") not in (None, caller.key_id) and "admin" not in caller.scopes:
        answer = None  # another key's answer: as unknown as one never made
    if answer is None:
        raise NotFound("answer_id", f"no answer {body.answer_id!r} is recorded (answers are kept "
                       f"{ab.settings.experiment.records_ttl_s / 86400:g} days)")
    record = feedback_record(answer, body.rating, body.comment or None, caller.key_id)
    await asyncio.to_thread(ab.records.add_feedback, record)
    observe_feedback(record)
    return FeedbackOut(answer_id=body.answer_id, rating=body.rating, experiment=record["experiment"],
                       arm=record["arm"], versions=record["versions"])
