"""The small made-up corpus most tests index: notes whose first sentence names a made-up word.

``write_folder(root, range(20), OLD)`` writes notes 0-19 as Markdown files dated ``OLD``;
``doc_text(i)`` is note ``i``'s title and body, and ``question(i)`` its first sentence, which
the extractive answer quotes and cites. The ``indexed`` and ``corpus`` fixtures of
``tests/conftest.py`` index two such folders.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

from ingest.pipeline import reindex
from rag.config import SourceConfig
from rag.services import Services

WORDS = (
    "river", "mountain", "lantern", "copper", "violin", "harbor", "meadow", "glacier",
    "falcon", "orchard", "compass", "thunder", "marble", "velvet", "canyon", "beacon",
    "saddle", "ember", "willow", "quartz", "tundra", "anchor", "cobalt", "prairie", "lagoon",
    "summit", "cedar", "pebble", "walnut", "harvest",
)
OLD = datetime(2024, 3, 1, tzinfo=UTC)
NEW = datetime(2025, 6, 1, tzinfo=UTC)


def doc_text(i: int) -> tuple[str, str]:
    """A title and a body whose first sentence is distinctive (a made-up name in it)."""
    rnd = random.Random(i)
    name = "zor" + chr(97 + i % 26) + chr(97 + i // 26) + "ith"
    sentences = [f"The {name} " + " ".join(rnd.sample(WORDS, 7)) + "."]
    sentences += [" ".join(rnd.sample(WORDS, 9)).capitalize() + "." for _ in range(3)]
    return f"Note {name}", " ".join(sentences)


def write_folder(root: Path, ids: range, when: datetime) -> None:
    root.mkdir(parents=True)
    for i in ids:
        title, body = doc_text(i)
        path = root / f"d{i:02d}.md"
        path.write_text(f"# {title}\n\n{body}\n", encoding="utf-8")
        os.utime(path, (when.timestamp(), when.timestamp()))


def question(i: int) -> str:
    """The first sentence of note ``i``: the extractive answer quotes it and cites it."""
    return doc_text(i)[1].split(".")[0]


def index_notes(services: Services, base: Path, folders: Mapping[str, tuple[range, datetime]], *,
                tenants: bool = False) -> Services:
    """Write each folder's notes under ``base``, register it as a source (its own tenant when
    ``tenants``) and index it fully; every note must be added."""
    for name, (ids, when) in folders.items():
        write_folder(base / name, ids, when)
        services.state.add_source(SourceConfig(name=name, kind="folder", location=str(base / name), lang="en",
                                               tenant=name if tenants else None))
        with services.write_lock():
            assert reindex(services, name, "full").added == len(ids)
    return services
