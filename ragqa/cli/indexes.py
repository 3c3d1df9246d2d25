"""Commands that check and rebuild the indexes: verify, rebuild."""

from __future__ import annotations

import sys
from typing import Any

import click

from ragqa.cli.common import Context, emit, handle_errors

__all__ = ["verify", "rebuild"]


@click.command()
@click.option("--source", "-s", "source_name", help="Only this source (default: all).")
@click.option("--repair", is_flag=True, help="Fix drift by re-indexing only the affected chunks.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def verify(obj: Context, source_name: str | None, repair: bool, as_json: bool) -> None:
    """Compare the state database with every index: missing, extra and stale chunks.

    Exits 0 when everything agrees (or was repaired), 3 when drift remains.
    """
    from ingest.verify import verify as run

    services = obj.services
    if repair:
        with services.write_lock():
            report = run(services, source_name, repair=True)
    else:
        report = run(services, source_name)
    emit(report.as_dict(), as_json, _verify_text)
    sys.exit(3 if report.drift and not repair else 0)


def _verify_text(d: dict[str, Any]) -> str:
    lines = []
    for row in d["indexes"]:
        state = "ok" if not (row["missing_count"] or row["extra_count"]) else "DRIFT"
        line = (f"{row['source']:20} {row['index']:13} {state:5} missing {row['missing_count']}, "
                f"extra {row['extra_count']}, stale documents {len(row['stale_documents'])}")
        lines.append(line)
    lines.append(f"drift: {d['drift']} chunks" + (f"; repaired {d['repaired']}" if d["repaired"] else ""))
    return "\n".join(lines)


@click.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def rebuild(obj: Context, as_json: bool) -> None:
    """Rebuild every index from the state database into a new generation, then switch.

    Queries keep answering from the old indexes until the new ones are complete; an
    interrupted rebuild leaves the old ones serving. Nothing is crawled or re-embedded
    that the vector cache already has.
    """
    from ingest.rebuild import rebuild as run

    services = obj.services
    with services.write_lock():
        report = run(services, progress=not as_json)
    emit(report.as_dict(), as_json, lambda r: (
        f"rebuilt {', '.join(r['indexes'])}: {r['chunks']} chunks, {r['chunks_embedded']} embedded, "
        f"in {r['seconds']:.1f}s" + (f"; removed leftovers {', '.join(r['removed_orphans'])}"
                                      if r["removed_orphans"] else "")))
