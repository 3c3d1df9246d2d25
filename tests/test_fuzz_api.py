"""schemathesis against a real server: generated requests to every route of the OpenAPI
schema (``tests/fuzz.py``), served by uvicorn on loopback with auth on and an admin key,
never get a 5xx, and every answer matches the schema (status, content type, headers, body).

About 300 cases on two cores (``CASES_PER_ROUTE`` on each of the operations, half of them
outside the schema); ``bench/fuzz_api.py`` runs 1,000 or more. Reindexing is excluded
(``tests.fuzz.EXCLUDED``).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from tests.fixtures.keys import bearer, keyed_server

CASES_PER_ROUTE = 40


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    yield from keyed_server(tmp_path_factory.mktemp("fuzz"))


def test_generated_requests_get_no_5xx_and_answers_match_the_schema(server):
    from tests.fuzz import fuzz

    report = fuzz(server.url, bearer("admin"), CASES_PER_ROUTE)
    print(report.summary())
    assert report.cases >= 250
    assert not [code for code in report.statuses if code >= 500], report.summary()
    assert not report.failures, report.summary()
