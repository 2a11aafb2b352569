"""A TCP relay on 127.0.0.1 that loses the answer to one request, as a crashing server would.

``LossyRelay(target_port, b"/model-versions/create")`` forwards every connection to the server
on ``target_port``. The first request whose bytes contain the pattern reaches the server, which
acts on it, but its answer never reaches the client: the relay closes that client connection
instead, as when a server is killed after committing and before its answer left. Everything
else passes unchanged. ``lost`` counts the answers it lost.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class LossyRelay:
    """Forward ``127.0.0.1:<port>`` to ``127.0.0.1:<target_port>``, losing one answer."""

    def __init__(self, target_port: int, pattern: bytes) -> None:
        self.target_port = target_port
        self.pattern: bytes | None = pattern
        self.lost = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        """The relay's address, to use in place of the server's."""
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        """Stop accepting connections."""
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            lose = threading.Event()
            threading.Thread(
                target=self._to_server, args=(client, upstream, lose), daemon=True
            ).start()
            threading.Thread(
                target=self._to_client, args=(upstream, client, lose), daemon=True
            ).start()

    def _to_server(
        self, client: socket.socket, upstream: socket.socket, lose: threading.Event
    ) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                with self._lock:
                    if self.pattern is not None and self.pattern in data:
                        self.pattern = None
                        lose.set()
                upstream.sendall(data)
        _close(client, upstream)

    def _to_client(
        self, upstream: socket.socket, client: socket.socket, lose: threading.Event
    ) -> None:
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                if lose.is_set():
                    with self._lock:
                        self.lost += 1
                    break
                client.sendall(data)
        _close(client, upstream)


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()
