"""A :class:`~rag.types.LexicalIndex` on an Elasticsearch 9 cluster, with safe full rebuilds.

``index`` names an alias. The data lives in physical indexes ``<alias>-v<N>``: the first use
creates ``<alias>-v1`` with the alias on it, all reads and incremental writes go through the
alias, and a full rebuild fills a new generation beside the live one and then moves the alias
in one atomic call, so queries never see a half-built index::

    new = index.begin_rebuild()          # <alias>-v2, empty, not yet aliased
    new.upsert(all_chunks)
    index.commit_rebuild(new)            # alias -> v2 atomically, then v1 is deleted
    # or index.abort_rebuild(new); a crashed rebuild is removed later by index.cleanup()

Writes made through the alias while a rebuild runs land in the old generation and are gone
after the commit; the rebuild is meant to hold everything.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import urlsplit

from elasticsearch import (
    ApiError,
    AuthenticationException,
    AuthorizationException,
    BadRequestError,
    ConnectionError,
    ConnectionTimeout,
    Elasticsearch,
    TransportError,
    UnsupportedProductError,
    helpers,
)

from rag.errors import BackendError, BackendTimeout, BackendUnavailable, ConfigError, SchemaMismatch
from rag.lexical import es_mapping as m
from rag.types import Chunk, Filters, Hit

__all__ = ["ElasticsearchIndex"]

log = logging.getLogger("ragqa.lexical")
_BULK_DOCS = 500
_PAGE = 5000


class ElasticsearchIndex:
    """BM25 search over chunks stored in Elasticsearch; the same results as the embedded index.

    Analysis happens in Python (:mod:`rag.lexical.tokenize`): ``body_en`` holds the
    Snowball-stemmed English terms and ``body_zh`` the jieba words of the chunk, both indexed
    with the ``whitespace`` analyzer. Elasticsearch's own ``english`` and CJK analyzers live in
    the analysis-common module, which minimal distributions lack, and its ``standard`` analyzer
    cuts Chinese into single characters; analysing on the client works on every distribution
    and makes both backends agree term for term. Filters run in ``filter`` context, so scores
    are pure BM25. The whole chunk is kept in ``_source`` and comes back unchanged in hits.

    Nothing connects until first use; driver errors become :class:`~rag.errors.BackendError`
    subclasses. An existing index (or alias target) with another mapping raises
    :class:`~rag.errors.SchemaMismatch` naming the field, and is left untouched.

    Example::

        index = ElasticsearchIndex("https://es:9200", "ragqa-chunks", api_key="...")
        index.upsert(chunks)
        hits = index.search("crawling", k=5, filters=Filters(source=("docs",)))
        index.close()
    """

    def __init__(self, url: str | list[str], index: str = "ragqa-chunks", *, api_key: str | None = None,
                 username: str | None = None, password: str | None = None, ca_certs: str | None = None,
                 verify_certs: bool = True, request_timeout: float = 30, max_retries: int = 3,
                 refresh: bool | str = "wait_for", query_timeout: float = 2.0) -> None:
        self.urls = [url] if isinstance(url, str) else list(url)
        if not self.urls:
            raise ConfigError("Elasticsearch: at least one URL is needed")
        if problem := m.name_problem(index):
            raise ConfigError(f"Elasticsearch: {index!r} is not a valid index name: {problem}")
        if (username is None) != (password is None):
            raise ConfigError("Elasticsearch: username and password must be given together")
        if api_key and username:
            raise ConfigError("Elasticsearch: give either api_key or username/password, not both")
        self.alias = self.index = index
        self.refresh = refresh
        self.request_timeout = request_timeout
        self.query_timeout = query_timeout  # searches: one try, bounded, so a hung node costs a query this much
        self._options: dict[str, Any] = {
            "api_key": api_key, "basic_auth": (username, password) if username else None,
            "ca_certs": ca_certs, "verify_certs": verify_certs, "request_timeout": request_timeout,
            "max_retries": max_retries,
        }
        self._client: Elasticsearch | None = None
        self._owns_client = True
        self._ready = False
        self._generation = False  # bound to one physical index by begin_rebuild
        self._dirty = False
        self._via_alias = True  # False while the name is a concrete index (an older layout)
        self._lock = threading.Lock()
        self.where = ", ".join(_redact(u) for u in self.urls)

    # -- connecting --------------------------------------------------------------------------
    def _es(self) -> Elasticsearch:
        with self._lock:
            if self._client is None:
                opts = {k: v for k, v in self._options.items() if v is not None}
                try:
                    self._client = Elasticsearch(self.urls, **opts)
                except ValueError as exc:
                    raise ConfigError(f"Elasticsearch: {exc}") from exc
                self._owns_client = True
            if not self._ready:
                with self._errors(f"open the index {self.alias!r}"):
                    self._ensure(self._client)
                self._ready = True
            return self._client

    def _ensure(self, es: Elasticsearch) -> None:
        targets = self._targets(es)
        self._via_alias = targets != [self.alias]
        if targets is not None:
            return self._check(es, targets)
        first = f"{self.alias}-v1"
        try:
            es.indices.create(index=first, mappings=m.mapping(self.alias), settings=m.index_settings(),
                              aliases={self.alias: {"is_write_index": True}})
        except BadRequestError as exc:
            if exc.error != "resource_already_exists_exception":
                raise
            if (targets := self._targets(es)) is not None:  # another process created it
                return self._check(es, targets)
            self._check(es, [first])  # ours, left without its alias: take it back
            es.indices.update_aliases(actions=[{"add": {"index": first, "alias": self.alias,
                                                        "is_write_index": True}}])

    def _targets(self, es: Elasticsearch) -> list[str] | None:
        """The indexes the alias points to; ``[alias]`` for a concrete index; None if neither."""
        resp = es.options(ignore_status=404).indices.get_alias(name=self.alias)
        if resp.meta.status == 200 and resp.body:
            return sorted(resp.body)
        return [self.alias] if es.indices.exists(index=self.alias) else None

    def _check(self, es: Elasticsearch, names: list[str]) -> None:
        for name, body in es.indices.get_mapping(index=names).body.items():
            if (diff := m.mapping_difference(body.get("mappings") or {})) is not None:
                via = f" (behind the alias {self.alias!r})" if name != self.alias else ""
                raise SchemaMismatch(
                    f"the Elasticsearch index {name!r}{via} has another mapping: {diff}; "
                    "nothing was changed: choose another index name or delete that index")

    @contextmanager
    def _errors(self, doing: str, timeout: float | None = None) -> Iterator[None]:
        try:
            yield
        except ConnectionTimeout as exc:
            raise BackendTimeout(f"Elasticsearch at {self.where} did not answer within "
                                 f"{timeout or self.request_timeout:g} s (while trying to {doing})") from exc
        except ConnectionError as exc:
            raise BackendUnavailable(f"cannot reach Elasticsearch at {self.where}: {_reason(exc)}") from exc
        except (AuthenticationException, AuthorizationException) as exc:
            raise BackendUnavailable(
                f"Elasticsearch refused the credentials (HTTP {exc.meta.status}) at {self.where}: "
                f"{_api_reason(exc)}; check api_key or username/password") from exc
        except UnsupportedProductError as exc:
            raise BackendUnavailable(f"{self.where} does not answer as Elasticsearch") from exc
        except ApiError as exc:
            raise BackendError(f"Elasticsearch could not {doing}: {_api_reason(exc)}") from exc
        except TransportError as exc:
            raise BackendError(f"Elasticsearch could not {doing}: {_reason(exc)}") from exc

    # -- writes ------------------------------------------------------------------------------
    def upsert(self, chunks: Sequence[Chunk]) -> None:
        latest = {c.id: c for c in chunks}  # the last version of a repeated id wins
        if not latest:
            return
        docs = [m.document(c) for c in latest.values()]  # analysis runs before any request
        self._bulk(({"_index": self.index, "_id": d["id"], "_source": d} for d in docs), len(docs),
                   "index chunks")

    def delete_documents(self, doc_ids: Iterable[str]) -> None:
        ids = list(dict.fromkeys(doc_ids))
        if not ids:
            return
        es = self._es()
        doomed: set[str] = set()
        with self._errors("find the chunks to delete"):
            for i in range(0, len(ids), 1000):
                doomed |= self._ids(es, {"terms": {"doc_id": ids[i:i + 1000]}})
        if doomed:  # delete_by_query lives in the reindex module, which not every node has
            self._bulk(({"_op_type": "delete", "_index": self.index, "_id": cid} for cid in doomed),
                       len(doomed), "delete chunks")

    def delete_chunks(self, chunk_ids: Iterable[str]) -> None:
        ids = list(dict.fromkeys(chunk_ids))
        if ids:
            self._bulk(({"_op_type": "delete", "_index": self.index, "_id": cid} for cid in ids),
                       len(ids), "delete chunks")

    def _bulk(self, actions: Iterable[dict[str, Any]], n: int, doing: str) -> None:
        es = self._es()
        single = n <= _BULK_DOCS
        params: dict[str, Any] = {"refresh": self.refresh if single else False}
        if not self._generation and self._via_alias:
            params["require_alias"] = True  # never let a write auto-create an unmapped index
        failed: list[dict[str, Any]] = []
        self._dirty = self._generation and not self.refresh
        with self._errors(doing):
            for ok, item in helpers.streaming_bulk(es, actions, chunk_size=_BULK_DOCS, raise_on_error=False,
                                                   max_retries=self._options["max_retries"], **params):
                op, result = next(iter(item.items()))
                if not ok and not (op == "delete" and result.get("result") == "not_found"):
                    failed.append(result)
            if self.refresh and not single:
                es.indices.refresh(index=self.index)
        if failed:
            error = failed[0].get("error") or {}
            raise BackendError(
                f"Elasticsearch could not {doing}: {len(failed)} of {n} failed in {self.index!r}; "
                f"first: chunk {failed[0].get('_id')!r}: {error.get('type', 'error')}: "
                f"{error.get('reason', error)}")

    # -- reads -------------------------------------------------------------------------------
    def search(self, query: str, k: int = 10, filters: Filters | None = None) -> list[Hit]:
        body = m.search_body(query, k, filters)
        if body is None:
            return []
        es = self._reader()
        with self._errors("search", self.query_timeout):
            resp = es.options(request_timeout=self.query_timeout, max_retries=0).search(index=self.index, **body)
        chunks = [(m.decode(h["_source"]), float(h["_score"])) for h in resp["hits"]["hits"]]
        return [Hit(chunk_id=c.id, score=score, doc_id=c.doc_id, chunk=c) for c, score in chunks]

    def count(self) -> int:
        es = self._reader()
        with self._errors("count chunks"):
            return int(es.count(index=self.index)["count"])

    def chunk_ids(self, source: str | None = None) -> set[str]:
        es = self._reader()
        with self._errors("list chunk ids"):
            return self._ids(es, {"match_all": {}} if source is None else {"term": {"source": source}})

    def _reader(self) -> Elasticsearch:
        es = self._es()
        if self._dirty:  # a generation being built has no periodic refresh; read your writes
            with self._errors("refresh"):
                es.indices.refresh(index=self.index)
            self._dirty = False
        return es

    def _ids(self, es: Elasticsearch, query: dict[str, Any]) -> set[str]:
        pit = es.open_point_in_time(index=self.index, keep_alive="1m")["id"]
        out: set[str] = set()
        after = None
        try:
            while True:
                resp = es.search(pit={"id": pit, "keep_alive": "1m"}, query=query, size=_PAGE, source=False,
                                 sort=["_shard_doc"], search_after=after, track_total_hits=False)
                pit = resp.get("pit_id", pit)
                hits = resp["hits"]["hits"]
                out.update(h["_id"] for h in hits)
                if len(hits) < _PAGE:
                    return out
                after = hits[-1]["sort"]
        finally:
            with suppress(ApiError, TransportError):
                es.close_point_in_time(id=pit)

    # -- generations -------------------------------------------------------------------------
    def begin_rebuild(self) -> ElasticsearchIndex:
        """A new, empty generation to fill; reads and writes through the alias are unaffected."""
        self._not_generation("begin a rebuild")
        es = self._es()
        with self._errors("create a new generation"):
            n = max((m.generation(self.alias, g) for g in self._generations(es)), default=0) + 1
            name = f"{self.alias}-v{n}"
            es.indices.create(index=name, mappings=m.mapping(self.alias), settings=m.index_settings(True))
        new = ElasticsearchIndex(self.urls, self.alias, refresh=False, request_timeout=self.request_timeout)
        new.index, new._options = name, self._options
        new._client, new._owns_client, new._ready, new._generation = es, False, True, True
        return new

    def commit_rebuild(self, new: ElasticsearchIndex) -> None:
        """Point the alias at ``new`` in one atomic call, then delete the generation it left."""
        es = self._rebuild_of(new, "commit a rebuild")
        with self._errors(f"switch {self.alias!r} to {new.index!r}"):
            es.indices.put_settings(index=new.index, settings={"index": {"refresh_interval": None}})
            es.indices.refresh(index=new.index)
            old = [t for t in self._targets(es) or [] if t != new.index]
            actions: list[dict[str, Any]] = [
                {"remove_index": {"index": t}} if t == self.alias
                else {"remove": {"index": t, "alias": self.alias, "must_exist": True}} for t in old]
            actions.append({"add": {"index": new.index, "alias": self.alias, "is_write_index": True}})
            es.indices.update_aliases(actions=actions)
        new._dirty, self._via_alias = False, True
        for name in old:
            if name != self.alias:
                try:
                    es.indices.delete(index=name, ignore_unavailable=True)
                except (ApiError, TransportError) as exc:
                    log.warning("could not delete the old generation %s (cleanup() will): %s", name, exc)

    def abort_rebuild(self, new: ElasticsearchIndex) -> None:
        """Delete the generation ``new`` was filling; refuses if the alias points at it."""
        es = self._rebuild_of(new, "abort a rebuild")
        with self._errors(f"delete {new.index!r}"):
            if new.index in (self._targets(es) or []):
                raise BackendError(f"{new.index!r} is the live index of {self.alias!r}; not deleting it")
            es.indices.delete(index=new.index, ignore_unavailable=True)

    def cleanup(self) -> list[str]:
        """Delete our generations the alias does not point to (left by crashed rebuilds).

        Run it when no rebuild is in progress: it cannot tell a running rebuild from a dead one.
        """
        self._not_generation("clean up")
        es = self._es()
        with self._errors("delete old generations"):
            live = set(self._targets(es) or [])
            doomed = sorted(n for n, body in self._generations(es).items()
                            if n not in live and m.is_ours(body.get("mappings") or {}, self.alias))
            if doomed:
                es.indices.delete(index=doomed, ignore_unavailable=True)
        return doomed

    def _generations(self, es: Elasticsearch) -> dict[str, Any]:
        resp = es.indices.get(index=f"{self.alias}-v*", features=["mappings"], expand_wildcards="all")
        return {n: body for n, body in resp.body.items() if m.generation(self.alias, n)}

    def _rebuild_of(self, new: ElasticsearchIndex, doing: str) -> Elasticsearch:
        self._not_generation(doing)
        if not new._generation or new.alias != self.alias:
            raise BackendError(f"cannot {doing}: {new.index!r} was not begun by {self.alias!r}")
        return self._es()

    def _not_generation(self, doing: str) -> None:
        if self._generation:
            raise BackendError(f"cannot {doing} on the generation {self.index!r}; use the alias's index")

    def close(self) -> None:
        with self._lock:
            client, self._client, self._ready = self._client, None, False
        if client is not None and self._owns_client:
            client.close()

    def __enter__(self) -> ElasticsearchIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _redact(url: str) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl() if parts.netloc else url


def _reason(exc: TransportError) -> str:
    text = str(exc.message) if exc.message else type(exc.errors[0] if exc.errors else exc).__name__
    text = re.sub(r"^\w*Connection\w*\([^)]*\):\s*", "", text)  # urllib3's "HTTPConnection(host=...): "
    return " ".join(text.split())[:300]


def _api_reason(exc: ApiError) -> str:
    body = exc.body if isinstance(exc.body, dict) else {}
    error = body.get("error")
    if isinstance(error, dict):
        cause = (error.get("root_cause") or [error])[0]
        return f"{cause.get('type', exc.error)}: {cause.get('reason', '')}".strip(": ")
    return " ".join(str(error or exc.error or exc).split())[:300]
