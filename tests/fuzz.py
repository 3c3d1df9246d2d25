"""Drive schemathesis over a running server: generated cases for every operation of its
OpenAPI schema, half fitting the schema and half not, each call checked for 5xx and for
conformance (status, content type, headers, body). Used by ``tests/test_fuzz_api.py`` and
``bench/fuzz_api.py``.

Example::

    report = fuzz("http://127.0.0.1:8000", {"Authorization": "Bearer ..."}, cases_per_route=50)
    assert not report.failures, report.summary()
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

# Reindexing rereads a source (seconds a call) and has its own tests.
EXCLUDED = r"/v1/sources/\{name\}/reindex"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]


@dataclass
class Report:
    cases: int = 0
    statuses: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    operations: int = 0
    streams: int = 0  # SSE answers, whose event bodies are not checked against the schema

    def summary(self) -> str:
        codes = ", ".join(f"{code}: {n}" for code, n in sorted(self.statuses.items()))
        lines = [f"{self.cases} cases over {self.operations} operations in {self.seconds:.1f} s "
                 f"({self.streams} SSE streams)",
                 f"statuses: {codes}", f"failures: {len(self.failures)}"]
        return "\n".join(lines + self.failures[:20])


def fuzz(url: str, headers: dict[str, str], cases_per_route: int, *, derandomize: bool = True,
         exclude: str | None = EXCLUDED) -> Report:
    """Run up to ``cases_per_route`` cases on each operation (half of them negative); the same
    cases each run unless ``derandomize`` is off. Paths matching ``exclude`` are left out."""
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", timeout=30)
    if exclude:
        schema = schema.exclude(path_regex=exclude)
    report = Report()
    started = time.monotonic()
    for result in schema.get_all_operations():
        operation = result.ok()
        report.operations += 1
        negatable = any(True for _ in operation.iter_parameters()) or len(operation.body) > 0
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if negatable else (GenerationMode.POSITIVE,):
            _run(operation, mode, url, headers, max(1, cases_per_route // 2), derandomize, report)
    report.seconds = time.monotonic() - started
    return report


def _run(operation, mode, url, headers, examples, derandomize, report) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    def one(case) -> None:
        report.cases += 1
        response = case.call(base_url=url, headers=headers, timeout=30)
        report.statuses[response.status_code] += 1
        checks = CHECKS
        if any(value.startswith("text/event-stream") for value in response.headers.get("content-type", [])):
            # The routes document an SSE event's schema as the stream's (a string, a chunk), not
            # as OpenAPI 3.2's event object that schemathesis reads it as: status, content type
            # and headers are checked, the events' bodies are not.
            report.streams += 1
            checks = [check for check in CHECKS if check is not response_schema_conformance]
        try:
            case.validate_response(response, checks=checks, headers=headers)
        except FailureGroup as group:  # collected, so that one run finds them all
            for failure in group.exceptions:
                report.failures.append(f"{operation.label} [{mode.value}] {response.status_code}: {failure.title}: "
                                       f"{' '.join(str(failure.message).split())[:300]} -- {response.text[:200]}")

    try:
        one()
    except Unsatisfiable:  # nothing to negate: an operation without parameters or body
        pass
