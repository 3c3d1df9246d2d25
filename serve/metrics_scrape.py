"""What one scrape of ``/metrics`` collects, for one worker or for a whole multi-worker server.

With one worker, the process's own registry (:data:`rag.metrics.REGISTRY`) is the server's.
With ``ragqa serve --workers N`` every process writes its metrics to files in
``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client's multiprocess mode; ``ragqa serve`` makes a
fresh directory per start), and a scrape, on whichever worker it lands, sums them with
``MultiProcessCollector``: counters and histograms add up, gauges follow their
``multiprocess_mode`` (``livesum`` for in-flight counts, ``max`` for timestamps).

Both ways the scrape adds readings taken from the state database at scrape time, so they are
right whichever process crawled or verified:

- ``freshness_lag_seconds{source}``: seconds since the newest successful crawl of the source
  (since it was added, when it never had one);
- ``index_drift_chunks{index}``: chunks that differed between the state and the index at the last
  ``ragqa verify`` (0 after a repair), whichever process ran it.

Example::

    body = scrape(services)   # bytes in Prometheus' text format
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from ingest.services import state_db
from rag.metrics import DRIFT_META, REGISTRY, GpuMemoryCollector
from rag.services import Services

__all__ = ["scrape", "multiprocess_dir", "StateCollector", "worker_exit"]

FROM_STATE = frozenset({"freshness_lag_seconds", "index_drift_chunks"})


def multiprocess_dir() -> str | None:
    """The multiprocess directory when this process writes its metrics to one, else None."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get("prometheus_multiproc_dir") or None


def worker_exit() -> None:
    """Drop this process's live gauges (in-flight counts) from the server's sums as it exits."""
    path = multiprocess_dir()
    if path and os.path.isdir(path):
        mark_process_dead(os.getpid(), path)


class StateCollector:
    """Freshness and drift, read from the state database when scraped."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def collect(self) -> Iterator[Metric]:
        if self.services.query_state is None:  # an API instance with no state (servers only, none
            return  # shared): the ingesting process's state has these, and this one must not create one
        state = state_db(self.services)
        now = time.time()
        lag = GaugeMetricFamily("freshness_lag_seconds", "Seconds since the newest successful crawl of a "
                                "source (since it was added, when none succeeded yet).", labels=["source"])
        for source in state.sources():
            newest = state.last_success(source.name)
            if newest is None:
                added = state.source_added(source.name)
                newest = added if added is not None else now
            lag.add_metric([source.name], max(0.0, now - newest))
        yield lag
        drift = GaugeMetricFamily("index_drift_chunks", "Chunks that differed between the state database and "
                                  "an index (missing plus extra) at the last verify, per index.", labels=["index"])
        for index, last in sorted(json.loads(state.get_meta(DRIFT_META) or "{}").items()):
            drift.add_metric([index], float(last["chunks"]))
        yield drift


class _Without:
    """Another collector's families but those read from the state (so no name is exported twice)."""

    def __init__(self, collector: Any, names: Iterable[str]) -> None:
        self.collector, self.names = collector, frozenset(names)

    def collect(self) -> Iterator[Metric]:
        for family in self.collector.collect():
            if family.name not in self.names:
                yield family


def scrape(services: Services) -> bytes:
    """The server's metrics in Prometheus' text format (blocking: reads files and SQLite)."""
    registry = CollectorRegistry(auto_describe=False)
    path = multiprocess_dir()
    if path:
        registry.register(_Without(MultiProcessCollector(None, path), FROM_STATE))
        registry.register(GpuMemoryCollector())
    else:
        registry.register(_Without(REGISTRY, FROM_STATE))
    registry.register(StateCollector(services))
    return generate_latest(registry)
