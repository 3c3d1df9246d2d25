"""API keys: who is calling, with which scopes and tenant, and whether it may start at all.

A request names its key with ``Authorization: Bearer <key>`` (what OpenAI's clients send)
or ``X-API-Key: <key>``. The settings hold only each key's hash (``serve.api_keys``), with
an id, scopes (``query``; ``admin``, which implies ``query``), an optional tenant and an
optional rate limit. ``ragqa keys create`` makes a key and prints its settings entry.

- No key, or an unknown one: 401 with ``WWW-Authenticate: Bearer``. A key without the
  route's scope: 403.
- A tenant-bound key retrieves only its tenant's documents; a request that names another
  tenant in its filters is a 403 rather than quietly answered from the key's own tenant
  (:meth:`serve.deps.Caller.restrict`). Streams and conversations belong to the key that
  started them: another key cannot resume or continue them.
- Auth is off only when ``serve.auth`` is false, and then only on a loopback host unless
  ``serve.allow_insecure_public`` (``ragqa serve --allow-insecure``) says otherwise.

Why SHA-256 and not scrypt or argon2: the keys are 256 random bits, so a fast hash cannot be
brute-forced, while a slow password hash would cost tens of milliseconds of CPU on every
request (and hand anyone a cheap way to load the server). Slow hashes protect guessable
passwords; these are not, and ``ragqa keys hash`` refuses short ones. Hashes are compared
with :func:`hmac.compare_digest`, against every configured key.

Example::

    gate = Gate(settings.serve)
    caller = await gate.caller(request, "admin")   # raises Unauthorized, Forbidden or RateLimited
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import secrets

from fastapi import Request

from rag.config import ApiKeySettings, ServeSettings
from rag.errors import ConfigError
from serve.deps import Caller
from serve.errors import Forbidden, Unauthorized
from serve.ratelimit import RateLimiter

__all__ = ["Gate", "new_key", "hash_key", "is_loopback", "check_exposure", "KEY_PREFIX", "MIN_KEY_CHARS"]

log = logging.getLogger("ragqa.serve")

KEY_PREFIX = "rqa_"  # lets secret scanners and people recognise a leaked key
MIN_KEY_CHARS = 32
_CHALLENGE = 'Bearer realm="ragqa"'


def new_key() -> str:
    """A new random API key: ``rqa_`` and 43 URL-safe characters (256 bits)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """What the settings store for ``key``: ``sha256:<hex>``."""
    return "sha256:" + hashlib.sha256(key.encode("utf-8")).hexdigest()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # another host name: it may resolve to anything


def check_exposure(serve: ServeSettings, host: str | None = None) -> None:
    """Refuse to serve without auth on a non-loopback ``host`` (default ``serve.host``) unless forced."""
    host = serve.host if host is None else host
    if not serve.auth and not serve.allow_insecure_public and not is_loopback(host):
        raise ConfigError(
            f"refusing to serve on {host} with auth off (serve.auth: false): anyone who reaches it could "
            "query and reindex; add serve.api_keys (ragqa keys create), listen on 127.0.0.1, or force it "
            "with --allow-insecure (serve.allow_insecure_public)")


def _presented(request: Request) -> str | None:
    authorization = request.headers.get("authorization")
    if authorization:
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = request.headers.get("x-api-key")
    return key.strip() if key and key.strip() else None


class Gate:
    """Turns a request into a :class:`~serve.deps.Caller`: its key, its scope, then its rate limit.

    With ``serve.auth`` off every request is the anonymous caller with every scope, rate
    limited per client address.
    """

    def __init__(self, serve: ServeSettings, limiter: RateLimiter | None = None) -> None:
        self.serve = serve
        self.limiter = limiter or RateLimiter(serve.rate_limit_storage or serve.redis_url or "memory://")
        self._keys = [(bytes.fromhex(k.hash.removeprefix("sha256:")), k) for k in serve.api_keys]
        if serve.auth and not self._keys:
            log.warning("auth is on and serve.api_keys is empty: every API request gets a 401; "
                        "create a key with `ragqa keys create`, or set serve.auth: false on loopback")

    async def aclose(self) -> None:
        await self.limiter.aclose()

    def _lookup(self, key: str) -> ApiKeySettings | None:
        digest = hashlib.sha256(key.encode("utf-8")).digest()
        found = None
        for stored, settings in self._keys:  # no early exit: every key is compared
            if hmac.compare_digest(stored, digest):
                found = settings
        return found

    async def caller(self, request: Request, scope: str) -> Caller:
        if not self.serve.auth:
            address = request.client.host if request.client else "unknown"
            await self.limiter.check(f"ip:{address}", self.serve.rate_limit_per_minute)
            return Caller()
        key = _presented(request)
        if key is None:
            raise Unauthorized("no API key: send it as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
                               "missing_api_key", {"WWW-Authenticate": _CHALLENGE})
        found = self._lookup(key)
        if found is None:
            raise Unauthorized("invalid API key; keys are made with `ragqa keys create`",
                               "invalid_api_key", {"WWW-Authenticate": f'{_CHALLENGE}, error="invalid_token"'})
        scopes = frozenset(found.scopes) | ({"query"} if "admin" in found.scopes else set())
        if scope not in scopes:
            raise Forbidden(f"API key {found.id!r} lacks the {scope!r} scope this route needs",
                            "insufficient_scope",
                            {"WWW-Authenticate": f'{_CHALLENGE}, error="insufficient_scope", scope="{scope}"'})
        limit = self.serve.rate_limit_per_minute if found.rate_limit_per_minute is None else found.rate_limit_per_minute
        await self.limiter.check(f"key:{found.id}", limit)
        return Caller(key_id=found.id, tenant=found.tenant, scopes=scopes)
