"""Pieces every ragqa command shares: lazy services, one-line errors, output."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from functools import wraps
from typing import Any

import click

from rag.errors import RagError

__all__ = ["Context", "handle_errors", "fail", "emit"]


class Context:
    def __init__(self, config: str | None, data_dir: str | None, log_json: bool, verbose: int) -> None:
        self.config, self.data_dir, self.log_json, self.verbose = config, data_dir, log_json, verbose
        self._services: Any = None

    @property
    def services(self):
        if self._services is None:
            from ingest.services import open_services
            from rag.config import Settings
            from rag.logs import setup_logging

            settings = Settings.load(self.config, **self.overrides())
            setup_logging(json_logs=settings.log_json, verbose=self.verbose)
            self._services = open_services(settings)
        return self._services

    def overrides(self) -> dict[str, Any]:
        """The settings the global options give: ``--data-dir`` and ``--log-json``."""
        out: dict[str, Any] = {}
        if self.data_dir:
            out["data_dir"] = self.data_dir
        if self.log_json:
            out["log_json"] = True
        return out

    def close(self) -> None:
        if self._services is not None:
            self._services.close()


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RagError as exc:
            fail(str(exc))
        except click.ClickException:  # usage errors keep click's own message and exit code
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)
        except Exception as exc:  # a bug: still one line, with a way to get the traceback
            if os.environ.get("RAG_DEBUG"):
                raise
            fail(f"unexpected {type(exc).__name__}: {exc} (set RAG_DEBUG=1 for a traceback)")
    return wrapper


def fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(1)


def emit(data: Any, as_json: bool, text: Callable[[Any], str]) -> None:
    if as_json:
        click.echo(json.dumps(data, ensure_ascii=False, default=str))
    else:
        click.echo(text(data))


