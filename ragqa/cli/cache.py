"""The answer cache: ``ragqa cache stats`` and ``ragqa cache purge``."""

from __future__ import annotations

from typing import Any

import click

from rag.errors import ConfigError
from ragqa.cli.common import Context, emit, handle_errors

__all__ = ["cache_group"]


@click.group("cache")
def cache_group() -> None:
    """Inspect and empty the answer cache.

    Cached answers are dropped by themselves when a reindex changes a passage they were built
    from, and checked again when their sources gain documents; these commands are for the rest.
    With cache.backend memory the answers live in each serving process (GET /v1/cache on the
    server shows them); a purge is logged in the state database and applied by every server
    on this data directory at its next question.
    """


@cache_group.command("stats")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_obj
@handle_errors
def stats(obj: Context, as_json: bool) -> None:
    """Entries, lookups by result, rechecks, answers dropped, memory; and the change log."""
    from rag.cache import make_store

    services = obj.services
    backend = services.settings.cache.backend
    out: dict[str, Any] = {"backend": backend, "changes": services.state.change_summary()}
    if backend == "redis":
        store = make_store(services)
        try:
            out.update(store.stats())  # type: ignore[union-attr]
        finally:
            store.close()  # type: ignore[union-attr]
    elif backend == "memory":
        out["note"] = "the answers live in each serving process: GET /v1/cache on the server"
    emit(out, as_json, _stats_text)


def _stats_text(d: dict[str, Any]) -> str:
    lines = [f"backend: {d['backend']}"]
    if "entries" in d:
        lookups = ", ".join(f"{k} {v}" for k, v in d["lookups"].items())
        rechecks = ", ".join(f"{k} {v}" for k, v in d["rechecks"].items())
        lines += [f"entries: {d['entries']} ({d['bytes'] / 1e6:.1f} MB)", f"lookups: {lookups}",
                  f"rechecks after new documents: {rechecks}", f"answers dropped by changes: {d['dropped']}"]
    if "note" in d:
        lines.append(d["note"])
    c = d["changes"]
    lines.append(f"change log: last #{c['last_change']}; in the last {c['window_s'] / 3600:g} h "
                 f"{c['documents_changed']} documents changed ({c['chunks_removed']} passages removed, "
                 f"{c['chunks_added']} added), {c['purges']} purges")
    return "\n".join(lines)


@cache_group.command("purge")
@click.option("--source", "-s", "source_name", help="Drop the answers built from this source.")
@click.option("--all", "everything", is_flag=True, help="Drop every cached answer.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.pass_obj
@handle_errors
def purge(obj: Context, source_name: str | None, everything: bool, as_json: bool) -> None:
    """Drop cached answers: those built from one source (--source), or all (--all).

    Answers that the source's new documents might change are checked again on their next hit.
    """
    from rag.cache import push_changes

    if bool(source_name) == everything:
        raise ConfigError("give one of --source NAME or --all")
    services = obj.services
    if source_name:
        services.state.source(source_name)  # an unknown name is an error, with the known ones
    seq = services.state.log_purge(source_name)
    out = {"purged": source_name or "all", "change": seq, "backend": services.settings.cache.backend,
           "dropped": push_changes(services) if services.settings.cache.backend == "redis" else None}
    emit(out, as_json, _purge_text)


def _purge_text(d: dict[str, Any]) -> str:
    what = "every cached answer" if d["purged"] == "all" else f"the answers built from {d['purged']}"
    if d["dropped"] is None:
        return f"purge of {what} logged (#{d['change']}); each server applies it at its next question"
    return f"dropped {d['dropped']} answers: {what}"
