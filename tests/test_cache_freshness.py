"""The answer cache stays exactly as fresh as its sources, on the memory and the Redis backends:
a reindex drops the answers built from passages it changed or deleted and nothing else, an
answer whose sources gained documents is checked again (kept when its context is the same,
answered afresh when the new page enters it), a purge drops a source's answers, and an answer
whose index changed while it was generated is not stored.

Each test indexes its own folder source (real files, the real folder crawler, the packaged
MiniLM) in a shared data directory, and asks with a filter on that source.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.pipeline import reindex
from ingest.services import open_services
from rag.answer import Answerer
from rag.config import SourceConfig
from rag.services import Services
from rag.types import Filters
from tests.conftest import make_settings
from tests.fixtures.cache import Counting, ask, done

PAGES = {
    "files.md": ("Reading files", "To read a file in Python, open it with open(path) and call read() on the "
                                  "file object; a with block closes it for you."),
    "writing.md": ("Writing files", "To write a file in Python, open it with open(path, 'w') and call write() "
                                    "with the text."),
    "status.md": ("Status", "The service status is green."),
    "release.md": ("Python 3.12", "Python 3.12 was released on 2 October 2023."),
}
READ = "How do I read a file in Python?"
STATUS = "What is the service status?"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    base = tmp_path_factory.mktemp("fresh")
    settings = make_settings(base / "data", embedder={"backend": "sentence-transformers", "progress": False,
                                                      "threads": 1},
                             generator={"backend": "extractive"}, retrieval={"mode": "hybrid", "top_k": 2})
    svc = open_services(settings)
    svc.src = base / "src"  # type: ignore[attr-defined]
    yield svc
    svc.close()


class Source:
    """A folder source of its own for one test: write, delete, reindex, and its filter."""

    def __init__(self, services: Services, pages: dict[str, tuple[str, str]]) -> None:
        self.services = services
        self.name = f"s{uuid.uuid4().hex[:8]}"
        self.folder: Path = services.src / self.name  # type: ignore[attr-defined]
        self.folder.mkdir(parents=True)
        for name, (title, body) in pages.items():
            self.write(name, title, body)
        services.state.add_source(SourceConfig(name=self.name, kind="folder", location=str(self.folder), lang="en"))
        self.reindex()
        self.filters = Filters(source=(self.name,))

    def write(self, name: str, title: str, body: str) -> None:
        (self.folder / name).write_text(f"# {title}\n\n{body}\n", encoding="utf-8")

    def reindex(self) -> None:
        with self.services.write_lock():
            reindex(self.services, self.name, "full")


def cited(events) -> set[str]:
    return {c.url.rsplit("/", 1)[-1] for c in done(events).citations}


def test_an_edit_drops_only_the_answers_built_from_the_edited_passage(corpus, new_cache):
    src, gen = Source(corpus, PAGES), Counting()
    answerer = Answerer(corpus, generator=gen, cache=new_cache())
    ask(answerer, READ, filters=src.filters)
    ask(answerer, STATUS, filters=src.filters)
    src.reindex()  # nothing changed: nothing is dropped
    for q in (READ, STATUS):
        assert done(ask(answerer, q, filters=src.filters)[1]).cache == "hit"
    assert gen.calls == 2

    src.write("status.md", "Status", "The service status is amber after the outage.")
    src.reindex()
    text, events = ask(answerer, STATUS, filters=src.filters)
    assert done(events).cache == "miss" and "amber" in text and gen.calls == 3
    # READ's context (files.md, writing.md with top_k 2) did not hold status.md
    assert done(ask(answerer, READ, filters=src.filters)[1]).cache == "hit" and gen.calls == 3


def test_a_deleted_page_is_not_cited_by_the_next_answer(corpus, new_cache):
    src, gen = Source(corpus, PAGES), Counting()
    answerer = Answerer(corpus, generator=gen, cache=new_cache())
    q = "When was Python 3.12 released?"
    _, events = ask(answerer, q, filters=src.filters)
    assert "release.md" in cited(events)
    (src.folder / "release.md").unlink()
    src.reindex()
    _, events = ask(answerer, q, filters=src.filters)
    assert done(events).cache == "miss" and "release.md" not in cited(events)
    assert all(c.url.rsplit("/", 1)[-1] != "release.md" for c in events[0].citations)


def test_a_new_page_that_the_question_retrieves_is_not_hidden_by_a_cached_answer(corpus, new_cache):
    src, gen = Source(corpus, PAGES), Counting()
    answerer = Answerer(corpus, generator=gen, cache=new_cache())
    ask(answerer, STATUS, filters=src.filters)
    src.write("incident.md", "Service status update", "The service status is red: the service status page "
                                                     "reports an outage of the service.")
    src.reindex()
    text, events = ask(answerer, STATUS, filters=src.filters)
    assert done(events).cache == "miss" and gen.calls == 2
    assert "incident.md" in {c.url.rsplit("/", 1)[-1] for c in events[0].citations}
    assert done(ask(answerer, STATUS, filters=src.filters)[1]).cache == "hit"  # the fresh answer, cached


def test_a_new_page_that_the_question_does_not_retrieve_keeps_the_answer(corpus, new_cache):
    src, gen = Source(corpus, PAGES), Counting()
    cache = new_cache()
    answerer = Answerer(corpus, generator=gen, cache=cache)
    ask(answerer, READ, filters=src.filters)
    src.write("garden.md", "Tomatoes", "Tomatoes need six hours of sun and deep watering twice a week.")
    src.reindex()
    _, events = ask(answerer, READ, filters=src.filters)  # rechecked: the same two passages
    assert done(events).cache == "hit" and gen.calls == 1
    assert cache.stats()["rechecks"]["kept"] == 1
    assert done(ask(answerer, READ, filters=src.filters)[1]).cache == "hit"  # restamped: no second recheck
    assert cache.stats()["rechecks"]["kept"] == 1

    other = Source(corpus, {"more.md": ("More", "Another source, indexed after the answer.")})
    assert other.name != src.name  # an addition elsewhere does not concern a filtered answer
    assert done(ask(answerer, READ, filters=src.filters)[1]).cache == "hit"
    assert cache.stats()["rechecks"]["kept"] == 1


def test_a_purge_drops_a_sources_answers_or_all(corpus, new_cache):
    a, b, gen = Source(corpus, PAGES), Source(corpus, PAGES), Counting()
    answerer = Answerer(corpus, generator=gen, cache=new_cache())
    for src in (a, b):
        ask(answerer, READ, filters=src.filters)
    corpus.state.log_purge(a.name)
    assert done(ask(answerer, READ, filters=a.filters)[1]).cache == "miss"
    assert done(ask(answerer, READ, filters=b.filters)[1]).cache == "hit"
    corpus.state.log_purge(None)
    assert done(ask(answerer, READ, filters=b.filters)[1]).cache == "miss"
    assert gen.calls == 4


def test_an_answer_whose_index_changed_while_it_was_generated_is_not_stored(corpus, new_cache):
    from rag.cache import CachedAnswer

    src = Source(corpus, PAGES)
    cache = new_cache()
    lookup = cache.lookup(STATUS, filters=src.filters)
    assert lookup.answer is None
    src.write("status.md", "Status", "The service status is blue.")
    src.reindex()  # between the lookup and the store
    assert not cache.store(lookup, CachedAnswer("The service status is green.", (), ()))
    assert cache.lookup(STATUS, filters=src.filters).answer is None


def test_a_change_logged_by_another_process_is_applied_at_the_next_lookup(corpus, new_cache):
    """``ragqa cache purge`` and ``ragqa reindex`` write the state from their own process: the
    serving process sees the commit (``PRAGMA data_version``) and applies it before answering."""
    from click.testing import CliRunner

    from ragqa.cli import cli

    src, gen = Source(corpus, PAGES), Counting()
    cache = new_cache()
    answerer = Answerer(corpus, generator=gen, cache=cache)
    ask(answerer, READ, filters=src.filters)
    env = {"RAG_DATA_DIR": str(corpus.data_dir), "RAG_CACHE__BACKEND": "memory"}
    result = CliRunner().invoke(cli, ["cache", "purge", "--source", src.name], env=env)
    assert result.exit_code == 0 and "logged" in result.output, result.output
    assert done(ask(answerer, READ, filters=src.filters)[1]).cache == "miss"
    result = CliRunner().invoke(cli, ["cache", "stats", "--json"], env=env)
    assert result.exit_code == 0, result.output
    stats = json.loads(result.output)
    assert stats["backend"] == "memory" and stats["changes"]["purges"] >= 1
    assert stats["changes"]["last_change"] == corpus.state.last_change()
    for args in (["cache", "purge"], ["cache", "purge", "--all", "--source", src.name],
                 ["cache", "purge", "--source", "nope"]):
        result = CliRunner().invoke(cli, args, env=env)
        assert result.exit_code != 0 and "error:" in result.output, result.output
