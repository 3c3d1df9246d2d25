"""``ragqa keys``: API keys for ``ragqa serve``; the settings hold only their hashes.

Example::

    ragqa keys create --scope query --tenant acme --id acme-web   # the key once, then its settings entry
    ragqa keys hash -                                             # the hash of a key read from stdin
"""

from __future__ import annotations

import json
import sys

import click
import yaml
from pydantic import ValidationError

__all__ = ["keys_group"]


@click.group("keys")
def keys_group() -> None:
    """API keys of the HTTP service (serve.api_keys holds their hashes, never the keys)."""


@keys_group.command("create")
@click.option("--scope", "-s", type=click.Choice(["query", "admin"]), default="query", show_default=True,
              help="query: ask and chat; admin: also reindex and inspect documents.")
@click.option("--tenant", "-t", help="Bind the key to a tenant: it only ever retrieves that tenant's documents.")
@click.option("--id", "key_id", help="The key's name in settings and logs (default: <tenant or scope>-<6 hex>).")
@click.option("--rate-limit", type=click.IntRange(0),
              help="Requests per minute (default: serve.rate_limit_per_minute).")
@click.option("--json", "as_json", is_flag=True, help="Print the key and its settings entry as one JSON object.")
def create(scope: str, tenant: str | None, key_id: str | None, rate_limit: int | None, as_json: bool) -> None:
    """Make a new random key; print it (only this once) and the settings entry with its hash."""
    import secrets

    from rag.config import ApiKeySettings
    from serve.auth import hash_key, new_key

    key = new_key()
    try:
        entry = ApiKeySettings(id=key_id or f"{tenant or scope}-{secrets.token_hex(3)}", hash=hash_key(key),
                               scopes=(scope,), tenant=tenant, rate_limit_per_minute=rate_limit)
    except ValidationError as exc:
        raise click.UsageError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
    data = entry.model_dump(mode="json", exclude_none=True)
    if as_json:
        click.echo(json.dumps({"key": key, "settings": data}))
        return
    snippet = yaml.safe_dump({"serve": {"api_keys": [data]}}, sort_keys=False, default_flow_style=None)
    click.echo(key)
    click.echo(f"\n# The key above is shown only this once. Add its entry to the settings file:\n{snippet}"
               f"# or in the environment (RAG_SERVE__API_KEYS holds the whole list):\n"
               f"# RAG_SERVE__API_KEYS='{json.dumps([data])}'")


@keys_group.command("hash")
@click.argument("key")
def hash_cmd(key: str) -> None:
    """Print the settings hash of KEY ('-' reads it from stdin, keeping it out of the shell history)."""
    from serve.auth import MIN_KEY_CHARS, hash_key

    if key == "-":
        key = sys.stdin.readline()
    key = key.strip()
    if len(key) < MIN_KEY_CHARS:
        raise click.UsageError(f"a key needs at least {MIN_KEY_CHARS} random characters (keys are hashed with a "
                               "fast hash, which only long random keys make safe); `ragqa keys create` makes one")
    click.echo(hash_key(key))
