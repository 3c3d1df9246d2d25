"""A TCP proxy on 127.0.0.1 in front of a real server, with a switch for faults.

``pass`` forwards both ways; ``refuse`` closes every connection, open or new (a server that
is down); ``hang`` keeps connections open and forwards nothing (a stopped or stuck server,
like SIGSTOP). The tests put it between ragqa and a real Elasticsearch.

Example::

    with FaultProxy("127.0.0.1", 9200) as proxy:
        settings.lexical.url = proxy.url
        proxy.mode = "hang"
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from typing import Literal

__all__ = ["FaultProxy"]


class FaultProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.mode: Literal["pass", "refuse", "hang"] = "pass"
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name="fault-proxy", daemon=True).start()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set(self, mode: Literal["pass", "refuse", "hang"]) -> None:
        """Switch: open keep-alive connections see the fault too (``hang`` stops forwarding on
        them; ``refuse`` closes them), and leaving ``hang`` closes the connections it held."""
        before, self.mode = self.mode, mode
        if mode == "refuse" or before == "hang":
            self._sever()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self._sever()

    def _sever(self) -> None:
        with self._lock:
            doomed, self._open = self._open, set()
        for sock in doomed:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.mode == "refuse":
                client.close()
                continue
            if self.mode == "hang":
                with self._lock:
                    self._open.add(client)  # accepted, never answered
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, upstream}
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        try:
            while self.mode == "pass" and not self._closed:
                ready, _, _ = select.select([a, b], [], [], 0.1)
                for sock in ready:
                    data = sock.recv(65536)
                    if not data:
                        return
                    peers[sock].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            if self.mode != "hang":
                for sock in (a, b):
                    with self._lock:
                        self._open.discard(sock)
                    sock.close()
