"""Generations of a Milvus collection behind an alias, and the full rebuilds of
:class:`~rag.vectors.milvus.MilvusVectorIndex`.

The collection name given is an alias of a physical collection ``<collection>_g<N>`` (a new
name starts with ``_g0``). A rebuild fills ``_g<N+1>`` and its commit points the alias at it
with ``alter_alias``, atomic on the server and in Milvus Lite (which rewrites its alias file
with ``os.replace``); every read and write goes through the alias, so all clients switch at
once. A collection made before generations existed, named exactly ``<collection>``, is
generation 0: the first rebuild renames it to ``<collection>_g0`` and creates the alias
(other clients of a server cannot find the name for those few milliseconds). Names
``<collection>_g<N>`` belong to the index. On a server the old generation is dropped
:data:`DROP_GRACE_S` after the switch: a Milvus 2.3 read in flight on a collection dropped
under it returns no rows, not an error.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from pymilvus import MilvusClient
from pymilvus.exceptions import MilvusException

from rag.errors import BackendError
from rag.generations import RebuildTracking

if TYPE_CHECKING:
    from rag.vectors.milvus import MilvusVectorIndex

__all__ = ["DROP_GRACE_S", "MilvusGenerations"]

# A Milvus 2.3 server answers a read that resolved the alias before the switch, and finds its
# collection dropped before it ends, with no rows rather than an error: the old generation
# is dropped this long after the switch, for the reads in flight to finish on it.
DROP_GRACE_S = 2.0


class MilvusGenerations(RebuildTracking):
    """The alias and rebuild methods of :class:`~rag.vectors.milvus.MilvusVectorIndex`."""

    def _create_alias(self: MilvusVectorIndex, client: MilvusClient) -> None:
        """Point the (missing) alias at generation 0, new or left by an interrupted start."""
        found = sorted(n for n in client.list_collections(timeout=self.timeout_s)
                       if self._generations.matches(n))
        if len(found) > 1:
            raise BackendError(
                f"{self._where}: no collection or alias {self.collection!r}, but its generations "
                f"{', '.join(found)} exist; create the alias to the complete one "
                f"(client.create_alias(<collection>, {self.collection!r})) or drop them"
            )
        physical = found[0] if found else self._generations.name(0)
        if not found:
            self._create(client, physical)
        try:
            client.create_alias(physical, self.collection, timeout=self.timeout_s)
        except MilvusException:
            if not client.has_collection(self.collection, timeout=self.timeout_s):
                raise  # else another client created it first

    def _live(self: MilvusVectorIndex, client: MilvusClient) -> str | None:
        """The physical collection the name stands for (itself when it is not an alias)."""
        listed = client.list_aliases(timeout=self.timeout_s)
        aliases = listed.get("aliases", []) if isinstance(listed, dict) else listed
        if self.collection in aliases:
            return str(client.describe_alias(self.collection, timeout=self.timeout_s)["collection_name"])
        return self.collection if client.has_collection(self.collection, timeout=self.timeout_s) else None

    def drop(self: MilvusVectorIndex) -> None:
        """Drop the collection and everything in it (its alias and every generation)."""
        with self._lock:
            client = self._raw_client()
            with self._calling(f"drop {self.collection!r}"):
                if self._origin is not None:
                    client.drop_collection(self.collection, timeout=self.timeout_s)
                else:
                    live = self._live(client)
                    for name in client.list_collections(timeout=self.timeout_s):
                        if self._generations.matches(name) and name != live:
                            client.drop_collection(name, timeout=self.timeout_s)
                    if live is not None and live != self.collection:
                        client.drop_alias(self.collection, timeout=self.timeout_s)
                    if live is not None:
                        client.drop_collection(live, timeout=self.timeout_s)
            self._ready = False

    def begin_rebuild(self: MilvusVectorIndex) -> MilvusVectorIndex:
        """A writable index on a new, empty collection that nothing reads until it is committed."""
        self._refuse_unless_live()
        client = self._conn()
        with self._lock:
            with self._calling(f"begin a rebuild of {self.collection!r}"):
                if self._live(client) == self.collection:
                    self._adopt_legacy(client)
                names = client.list_collections(timeout=self.timeout_s)
            physical = self._generations.next(names)
            new = type(self)(self.uri, physical, self.dim, self._token, self.timeout_s,
                             index_type=self._index_type, query_timeout_s=self.query_timeout_s)
            new._origin, new._client, new._owns_client = self, client, False
            self._building.add(physical)
        try:
            new._conn()
        except BaseException:
            self._building.discard(physical)
            raise
        return new

    def _adopt_legacy(self: MilvusVectorIndex, client: MilvusClient) -> None:
        """Make a pre-generation collection generation 0 behind an alias of its old name."""
        physical = self._generations.name(0)
        client.rename_collection(self.collection, physical, timeout=self.timeout_s)
        client.load_collection(physical, timeout=self.timeout_s)  # a rename releases it
        client.create_alias(physical, self.collection, timeout=self.timeout_s)

    def commit_rebuild(self: MilvusVectorIndex, new: MilvusVectorIndex) -> None:
        """Make ``new`` (from :meth:`begin_rebuild`) the live index, then drop the old one."""
        self._check_rebuild(new)
        new.flush()  # sealed before it goes live: durable, and fast to search in Milvus Lite
        client = self._raw_client()
        with self._lock:
            with self._calling(f"switch {self.collection!r} to {new.collection!r}"):
                old = self._live(client)
                if old is None or old == self.collection:
                    raise BackendError(f"{self._where}: {self.collection!r} is not an alias any more")
                client.alter_alias(new.collection, self.collection, timeout=self.timeout_s)
            self._unflushed = False
            self.wrote()  # the rebuilt rows are the live ones now: read them at once
            self._retire(new)
        if old != new.collection:
            if not self._lite:  # one process per Milvus Lite file: no other reader in flight
                time.sleep(DROP_GRACE_S)
            with self._calling(f"drop the old generation {old!r}"):
                client.drop_collection(old, timeout=self.timeout_s)

    def abort_rebuild(self: MilvusVectorIndex, new: MilvusVectorIndex) -> None:
        """Drop ``new`` (from :meth:`begin_rebuild`); the live index stays as it is."""
        self._check_rebuild(new)
        client = self._raw_client()
        with self._lock:
            self._retire(new)
            with self._calling(f"drop the rebuild {new.collection!r}"):
                client.drop_collection(new.collection, timeout=self.timeout_s)

    def cleanup(self: MilvusVectorIndex) -> list[str]:
        """Drop generations that are not live (left by a crashed rebuild); return their names."""
        if self._origin is not None:
            return []
        client = self._conn()
        with self._lock, self._calling(f"clean up after {self.collection!r}"):
            live = self._live(client)
            leftovers = sorted(n for n in client.list_collections(timeout=self.timeout_s)
                               if self._generations.matches(n) and n != live and n not in self._building)
            for name in leftovers:
                client.drop_collection(name, timeout=self.timeout_s)
        return leftovers

    def _owns_rebuild(self: MilvusVectorIndex, new: MilvusVectorIndex) -> bool:
        return new.uri == self.uri and self._generations.matches(new.collection)

    def _retire(self: MilvusVectorIndex, new: MilvusVectorIndex) -> None:
        for index in {self, new._origin}:
            if index is not None:
                index._building.discard(new.collection)
        with new._lock:
            new._retired, new._ready, new._client = True, False, None
