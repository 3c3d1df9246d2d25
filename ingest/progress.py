"""Progress of a running reindex that a person can read: pages and chunks done, chunks/s, an ETA.

The pipeline updates a :class:`RunProgress` as it goes. It shows on stderr as a tqdm bar
(``ragqa ingest`` and ``ragqa reindex`` on a terminal), and every two seconds it is written
to the run's row in the state, where ``ragqa status`` and ``GET /v1/sources`` read it while
the run lasts.

The ETA is the pages still to read times the seconds per page so far (embedding included,
which is most of it). The total is what the source says it will read: a folder's files once
listed, a sitemap's pages once read, or for a site the pages found so far (``total_grows``:
the ETA is then a lower bound, and says so). With no total, there is no ETA, only the rates.

Example::

    progress = RunProgress("docs", "full")
    progress.page(total=526, grows=False)
    progress.embedded(128)
    progress.as_dict()  # {"pages": 1, "total": 526, "chunks_embedded": 128, "eta_s": ..., ...}
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RunProgress", "describe"]

_MIN_PAGES_FOR_ETA = 3


@dataclass
class RunProgress:
    source: str
    mode: str
    pages: int = 0
    total: int | None = None
    total_grows: bool = False
    chunks_embedded: int = 0
    started: float = field(default_factory=time.monotonic)

    def page(self, total: int | None = None, grows: bool = False) -> None:
        self.pages += 1
        if total is not None:
            self.total, self.total_grows = max(total, self.pages), grows

    def embedded(self, chunks: int) -> None:
        self.chunks_embedded += chunks

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def chunks_per_s(self) -> float:
        return self.chunks_embedded / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        if self.total is None or self.pages < _MIN_PAGES_FOR_ETA:
            return None
        return max(0, self.total - self.pages) * self.elapsed_s / self.pages

    def as_dict(self) -> dict[str, Any]:
        eta = self.eta_s
        return {"mode": self.mode, "pages": self.pages, "total": self.total, "total_grows": self.total_grows,
                "chunks_embedded": self.chunks_embedded, "chunks_per_s": round(self.chunks_per_s, 1),
                "elapsed_s": round(self.elapsed_s, 1), "eta_s": None if eta is None else round(eta, 1)}

    def postfix(self) -> str:
        """What the tqdm bar shows after its own counts."""
        eta = self.eta_s
        text = f"{self.chunks_embedded} chunks, {self.chunks_per_s:.1f} chunks/s"
        if eta is not None:
            text += f", ETA {'at least ' if self.total_grows else ''}{_duration(eta)}"
        return text


def describe(progress: dict[str, Any]) -> str:
    """One line for ``ragqa status``: ``running (full): 120/526 pages, 3400 chunks at 24.0/s, ETA 2m10s``."""
    total = progress.get("total")
    pages = f"{progress['pages']}/{total}{'+' if progress.get('total_grows') else ''}" if total else str(
        progress["pages"])
    line = (f"running ({progress['mode']}): {pages} pages, {progress['chunks_embedded']} chunks at "
            f"{progress['chunks_per_s']:.1f}/s, {_duration(progress['elapsed_s'])} so far")
    if progress.get("eta_s") is not None:
        line += f", ETA {'at least ' if progress.get('total_grows') else ''}{_duration(progress['eta_s'])}"
    return line


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
