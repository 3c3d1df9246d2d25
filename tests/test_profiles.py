"""Generator profiles on a real index: choosing one per request (forced, routed, cascaded),
falling back when a profile's server is down, versions on every answer (the API, the chat
completions, the QA log) and an answer cache that keeps profiles and arms apart."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from ingest.services import open_services
from rag.answer import Answerer, abstained
from rag.cache import make_answer_cache
from rag.config import CacheSettings, GeneratorSettings, RoutingSettings
from rag.errors import RequestError
from rag.generators.extractive import ExtractiveGenerator
from rag.generators.scripted import ScriptedGenerator
from rag.metrics import REGISTRY
from rag.profiles import model_id, quantization_of
from rag.prompts import PROMPT_VERSION, UNKNOWN
from rag.routing import Decision, RouteSignals
from rag.services import Services
from serve.app import create_app
from tests.conftest import NOTES, make_settings
from tests.corpus import index_notes, question
from tests.live import live, run, sse_events

UNANSWERABLE = "Which quasar does the flumph orbit?"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def routed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """The notes corpus with three profiles besides ``default``: ``small`` (the extractive
    answerer), ``remote`` (an OpenAI-compatible server on a closed port: down) and ``strict``
    (the same server, with fallback off)."""
    base = tmp_path_factory.mktemp("profiles")
    down = {"backend": "openai", "base_url": f"http://127.0.0.1:{closed_port()}/v1", "model": "big-awq",
            "quantization": "awq", "connect_retries": 0, "timeout_s": 2}
    settings = make_settings(
        base / "data", generator={"backend": "extractive"}, retrieval={"mode": "hybrid"},
        profiles={"small": {"backend": "extractive"}, "remote": down, "strict": {**down, "fallback": False}},
        serve={"auth": False, "rate_limit_per_minute": 0})
    svc = index_notes(open_services(settings), base, NOTES)
    yield svc
    svc.close()


class StubRouter:
    """Routes a question with "remote" in it to that profile, one of note 3 to ``small``, the rest to ``default``."""

    def __init__(self) -> None:
        self.seen: list[RouteSignals] = []

    def decide(self, signals: RouteSignals) -> Decision:
        self.seen.append(signals)
        if signals.question_tokens <= 3:
            return Decision("remote", "large: stub says remote", signals)
        if signals.kind == "factual":
            return Decision("small", "small: every rule holds (stub, 9 tokens)", signals)
        return Decision("default", f"large: {signals.question_tokens} tokens > 8", signals)


def answerer(services: Services, mode: str = "off", **kwargs) -> Answerer:
    a = Answerer(services, **kwargs)
    a.routing = RoutingSettings(mode=mode, small="small", large="default")  # type: ignore[arg-type]
    return a


def counted(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def text_of(events) -> str:
    return "".join(e.text for e in events if e.kind == "delta")


def test_model_ids_and_quantization_come_from_the_profiles_settings():
    assert model_id(GeneratorSettings()) == "qwen2.5-coder-1.5b-instruct"
    assert quantization_of(GeneratorSettings()) == "q4_k_m"  # the packaged GGUF's file type
    assert model_id(GeneratorSettings(model="/models/tiny-Q8_0.gguf")) == "tiny-Q8_0"
    assert quantization_of(GeneratorSettings(model="/models/tiny-Q8_0.gguf")) == "q8_0"
    assert model_id(GeneratorSettings(backend="openai", model="big", quantization="awq")) == "big"
    assert quantization_of(GeneratorSettings(backend="vllm", model="big", quantization="awq")) == "awq"
    assert model_id(GeneratorSettings(backend="extractive")) == "extractive"


def test_routing_off_answers_with_default_and_every_answer_carries_its_versions(routed):
    big = ScriptedGenerator(["Big answer [1]."])
    before = counted("router_decisions_total", profile="default", reason="routing off")
    events = run(answerer(routed, generators={"default": big}).stream(question(3)))
    done = events[-1]
    assert done.kind == "done" and text_of(events) == "Big answer [1]." and len(big.prompts) == 1
    assert done.versions == {"profile": "default", "model": "scripted", "quantization": None,
                             "prompt_version": PROMPT_VERSION, "route": None, "arm": None}
    assert events[0].versions == done.versions and done.answer_id.startswith("ans-")
    assert counted("router_decisions_total", profile="default", reason="routing off") == before + 1


def test_the_router_chooses_the_profile_before_generation_and_the_answer_says_why(routed):
    big, small, router = ScriptedGenerator(["Big [1]."]), ScriptedGenerator(["Small [1]."]), StubRouter()
    a = answerer(routed, "rules", generators={"default": big, "small": small}, router=router)
    before = counted("router_decisions_total", profile="small", reason="small: every rule holds")
    ttft = counted("profile_ttft_seconds_count", profile="small")
    events = run(a.stream(f"When was {question(3)}?"))  # factual
    assert text_of(events) == "Small [1]." and len(small.prompts) == 1 and not big.prompts
    signals = router.seen[0]
    assert signals.kind == "factual" and signals.turn == 1 and signals.chunks >= 1 and signals.top_score > 0
    assert events[-1].versions["route"] == {"decision": "small", "reason": "small: every rule holds (stub, 9 tokens)"}
    # the metric's reason leaves out the parenthesis and numbers, so its labels stay few
    assert counted("router_decisions_total", profile="small", reason="small: every rule holds") == before + 1
    assert counted("profile_ttft_seconds_count", profile="small") == ttft + 1

    events = run(a.stream(f"Tell me a story about {question(3)} and more"))  # creative: large
    assert text_of(events) == "Big [1]." and events[-1].versions["profile"] == "default"
    assert events[-1].versions["route"]["reason"].startswith("large: ")


def test_a_forced_profile_bypasses_the_router_and_the_arm_is_recorded(routed):
    big, small, router = ScriptedGenerator(["Big [1]."]), ScriptedGenerator(["Small [1]."]), StubRouter()
    a = answerer(routed, "rules", generators={"default": big, "small": small}, router=router)
    answer = asyncio.run(a.ask(f"When was {question(3)}?", profile="default", arm="control"))
    assert answer.text == "Big [1]." and not small.prompts and not router.seen
    assert answer.versions["profile"] == "default" and answer.versions["route"] is None
    assert answer.versions["arm"] == "control"
    with pytest.raises(RequestError, match=r"no generator profile named 'huge' \(known: default, small, remote"):
        run(a.stream("anything", profile="huge"))


def test_a_profile_whose_server_is_down_falls_back_to_the_next_profile_then_extractive(routed):
    big = ScriptedGenerator(["Big [1]."])
    a = answerer(routed, generators={"default": big})
    events = run(a.stream(question(3), profile="remote"))  # a real OpenAI client, refused on a closed port
    done = events[-1]
    assert done.kind == "done" and text_of(events) == "Big [1]." and done.degraded
    assert not done.fallback  # a profile answered: the extractive last resort was not needed
    assert done.versions["profile"] == "default" and done.versions["model"] == "scripted"
    assert "generator openai (profile remote) unavailable, answered with profile default" in done.warnings[0]
    assert a.profiles.health()["remote"][0] == "down" and a.profiles.health()["default"] == ("ready", None)

    # every profile down: the extractive answerer quotes the note, flagged degraded
    a = answerer(routed, generators={"default": ScriptedGenerator([], fail_start=True)})
    events = run(a.stream(question(3), profile="remote"))
    done = events[-1]
    assert question(3) in text_of(events) and done.versions["profile"] == "small"
    assert done.degraded and len(done.warnings) == 2  # remote, then default

    # a profile with fallback off fails with its own error
    with pytest.raises(Exception, match="127.0.0.1"):
        run(answerer(routed, generators={"default": big}).stream(question(3), profile="strict"))


def test_the_cascade_escalates_an_abstaining_small_answer_to_the_large_profile(routed):
    big = ScriptedGenerator(["The large model says [1]."])
    a = answerer(routed, "cascade", generators={"default": big})  # small: the real extractive answerer
    before = counted("router_decisions_total", profile="default", reason="cascade: abstained")
    events = run(a.stream(UNANSWERABLE))
    assert abstained(ExtractiveGenerator().answer(big.prompts[0]))  # what the small profile said, not sent
    assert text_of(events) == "The large model says [1]." and UNKNOWN["en"] not in text_of(events)
    done = events[-1]
    assert done.versions["profile"] == "default" and done.versions["route"]["decision"] == "default"
    assert "abstained" in done.versions["route"]["reason"] and "cascade_small_ms" in done.timings
    assert counted("router_decisions_total", profile="default", reason="cascade: abstained") == before + 1

    # answered by the small profile: kept, and the large one never runs
    events = run(a.stream(question(5)))
    assert question(5) in text_of(events) and len(big.prompts) == 1
    assert events[-1].versions["profile"] == "small" and events[-1].citations
    assert events[-1].versions["route"] == {"decision": "small", "reason": "cascade: small first"}

    # a small answer that cites nothing is escalated too
    a = answerer(routed, "cascade", generators={"default": big, "small": ScriptedGenerator(["Qwzx vbnm."])})
    events = run(a.stream(question(5)))
    assert text_of(events) == "The large model says [1]." and "cited nothing" in events[-1].versions["route"]["reason"]


def test_the_cache_never_serves_one_profiles_or_arms_answer_to_another(routed):
    big, small = ScriptedGenerator(["Big [1]."]), ScriptedGenerator(["Small [1]."])
    a = answerer(routed, generators={"default": big, "small": small},
                 cache=make_answer_cache(routed, settings=CacheSettings(backend="memory", semantic=False)))
    q = question(4)
    first = run(a.stream(q, profile="small"))
    again = run(a.stream(q, profile="small"))
    assert first[-1].cache == "miss" and again[-1].cache == "hit" and text_of(again) == "Small [1]."
    assert again[-1].versions == first[-1].versions and again[-1].versions["profile"] == "small"
    assert again[-1].answer_id != first[-1].answer_id
    other = run(a.stream(q, profile="default"))
    assert other[-1].cache == "miss" and text_of(other) == "Big [1]." and other[-1].versions["profile"] == "default"
    assert run(a.stream(q))[-1].cache == "hit"  # routing off: the default profile's answer
    arm = run(a.stream(q, profile="small", arm="b"))
    assert arm[-1].cache == "miss" and arm[-1].versions["arm"] == "b"
    assert len(small.prompts) == 2 and len(big.prompts) == 1


def test_versions_in_ask_chat_completions_the_qa_log_and_ready(routed, tmp_path: Path):
    settings = routed.settings.model_copy(update={"serve": routed.settings.serve.model_copy(
        update={"qa_log_path": tmp_path / "qa.jsonl"})})
    big = ScriptedGenerator(["Big [1]."])
    a = Answerer(routed, generators={"default": big}, router=StubRouter())
    a.routing = RoutingSettings(mode="rules", small="small", large="default")
    with live(create_app(settings, services=routed, answerer=a)) as url, httpx.Client(base_url=url, timeout=30) as http:
        body = http.post("/v1/ask", json={"question": f"When was {question(3)}?"}).json()
        assert body["versions"]["profile"] == "small" and body["versions"]["model"] == "extractive"
        assert body["versions"]["route"]["decision"] == "small" and body["answer_id"].startswith("ans-")
        assert body["versions"]["prompt_version"] == PROMPT_VERSION

        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        res = client.chat.completions.create(model="ragqa", messages=[
            {"role": "user", "content": f"Tell me a story about {question(3)} and more"}])
        assert res.model == "scripted"  # the answering profile's model id (profiles are configured)
        extension = res.model_extra["ragqa"]
        assert extension["profile"] == "default" and extension["route"]["reason"].startswith("large: ")
        assert extension["answer_id"].startswith("ans-") and extension["quantization"] is None

        chunks = list(client.chat.completions.create(model="ragqa", stream=True, messages=[
            {"role": "user", "content": f"When was {question(3)}?"}]))
        last = chunks[-1]
        assert last.choices[0].finish_reason == "stop" and last.model == "extractive"
        assert last.model_extra["ragqa"]["profile"] == "small"

        with http.stream("POST", "/v1/ask", json={"question": "remote note", "stream": True}) as res:
            events = list(sse_events(res.iter_lines()))
        done = json.loads(events[-1]["data"])
        assert done["versions"]["profile"] == "default" and done["degraded"]  # remote is down: default answered
        ready = http.get("/ready").json()
        assert ready["status"] == "degraded" and ready["backends"]["profile:remote"]["state"] == "down"
        assert ready["backends"]["profile:remote"]["backend"] == "big-awq"
    lines = [json.loads(line) for line in (tmp_path / "qa.jsonl").read_text().splitlines()]
    assert [line["versions"]["profile"] for line in lines] == ["small", "default", "small", "default"]
    assert all(line["answer_id"].startswith("ans-") and line["versions"]["prompt_version"] == PROMPT_VERSION
               for line in lines)
