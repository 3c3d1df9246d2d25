"""Logging set-up: readable lines by default, JSON lines on request (``RAG_LOG_JSON=1``)."""

from __future__ import annotations

import logging
import sys

__all__ = ["setup_logging"]


def setup_logging(json_logs: bool = False, verbose: int = 0) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    if json_logs:
        from pythonjsonlogger.json import JsonFormatter

        handler.setFormatter(JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        ))
        level = min(level, logging.INFO)
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("ragqa")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False
    logging.getLogger("apscheduler").setLevel(logging.WARNING if verbose < 2 else logging.DEBUG)
