"""One ``redis.asyncio`` client per running event loop, made on first use.

asyncio connections belong to the loop that opened them, and a server process can run
several loops (uvicorn's, a test's, ``asyncio.run`` in a thread), so a component that talks
to Redis from async code keeps a client per loop, with the Lua scripts it registered.

Example::

    redis = LoopClients("redis://127.0.0.1:6379/0", scripts={"acquire": LUA}, socket_timeout=0.5)
    await redis.client().ping()
    await redis.script("acquire")(keys=[...], args=[...])
    await redis.aclose()   # this loop's connections, at shutdown
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping
from typing import Any

__all__ = ["LoopClients"]


class LoopClients:
    def __init__(self, url: str, *, scripts: Mapping[str, str] | None = None, **options: Any) -> None:
        self.url = url
        self._scripts = dict(scripts or {})
        self._options = options
        self._found: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Any, dict[str, Any]]] = (
            weakref.WeakKeyDictionary())

    def _for_loop(self) -> tuple[Any, dict[str, Any]]:
        loop = asyncio.get_running_loop()
        found = self._found.get(loop)
        if found is None:
            import redis.asyncio as aioredis

            client = aioredis.from_url(self.url, **self._options)
            found = self._found[loop] = (client, {name: client.register_script(src)
                                                  for name, src in self._scripts.items()})
        return found

    def client(self) -> Any:
        return self._for_loop()[0]

    def script(self, name: str) -> Any:
        return self._for_loop()[1][name]

    async def aclose(self) -> None:
        """Close this event loop's client (at shutdown)."""
        found = self._found.pop(asyncio.get_running_loop(), None)
        if found is not None:
            await found[0].aclose()
