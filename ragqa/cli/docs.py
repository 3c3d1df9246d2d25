"""``docs/cli.md``, written from the commands' own ``--help``, so the two cannot drift.

    python -m ragqa.cli.docs > docs/cli.md

``tests/test_cli.py`` checks that the committed file is what this prints.
"""

from __future__ import annotations

from collections.abc import Iterator

import click

__all__ = ["render"]

WIDTH = 100

HEADER = """# Command line

Every command accepts `--help`; this page is that help, for every command
(`python -m ragqa.cli.docs > docs/cli.md` writes it, and a test checks that it is current).
"""

FOOTER = """## Output and errors

With `--json`, `reindex` prints one object per source with the keys `source`, `mode`,
`fetched`, `unchanged`, `changed`, `added`, `deleted`, `failed`, `chunks_embedded` and
`seconds`, among others.

Errors are one line on standard error and a non-zero exit status: an unknown source, an
unreachable URL, a bad configuration, or a data directory locked by another ragqa process.
`reindex` exits with status 2 when some pages failed to fetch; the report says which.
"""


def _commands(group: click.Group, ctx: click.Context) -> Iterator[tuple[click.Command, click.Context]]:
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        sub = click.Context(command, info_name=name, parent=ctx, terminal_width=WIDTH, max_content_width=WIDTH)
        yield command, sub
        if isinstance(command, click.Group):
            yield from _commands(command, sub)


def render() -> str:
    """The whole of ``docs/cli.md``."""
    from ragqa.cli import cli

    settings = {**cli.context_settings, "terminal_width": WIDTH, "max_content_width": WIDTH}
    root = click.Context(cli, info_name="ragqa", **settings)
    parts = [HEADER, f"## `ragqa`\n\n```text\n{cli.get_help(root)}\n```\n"]
    for command, ctx in _commands(cli, root):
        parts.append(f"## `{ctx.command_path}`\n\n```text\n{command.get_help(ctx)}\n```\n")
    parts.append(FOOTER)
    return "\n".join(parts)


if __name__ == "__main__":
    click.echo(render(), nl=False)
