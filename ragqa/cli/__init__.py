"""The ``ragqa`` command line.

Every command takes ``--config FILE`` (or ``RAG_CONFIG``) and ``--data-dir DIR`` (or
``RAG_DATA_DIR``). Errors print one line on stderr and exit non-zero; progress goes to
stderr, results to stdout (``--json`` for machines).

Example::

    ragqa ingest ./docs --name docs --trust high
    ragqa reindex --mode incremental --json
    ragqa search "how do I verify certificates" --k 5
"""

from __future__ import annotations

import click

from ragqa.cli.cache import cache_group
from ragqa.cli.common import Context
from ragqa.cli.evals import eval_group
from ragqa.cli.experiment import experiment_group
from ragqa.cli.indexes import rebuild, verify
from ragqa.cli.keys import keys_group
from ragqa.cli.search import search
from ragqa.cli.serve import ask, serve
from ragqa.cli.sources import ingest, reindex, schedule, sources_cmd, status

__all__ = ["main", "cli"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--config", "-c", envvar="RAG_CONFIG", type=click.Path(dir_okay=False),
              help="YAML settings file (env RAG_CONFIG).")
@click.option("--data-dir", "-d", envvar="RAG_DATA_DIR", type=click.Path(file_okay=False),
              help="Where all state lives (env RAG_DATA_DIR, default ./.ragqa).")
@click.option("--log-json", is_flag=True, help="Log JSON lines on stderr (env RAG_LOG_JSON).")
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
@click.version_option(package_name="ragqa")
@click.pass_context
def cli(ctx: click.Context, config: str | None, data_dir: str | None, log_json: bool, verbose: int) -> None:
    """ragqa: retrieval-augmented question answering over your documents, with citations.

    Register a folder, web site, sitemap or feed with `ingest`; `reindex` and `schedule`
    keep it fresh, re-embedding only what changed; `search` checks what is indexed.
    """
    ctx.obj = Context(config, data_dir, log_json, verbose)
    ctx.call_on_close(ctx.obj.close)


for command in (ingest, reindex, status, schedule, search, sources_cmd, verify, rebuild, eval_group, serve, ask,
                keys_group, cache_group, experiment_group):
    cli.add_command(command)


def main() -> None:
    cli(prog_name="ragqa")
