"""API keys, scopes, tenants and rate limits through a real uvicorn server on 127.0.0.1.

Two tenants' folders are indexed: ``acme`` (notes 0-9) and ``globex`` (notes 10-19). The
keys are real ones, made as ``ragqa keys create`` makes them and configured by their hash.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import openai
import pytest
import yaml
from click.testing import CliRunner

from ingest.services import open_services
from rag.config import Settings
from rag.errors import ConfigError
from rag.services import Services
from ragqa.cli import cli
from serve.app import create_app
from serve.auth import hash_key, new_key
from tests.corpus import NEW, OLD, index_notes, question
from tests.fixtures.keys import KEYS, LIMIT, auth_settings, bearer
from tests.live import live, sse_events


def with_serve(settings: Settings, **update: object) -> Settings:
    return settings.model_copy(update={"serve": settings.serve.model_copy(update=update)})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    base = tmp_path_factory.mktemp("serve-auth")
    svc = index_notes(open_services(auth_settings(base / "data")), base,
                      {"acme": (range(10), OLD), "globex": (range(10, 20), NEW)}, tenants=True)
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def server(corpus: Services) -> Iterator[SimpleNamespace]:
    app = create_app(corpus.settings, services=corpus)
    with live(app) as url:
        yield SimpleNamespace(url=url, state=app.state.ragqa)


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as c:
        yield c


def ask(http: httpx.Client, url: str, key: str, **body: object) -> httpx.Response:
    return http.post(f"{url}/v1/ask", headers=bearer(key), json=body)


def doc_ids(citations: list[dict]) -> set[str]:
    return {c["doc_id"] for c in citations}


# -- who may ask ----------------------------------------------------------------------------
def test_no_key_is_a_401_with_a_bearer_challenge(server, http):
    for method, path in (("POST", "/v1/ask"), ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
                         ("GET", "/v1/sources"), ("GET", "/v1/documents/acme:d01.md"),
                         ("POST", "/v1/sources/acme/reindex"), ("GET", "/v1/streams/abc")):
        r = http.request(method, f"{server.url}{path}", json={"question": "q"} if method == "POST" else None)
        assert r.status_code == 401, (path, r.text)
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert r.json()["error"] == {"message": r.json()["error"]["message"], "type": "invalid_request_error",
                                     "param": None, "code": "missing_api_key"}
    assert http.get(f"{server.url}/health").status_code == 200  # probes stay open
    assert http.post(f"{server.url}/v1/ask", headers={"Authorization": "Basic dTpw"},
                     json={"question": "q"}).status_code == 401


def test_a_bad_key_is_a_401_whichever_header_carries_it(server, http):
    wrong = new_key()
    for headers in ({"Authorization": f"Bearer {wrong}"}, {"X-API-Key": wrong},
                    {"Authorization": f"Bearer {KEYS['acme']}x"}, {"X-API-Key": hash_key(KEYS["acme"])}):
        r = http.post(f"{server.url}/v1/ask", headers=headers, json={"question": question(1)})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert 'error="invalid_token"' in r.headers["www-authenticate"]
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=wrong, max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="ragqa", messages=[{"role": "user", "content": question(1)}])


def test_a_query_key_can_ask_but_not_use_the_admin_routes(server, http):
    r = http.post(f"{server.url}/v1/ask", headers={"X-API-Key": KEYS["acme"]}, json={"question": question(2)})
    assert r.status_code == 200 and doc_ids(r.json()["citations"]) >= {"acme:d02.md"}
    for method, path in (("GET", "/v1/documents/acme:d02.md"), ("POST", "/v1/sources/acme/reindex")):
        r = http.request(method, f"{server.url}{path}", headers=bearer("acme"))
        assert r.status_code == 403, r.text
        assert r.json()["error"]["type"] == "permission_error" and r.json()["error"]["code"] == "insufficient_scope"
        assert "'admin'" in r.json()["error"]["message"]
    # a query route lists only the key's tenant's sources
    assert [s["name"] for s in http.get(f"{server.url}/v1/sources", headers=bearer("acme")).json()] == ["acme"]


def test_an_admin_key_can_use_every_route(server, http):
    assert [s["name"] for s in http.get(f"{server.url}/v1/sources", headers=bearer("admin")).json()] == [
        "acme", "globex"]
    doc = http.get(f"{server.url}/v1/documents/globex:d12.md", headers=bearer("admin"))
    assert doc.status_code == 200 and question(12) in doc.json()["chunks"][0]["text"]
    report = http.post(f"{server.url}/v1/sources/acme/reindex", headers=bearer("admin"))
    assert report.status_code == 200 and report.json()["unchanged"] == 10
    assert ask(http, server.url, "admin", question=question(3)).status_code == 200  # admin implies query


def test_the_openai_client_with_an_api_key(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEYS["acme"], max_retries=0) as client:
        res = client.chat.completions.create(model="ragqa", messages=[{"role": "user", "content": question(4)}])
        assert question(4) in res.choices[0].message.content
        assert res.choices[0].message.citations[0]["doc_id"] == "acme:d04.md"
        with client.chat.completions.create(model="ragqa", messages=[{"role": "user", "content": question(4)}],
                                            stream=True) as stream:
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert text.strip() == res.choices[0].message.content
        with pytest.raises(openai.PermissionDeniedError):
            client.get("/documents/acme:d04.md", cast_to=object)


# -- tenants ------------------------------------------------------------------------------
def test_a_tenant_key_never_gets_another_tenants_citations(server, http):
    target = question(12)  # globex's note 12, word for word
    control = ask(http, server.url, "admin", question=target).json()
    assert "globex:d12.md" in doc_ids(control["citations"])  # the question does find it
    for key, cited in (("acme", "acme:"), ("globex", "globex:")):
        body = ask(http, server.url, key, question=target).json()
        assert body["citations"] and all(c.startswith(cited) for c in doc_ids(body["citations"])), body
    acme = ask(http, server.url, "acme", question=target).json()
    assert target not in acme["answer"]
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEYS["acme"], max_retries=0) as client:
        res = client.chat.completions.create(model="ragqa", messages=[{"role": "user", "content": target}])
        assert all(c["doc_id"].startswith("acme:") for c in res.choices[0].message.citations)
        with client.chat.completions.create(model="ragqa", messages=[{"role": "user", "content": target}],
                                            stream=True) as stream:
            chunks = list(stream)
        final = [c for c in chunks if c.choices and c.choices[0].finish_reason][0]
        assert all(c["doc_id"].startswith("acme:") for c in final.choices[0].delta.citations)


def test_naming_another_tenant_in_filters_is_a_403_and_never_widens(server, http):
    target = question(12)
    r = ask(http, server.url, "acme", question=target, filters={"tenant": "globex"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "tenant_forbidden"
    for stream in (False, True):
        r = http.post(f"{server.url}/v1/chat/completions", headers=bearer("acme"), json={
            "messages": [{"role": "user", "content": target}], "stream": stream,
            "rag": {"filters": {"tenant": "globex"}}})
        assert r.status_code == 403 and r.headers["content-type"] == "application/json"
    # its own tenant is allowed; another tenant's source matches nothing of its own
    assert ask(http, server.url, "acme", question=target, filters={"tenant": "acme"}).status_code == 200
    by_source = ask(http, server.url, "acme", question=target, filters={"source": "globex"})
    assert by_source.status_code == 200 and by_source.json()["citations"] == []
    assert target not in by_source.json()["answer"]
    # a global key may ask for any tenant
    admin = ask(http, server.url, "admin", question=target, filters={"tenant": "globex"}).json()
    assert doc_ids(admin["citations"]) and all(d.startswith("globex:") for d in doc_ids(admin["citations"]))


def test_only_the_key_that_started_a_stream_can_resume_it(server, http):
    with http.stream("POST", f"{server.url}/v1/ask", headers=bearer("acme"),
                     json={"question": question(5), "stream": True}) as r:
        events = list(sse_events(r.iter_lines()))
    sid = r.headers["x-stream-id"]
    assert events[-1]["event"] == "done"
    for key in ("globex", "admin"):
        other = http.get(f"{server.url}/v1/streams/{sid}", headers={**bearer(key), "Last-Event-ID": f"{sid}:1"})
        assert other.status_code == 404 and other.json()["error"]["param"] == "Last-Event-ID"
        again = http.post(f"{server.url}/v1/ask", headers={**bearer(key), "Last-Event-ID": f"{sid}:1"},
                          json={"question": "q", "stream": True})
        assert again.status_code == 404
    mine = {**bearer("acme"), "Last-Event-ID": f"{sid}:1"}
    with http.stream("GET", f"{server.url}/v1/streams/{sid}", headers=mine) as r:
        assert r.status_code == 200
        assert [e["id"] for e in sse_events(r.iter_lines())] == [e["id"] for e in events[1:]]
    # the chat route's resume too
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEYS["acme"], max_retries=0) as client:
        with client.chat.completions.create(model="ragqa", messages=[{"role": "user", "content": question(6)}],
                                            stream=True) as stream:
            chat_id = next(iter(stream)).id.removeprefix("chatcmpl-")
            list(stream)
    r = http.post(f"{server.url}/v1/chat/completions", headers={**bearer("globex"), "Last-Event-ID": f"{chat_id}:1"},
                  json={"messages": [{"role": "user", "content": "q"}], "stream": True})
    assert r.status_code == 404


def test_a_conversation_belongs_to_its_key(server, http):
    first = ask(http, server.url, "acme", question=question(7)).json()
    cid = first["conversation_id"]
    other = ask(http, server.url, "globex", question=question(15), conversation_id=cid)
    assert other.status_code == 200 and other.json()["conversation_id"] == cid
    conversations = server.state.conversations
    acme_turns = asyncio.run(conversations.history(cid, "acme-app"))
    assert [t["content"] for t in acme_turns] == [question(7), first["answer"]]  # globex's turn is not in it
    assert asyncio.run(conversations.history(cid, "globex-app"))[0]["content"] == question(15)


# -- rate limits ----------------------------------------------------------------------------
def test_the_request_past_a_keys_limit_is_a_429_with_retry_after(server, http):
    for _ in range(LIMIT):
        assert http.get(f"{server.url}/v1/models", headers=bearer("limited")).status_code == 200
    r = http.get(f"{server.url}/v1/models", headers=bearer("limited"))
    assert r.status_code == 429
    assert r.json()["error"]["type"] == "rate_limit_exceeded" and r.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(r.headers["retry-after"]) <= 60
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEYS["limited"], max_retries=0) as client:
        with pytest.raises(openai.RateLimitError):
            client.models.list()
    assert http.get(f"{server.url}/v1/models", headers=bearer("acme")).status_code == 200  # each key its own window


def test_with_auth_off_the_limit_is_per_client_address(corpus, http):
    settings = with_serve(corpus.settings, auth=False, rate_limit_per_minute=2)
    with live(create_app(settings, services=corpus)) as url:
        assert [http.get(f"{url}/v1/models").status_code for _ in range(3)] == [200, 200, 429]
        r = http.post(f"{url}/v1/ask", json={"question": question(1)})  # anonymous: no key needed
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1


@pytest.mark.skipif(not os.environ.get("RAG_TEST_REDIS_URL"), reason="RAG_TEST_REDIS_URL is not set "
                    "(scripts/test.sh starts a throwaway Redis and sets it)")
def test_workers_sharing_redis_share_a_keys_window(corpus, http):
    key = new_key()
    entry = {"id": f"shared-{secrets.token_hex(4)}", "hash": hash_key(key), "rate_limit_per_minute": LIMIT}
    keys = Settings.load(None, serve={"api_keys": [entry]}).serve.api_keys
    # rate_limit_storage left unset: serve.redis_url is the default, as for the streams
    settings = with_serve(corpus.settings, api_keys=keys, redis_url=os.environ["RAG_TEST_REDIS_URL"])
    headers = {"X-API-Key": key}
    with live(create_app(settings, services=corpus)) as one, live(create_app(settings, services=corpus)) as two:
        codes = [http.get(f"{url}/v1/models", headers=headers).status_code for url in (one, two, one, two)]
    assert codes == [200] * LIMIT + [429]


def test_an_unreachable_limit_store_falls_back_to_counting_in_the_process_not_a_free_pass(corpus, http):
    from rag.metrics import REGISTRY

    before = REGISTRY.get_sample_value("rate_limit_fallbacks_total") or 0.0
    settings = with_serve(corpus.settings, rate_limit_storage="redis://127.0.0.1:9/0")  # nothing listens there
    with live(create_app(settings, services=corpus)) as url:
        codes = [http.get(f"{url}/v1/models", headers=bearer("limited")).status_code for _ in range(LIMIT + 1)]
    assert codes == [200] * LIMIT + [429]  # still limited, by this process's own count
    assert (REGISTRY.get_sample_value("rate_limit_fallbacks_total") or 0.0) == before + LIMIT + 1


# -- starting up ----------------------------------------------------------------------------
def test_no_auth_on_a_public_host_refuses_to_start_unless_forced(corpus):
    public = with_serve(corpus.settings, auth=False, host="0.0.0.0")
    with pytest.raises(ConfigError, match="refusing to serve on 0.0.0.0 with auth off"):
        create_app(public, services=corpus)
    for ok in (with_serve(public, allow_insecure_public=True), with_serve(public, auth=True),
               with_serve(public, host="127.0.0.1"), with_serve(public, host="::1")):
        assert create_app(ok, services=corpus).state.ragqa.settings is ok  # built, nothing bound


def cli_env(corpus: Services, **extra: str) -> dict[str, str]:
    return {"RAG_DATA_DIR": str(corpus.data_dir), "RAG_EMBEDDER__BACKEND": "hash", "RAG_EMBEDDER__DIM": "256",
            "RAG_VECTOR__BACKEND": "numpy", "RAG_GENERATOR__BACKEND": "extractive", "RAG_CONFIG": "", **extra}


def test_ragqa_serve_refuses_a_public_host_without_auth_and_allow_insecure_allows_it(corpus, monkeypatch):
    serve_cli = sys.modules["ragqa.cli.serve"]  # the attribute ragqa.cli.serve is the command

    res = CliRunner().invoke(cli, ["serve", "--host", "0.0.0.0", "--no-auth"], env=cli_env(corpus))
    assert res.exit_code == 1 and len(res.stderr.strip().splitlines()) == 1
    assert res.stderr.startswith("error: refusing to serve on 0.0.0.0 with auth off")
    assert "--allow-insecure" in res.stderr
    res = CliRunner().invoke(cli, ["serve", "--host", "0.0.0.0"], env=cli_env(corpus, RAG_SERVE__AUTH="false"))
    assert res.exit_code == 1 and "refusing" in res.stderr
    started = []  # what would be bound: the real uvicorn config, but not run (no public socket in tests)
    monkeypatch.setattr(serve_cli, "_listening_server",
                        lambda config: SimpleNamespace(run=lambda: started.append(config)))
    res = CliRunner().invoke(cli, ["serve", "--host", "0.0.0.0", "--no-auth", "--allow-insecure", "--port", "0"],
                             env=cli_env(corpus))
    assert res.exit_code == 0, res.output
    (config,) = started
    assert config.host == "0.0.0.0" and config.app.state.ragqa.settings.serve.auth is False
    res = CliRunner().invoke(cli, ["serve", "--host", "0.0.0.0", "--port", "0"], env=cli_env(corpus))
    assert res.exit_code == 0 and started[-1].app.state.ragqa.settings.serve.auth is True  # with auth: fine


def test_ragqa_serve_passes_loop_and_http_on_to_uvicorn(corpus, monkeypatch):
    serve_cli = sys.modules["ragqa.cli.serve"]
    started = []
    monkeypatch.setattr(serve_cli, "_listening_server",
                        lambda config: SimpleNamespace(run=lambda: started.append(config)))
    res = CliRunner().invoke(cli, ["serve", "--port", "0", "--no-auth"], env=cli_env(corpus))
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["serve", "--port", "0", "--no-auth", "--loop", "asyncio", "--http", "h11"],
                             env=cli_env(corpus))
    assert res.exit_code == 0, res.output
    assert [(c.loop, c.http) for c in started] == [("auto", "auto"), ("asyncio", "h11")]
    assert serve_cli._resolve("auto", "uvloop", "asyncio") in ("uvloop", "asyncio (uvloop is not installed)")


def test_a_key_from_ragqa_keys_create_works(corpus, http):
    res = CliRunner().invoke(cli, ["keys", "create", "--scope", "query", "--tenant", "acme", "--id", "cli-made"])
    assert res.exit_code == 0, res.output
    key, snippet = res.stdout.split("\n", 1)
    entry = yaml.safe_load(snippet)["serve"]["api_keys"][0]
    assert entry == {"id": "cli-made", "hash": hash_key(key), "scopes": ["query"], "tenant": "acme"}
    assert key not in snippet  # only the hash goes into settings
    hashed = CliRunner().invoke(cli, ["keys", "hash", "-"], input=key + "\n")
    assert hashed.exit_code == 0 and hashed.stdout.strip() == entry["hash"]
    env_form = json.loads(snippet.split("RAG_SERVE__API_KEYS='")[1].rsplit("'", 1)[0])
    assert env_form == [entry]
    settings = with_serve(corpus.settings, api_keys=Settings.load(None, serve={"api_keys": [entry]}).serve.api_keys)
    with live(create_app(settings, services=corpus)) as url:
        r = http.post(f"{url}/v1/ask", headers={"Authorization": f"Bearer {key}"}, json={"question": question(12)})
        assert r.status_code == 200 and all(d.startswith("acme:") for d in doc_ids(r.json()["citations"]))
        assert http.post(f"{url}/v1/ask", headers=bearer("acme"), json={"question": "q"}).status_code == 401


def test_key_settings_are_checked(tmp_path):
    entry = {"id": "a", "hash": hash_key(new_key())}
    bad = {
        "an admin key cannot be bound to a tenant": [{**entry, "scopes": ["admin"], "tenant": "acme"}],
        "two keys have the id 'a'": [entry, {**entry, "hash": hash_key(new_key())}],
        "hash": [{**entry, "hash": "rqa_plaintext"}],
        "scope": [{**entry, "scope": ["admin"]}],  # misspelt: refused, not ignored
    }
    for message, keys in bad.items():
        with pytest.raises(ConfigError, match=message):
            Settings.load(None, data_dir=tmp_path, serve={"api_keys": keys})
    assert Settings.load(None, data_dir=tmp_path).serve.auth is True  # on unless explicitly disabled
    short = CliRunner().invoke(cli, ["keys", "hash", "hunter2"])
    assert short.exit_code != 0 and "at least 32" in short.output


def test_openapi_documents_the_keys_and_the_auth_errors(server, http):
    spec = http.get(f"{server.url}/openapi.json").json()
    schemes = spec["components"]["securitySchemes"]
    assert {s["type"] for s in schemes.values()} == {"http", "apiKey"}
    ask_op = spec["paths"]["/v1/ask"]["post"]
    assert {"401", "403", "429"} <= set(ask_op["responses"]) and ask_op["security"]
