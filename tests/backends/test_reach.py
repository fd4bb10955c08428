"""The bounded check before `ray.init` (backends/_reach.py): a real Ray answers it, a listener that is
not Ray fails it in bounded time (ray.init would retry such an address for minutes)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from autotune.backends._reach import check_reachable
from autotune.errors import ConfigError


def _listener(answer: bytes | None):
    """A TCP server on a free loopback port: accepts, reads what comes, sends `answer` (None: stays silent)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    held = []

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            held.append(conn)
            if answer is not None:
                conn.recv(1024)
                conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return server, f"127.0.0.1:{server.getsockname()[1]}"


@pytest.mark.parametrize("answer", [None, b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
                                    b"\x00\x00\x00\x01\x00\x00\x00\x00\x00"],
                         ids=["silent", "http-1.1", "http2-but-not-settings-first"])
def test_a_listener_that_is_not_ray_fails_in_bounded_time(answer):
    server, address = _listener(answer)
    try:
        started = time.monotonic()
        with pytest.raises(ConfigError, match="does not answer as a Ray cluster") as caught:
            check_reachable(address, timeout_s=1.0)
        assert time.monotonic() - started < 5
        assert "\n" not in str(caught.value)
    finally:
        server.close()


def test_nothing_listening_is_unreachable():
    with pytest.raises(ConfigError, match="cannot reach the Ray cluster"):
        check_reachable("127.0.0.1:1", timeout_s=1.0)


def test_the_sessions_real_ray_answers(ray_session):
    gcs = ray_session.get_runtime_context().gcs_address  # host:port of this session's GCS (gRPC)
    check_reachable(gcs, timeout_s=10.0)  # returns: a real GCS sends HTTP/2's SETTINGS first


def test_with_ray_tls_only_the_connection_is_checked(monkeypatch):
    server, address = _listener(None)
    try:
        monkeypatch.setenv("RAY_USE_TLS", "1")
        check_reachable(address, timeout_s=1.0)  # a TLS server waits for the client's hello: not judged
    finally:
        server.close()
