"""Services with their ingestion state: the :class:`StateDB` of ``state.url``, SQLite in the
data directory by default.

The core's :class:`rag.services.Services` reads the state only through
:class:`rag.types.IndexState` and never builds one; every process that ingests, serves,
evaluates or runs a command opens its services here.

Example::

    services = open_services(Settings.load())
    print(services.state.counts())
    services.close()
"""

from __future__ import annotations

from pathlib import Path

from ingest.leader import write_lease_for
from ingest.state import StateDB
from rag.config import Settings
from rag.services import Services
from rag.types import Embedder, Generator

__all__ = ["open_services", "open_state", "state_db"]


def open_state(settings: Settings) -> StateDB:
    """The state at ``settings.state_url`` (``state.db`` in the data directory unless
    ``state.url`` names a shared database), with the sources the settings file declares added."""
    if settings.state.url is None:  # a shared database needs no data directory
        Path(settings.data_dir).mkdir(parents=True, exist_ok=True)
    state = StateDB(settings.state_url)
    for source in settings.sources:
        state.add_source(source)
    return state


def state_db(services: Services) -> StateDB:
    """``services.state`` as the :class:`StateDB` that :func:`open_services` gave it.

    The core types the state as :class:`rag.types.IndexState`, the little it reads; ingestion,
    the server and the evals also list sources, record runs and save documents.
    """
    state = services.state
    if not isinstance(state, StateDB):
        raise TypeError(f"these services' state is a {type(state).__name__}, not the StateDB of open_services")
    return state


def open_services(settings: Settings, embedder: Embedder | None = None,
                  generator: Generator | None = None) -> Services:
    """``Services`` for ``settings`` whose ``state`` is the :class:`StateDB` at ``state.url``
    (the data directory's by default), and whose write lock also holds the shared state's
    (an advisory lock on PostgreSQL), so two instances never reindex at once."""
    return Services(settings, embedder=embedder, generator=generator, state=open_state,
                    shared_lock=lambda s: write_lease_for(s.state_url))
