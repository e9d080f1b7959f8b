"""A TCP proxy the tests can cut: what a flaky network between the controller and the host looks like."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType

__all__ = ["CuttableProxy"]


class CuttableProxy:
    """Forwards 127.0.0.1:port to a target port; `cut(seconds)` drops every open connection and
    refuses new ones (accepts and closes them at once) for that long."""

    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._down_until = 0.0
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def cut(self, seconds: float) -> None:
        with self._lock:
            self._down_until = time.monotonic() + seconds
            for sock in self._open:
                with _quiet():
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            self._open.clear()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if time.monotonic() < self._down_until:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self._target))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with _quiet():
            while data := source.recv(65536):
                sink.sendall(data)
        with _quiet():
            sink.shutdown(socket.SHUT_WR)

    def __enter__(self) -> CuttableProxy:
        return self

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self._closed = True
        self._listener.close()
        self.cut(0)


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> bool:
        return kind is not None and issubclass(kind, OSError)
