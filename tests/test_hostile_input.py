"""Hostile input through a real server with auth on: malformed, huge and smuggling requests
get a 4xx in OpenAI's error shape that names the problem (or a 200 when the input is in fact
fine), never a 5xx, and no other tenant's document ever appears.

The server holds two tenants' notes, ``acme`` (``acme:d00.md``-``d09``) and ``globex``
(``d10``-``d19``), and the keys of ``tests/fixtures/keys.py``.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from types import SimpleNamespace
from urllib.parse import urlsplit

import httpx
import pytest

from tests.corpus import question
from tests.fixtures.keys import bearer, keyed_server

ACME = question(1)      # a question whose answer cites acme:d01.md
GLOBEX = question(11)   # and one whose answer cites globex:d11.md


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    yield from keyed_server(tmp_path_factory.mktemp("hostile"))


def post(http: httpx.Client, url: str, key: str, body: object, path: str = "/v1/ask") -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http.post(f"{url}{path}", headers={**bearer(key), "Content-Type": "application/json"}, content=content)


def refused(r: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> str:
    """Check the status and the error's shape; return its message."""
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    if code is not None:
        assert error["code"] == code, error
    if param is not None:  # a union's member may follow: filters.source.str
        assert error["param"] == param or error["param"].startswith(f"{param}."), error
    return error["message"]


def cited(r: httpx.Response) -> set[str]:
    assert r.status_code == 200, r.text
    return {c["doc_id"] for c in r.json()["citations"]}


# -- malformed bodies -----------------------------------------------------------------------
def test_json_nested_too_deeply_to_parse_is_a_400_naming_it(server, http):
    body = b'{"question": "q", "filters": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert "nested too deeply" in refused(post(http, server.url, "admin", body), 400, "json_too_deep")


def test_nesting_the_parser_can_read_is_a_422_on_the_field(server, http):
    nested: object = "x"
    for _ in range(500):
        nested = [nested]
    refused(post(http, server.url, "admin", {"question": ACME, "filters": {"source": nested}}), 422,
            param="filters.source")
    refused(post(http, server.url, "admin", {"messages": [{"role": "user", "content": nested}]},
                 "/v1/chat/completions"), 422)


def test_a_body_that_is_not_utf8_is_a_400_naming_the_byte(server, http):
    for path in ("/v1/ask", "/v1/chat/completions", "/v1/cache/purge"):
        message = refused(post(http, server.url, "admin", b'{"question": "caf\xe9 \xff\xfe"}', path), 400,
                          "invalid_encoding")
        assert "not valid UTF-8" in message and "byte 17" in message  # the \xe9


def test_a_body_that_is_not_json_is_a_422(server, http):
    assert "not valid JSON" in refused(post(http, server.url, "admin", b'{"question": '), 422, "json_invalid")


def test_huge_numbers_are_422s_on_their_field(server, http):
    for field, value in (("top_k", 10**400), ("top_k", 1e308)):
        refused(post(http, server.url, "admin", {"question": ACME, field: value}), 422, param=field)
    for value in (1e308, -1e308, 10**30, "1e999"):
        r = post(http, server.url, "admin", {"question": ACME, "filters": {"modified_from": value}})
        refused(r, 422, param="filters.modified_from")
    # Python's json reads Infinity and NaN; they are not dates either
    for raw in (b"Infinity", b"NaN", b"1e999"):
        body = b'{"question": "q", "filters": {"published_to": ' + raw + b"}}"
        refused(post(http, server.url, "admin", body), 422, param="filters.published_to")
    # an offset that pushes a date past year 9999 in UTC
    r = post(http, server.url, "admin", {"question": ACME, "filters": {"modified_to": "9999-12-31T23:59:59-05:00"}})
    refused(r, 422, "invalid_filter", "filters.modified_to")


def test_nul_bytes_in_the_question_are_answered(server, http):
    assert "acme:d01.md" in cited(post(http, server.url, "acme", {"question": ACME.replace(" ", "\x00 ")}))
    r = post(http, server.url, "acme", {"messages": [{"role": "user", "content": "\x00" * 50 + ACME}]},
             "/v1/chat/completions")
    assert r.status_code == 200, r.text
    r = post(http, server.url, "acme", {"question": "\x00\x00"})
    assert r.status_code == 200 and cited(r) <= {f"acme:d{i:02d}.md" for i in range(10)}, r.text


def test_a_10_mb_question_is_a_413(server, http):
    r = post(http, server.url, "acme", {"question": "why " * 2_500_000})
    assert "too large" in refused(r, 413, "too_large")


def test_a_question_over_the_length_limit_is_a_422(server, http):
    assert "characters long" in refused(post(http, server.url, "acme", {"question": "why " * 2000}), 422,
                                        param="question")


def test_10000_messages_are_a_422_naming_the_limit(server, http):
    messages = [{"role": "user", "content": "hi"}] * 10_000
    message = refused(post(http, server.url, "acme", {"messages": messages}, "/v1/chat/completions"), 422,
                      param="messages")
    assert "serve.max_messages" in message


# -- smuggled queries -----------------------------------------------------------------------
@pytest.mark.parametrize("source", ['x") or (1==1', "x' OR '1'='1", 'acme" || source != "', "*", "acme*",
                                    '{"match_all": {}}', "source:*", "globex OR acme"])
def test_a_filter_value_is_a_value_not_a_query(server, http, source):
    # an admin sees both tenants: a smuggled expression would widen the search; it matches nothing
    assert cited(post(http, server.url, "admin", {"question": ACME, "filters": {"source": [source]}})) == set()


@pytest.mark.parametrize("filters", [{"source": {"bool": {"must": [{"match_all": {}}]}}},
                                     {"source": [{"match_all": {}}]}, {"tenant": ["acme", "globex"]},
                                     {"tenant": {"term": {"tenant": "globex"}}}, {"query": {"match_all": {}}},
                                     {"expr": "tenant != ''"}, {"tags": [1, 2]}, {"min_trust": {"gte": 0}}])
def test_a_filter_that_is_an_object_or_an_unknown_field_is_a_422(server, http, filters):
    refused(post(http, server.url, "admin", {"question": ACME, "filters": filters}), 422)


def test_a_query_in_the_question_is_only_text(server, http):
    for text in ('{"query": {"match_all": {}}}', 'tenant != "" or 1==1', "*:*", "source:globex OR tenant:globex"):
        assert cited(post(http, server.url, "acme", {"question": text})) <= {f"acme:d{i:02d}.md" for i in range(10)}


# -- documents by id ------------------------------------------------------------------------
def raw_get(url: str, path: str, key: str) -> tuple[int, dict]:
    """GET with the path sent as is (httpx would resolve the ``..`` segments first)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    try:
        conn.request("GET", path, headers=bearer(key))
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


@pytest.mark.parametrize("path", ["/v1/documents/../../etc/passwd", "/v1/documents/..%2F..%2Fetc%2Fpasswd",
                                  "/v1/documents/acme:../../../etc/passwd", "/v1/documents/%2e%2e/%2e%2e/etc/passwd",
                                  "/v1/documents/acme:d01.md/../../globex:d11.md", "/v1/documents/acme:d01.md%00.txt",
                                  "/v1/documents//etc/passwd"])
def test_path_traversal_in_a_document_id_finds_nothing(server, path):
    status, body = raw_get(server.url, path, "admin")
    assert status == 404, body
    assert set(body["error"]) == {"message", "type", "param", "code"} and "root:" not in json.dumps(body)


def test_a_tenant_key_cannot_read_documents_by_id(server, http):
    r = http.get(f"{server.url}/v1/documents/globex:d11.md", headers=bearer("acme"))
    refused(r, 403)
    assert "Note zor" not in r.text  # nothing of the document comes back


# -- tenants --------------------------------------------------------------------------------
@pytest.mark.parametrize("filters", [{"source": "globex"}, {"source": ["acme", "globex"]},
                                     {"source": ["globex"], "tenant": "acme"}, {"tags": ["globex"]},
                                     {"source": 'acme") or (tenant == "globex'}, {"tenant": "acme "},
                                     {"lang": ["en", "zh"]}, {}])
def test_a_tenant_key_never_sees_another_tenants_documents(server, http, filters):
    for text in (GLOBEX, ACME):
        ids = cited(post(http, server.url, "acme", {"question": text, "filters": filters}))
        assert all(doc.startswith("acme:") for doc in ids), (filters, ids)


@pytest.mark.parametrize("tenant", ["globex", "GLOBEX", " globex", "acme\x00globex", "*", "acme,globex"])
def test_a_tenant_key_naming_another_tenant_is_a_403(server, http, tenant):
    r = post(http, server.url, "acme", {"question": GLOBEX, "filters": {"tenant": tenant}})
    assert r.status_code in (403, 422), r.text
    refused(r, r.status_code)
    body = {"messages": [{"role": "user", "content": GLOBEX}], "rag": {"filters": {"tenant": tenant}}}
    r = post(http, server.url, "acme", body, "/v1/chat/completions")
    assert r.status_code in (403, 422) and "globex:" not in r.text, r.text


def test_a_tenant_keys_stream_carries_only_its_tenants_documents(server, http):
    body = {"question": GLOBEX, "stream": True, "filters": {"source": ["globex", "acme"]}}
    with http.stream("POST", f"{server.url}/v1/ask", headers=bearer("acme"), json=body) as r:
        assert r.status_code == 200
        text = "".join(r.iter_text())
    assert "globex:" not in text and "event: done" in text


# -- found by the fuzzer ----------------------------------------------------------------------
def test_purging_the_cache_when_it_is_off_is_a_422_not_a_500(server, http):
    message = refused(post(http, server.url, "admin", {"all": True}, "/v1/cache/purge"), 422, "invalid_value", "cache")
    assert "cache.backend: off" in message
