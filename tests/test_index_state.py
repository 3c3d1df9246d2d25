"""The core reads ingestion's state only through ``rag.types.IndexState``; ``ingest`` supplies it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.services import open_services
from ingest.state import StateDB
from rag.errors import ConfigError
from rag.services import Services
from rag.types import ChangeLog, IndexState
from tests.conftest import make_settings


def test_sqlite_state_is_an_index_state(tmp_path: Path) -> None:
    services = open_services(make_settings(tmp_path / "data"))
    try:
        assert isinstance(services.state, StateDB)
        assert isinstance(services.state, IndexState) and isinstance(services.state, ChangeLog)
        services.state.set_meta("k", "v")
        assert services.state.get_meta("k") == "v" and services.state.get_chunks(["none"]) == {}
        assert (tmp_path / "data" / "state.db").exists()
    finally:
        services.close()


def test_services_without_a_state_say_how_to_get_one(tmp_path: Path) -> None:
    services = Services(make_settings(tmp_path / "data"))
    with pytest.raises(ConfigError, match="open_services"):
        services.state  # noqa: B018 - the property opens it
    assert not (tmp_path / "data" / "state.db").exists()


def test_a_given_state_factory_is_used(tmp_path: Path) -> None:
    opened: list[StateDB] = []

    def factory(settings):
        opened.append(StateDB(Path(settings.data_dir) / "other.db"))
        return opened[-1]

    services = Services(make_settings(tmp_path / "data"), state=factory)
    try:
        assert services.state is opened[0] and services.state is opened[0]  # opened once
    finally:
        services.close()
