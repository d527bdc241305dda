"""Relays for end-to-end tests: a loopback TCP relay between a real peer and a real broker
that records what crosses it and can break its connections (a link that fails while both
ends live). Everything it starts ends with its ``with`` block.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Any

from polling import wait_for


class TcpRelay:
    """A loopback TCP relay to ``upstream`` (tcp://host:port) that records every byte both
    ways, and whose connections ``cut`` breaks (new ones are relayed again); a context
    manager whose exit closes the sockets and joins the thread."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("tcp://").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen()
        self.address = f"tcp://127.0.0.1:{self.listener.getsockname()[1]}"
        self._recorded = bytearray()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._cut = threading.Event()
        self._down_until = 0.0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "TcpRelay":
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(5.0)
        self.listener.close()
        assert not self._thread.is_alive(), "the relay thread did not stop"

    def captured(self) -> bytes:
        """Everything relayed so far, both directions."""
        with self._lock:
            return bytes(self._recorded)

    def cut(self, down: float = 0.0) -> None:
        """Break every connection relayed now (both ends closed, as a link that fails), and
        for ``down`` seconds close each new one at once (the link stays down)."""
        self._down_until = time.monotonic() + down
        self._cut.set()
        wait_for(lambda: not self._cut.is_set(), 5, "the relay to cut its connections")

    def _run(self) -> None:
        peers: dict[socket.socket, socket.socket] = {}
        try:
            while not self._stop.is_set():
                if self._cut.is_set():
                    for sock in peers:
                        sock.close()
                    peers.clear()
                    self._cut.clear()
                readable, _, _ = select.select([self.listener, *peers], [], [], 0.05)
                for sock in readable:
                    if sock is self.listener:
                        inside, _ = self.listener.accept()
                        if time.monotonic() < self._down_until:
                            inside.close()
                            continue
                        outside = socket.create_connection(self.upstream, timeout=5)
                        inside.settimeout(5)
                        peers[inside], peers[outside] = outside, inside
                        continue
                    if sock not in peers:  # its partner closed it in this round
                        continue
                    try:
                        data = sock.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        other = peers.pop(sock)
                        peers.pop(other, None)
                        sock.close()
                        other.close()
                        continue
                    with self._lock:
                        self._recorded += data
                    peers[sock].sendall(data)
        finally:
            for sock in peers:
                sock.close()
