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


@pytest.mark.parametrize("address,expected", [
    ("ray://[::1]", ("::1", 10001)), ("[::1]:6379", ("::1", 6379)), ("ray://head", ("head", 10001)),
    (":6379", ("127.0.0.1", 6379)), ("garbage", None)])
def test_split_address(address, expected):
    from autotune.backends._reach import split_address

    assert split_address(address) == expected


@pytest.mark.parametrize("address,needle", [
    ("127.0.0.1:\u00b2", "the port must be a number"),  # '²' is a digit to str.isdigit, not to int()
    ("127.0.0.1:\u0661\u0666", "the port must be a number"),
    ("a..b:6379", "cannot reach the Ray cluster"),  # IDNA refuses the empty label (UnicodeError)
    ("bad\nhost:6379", "cannot reach the Ray cluster at 'bad\\nhost:6379'"),
])
def test_addresses_that_cannot_be_dialled_are_one_line_errors(address, needle):
    with pytest.raises(ConfigError) as caught:
        check_reachable(address, timeout_s=2.0)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_a_listener_that_hangs_up_on_the_preface_does_not_answer_as_ray():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)

    def reset():
        conn, _ = server.accept()
        conn.recv(1024)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
        conn.close()

    threading.Thread(target=reset, daemon=True).start()
    try:
        with pytest.raises(ConfigError, match="does not answer as a Ray cluster"):
            check_reachable(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=2.0)
    finally:
        server.close()


def _full_listener():
    """A loopback address that drops connection attempts: a listener with a full accept queue (Linux
    drops the SYN), as a filtered route of a dual-stack head node does."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    fill = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(server.getsockname())
        except BlockingIOError:
            pass
        fill.append(s)
    time.sleep(0.2)
    return server, fill


def test_a_host_whose_first_address_drops_packets_is_reached_by_its_next(monkeypatch):
    """Each address gets its share of the budget, and one this machine cannot dial (an address family
    it lacks) is skipped: the cluster answers on the host's last address."""
    good, _ = _listener(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # SETTINGS first, as gRPC
    black, fill = _full_listener()
    try:
        tcp = (socket.SOCK_STREAM, 6, "")
        addresses = [(socket.AF_UNIX, *tcp, ("127.0.0.1", 1)),  # socket() itself fails: not TCP's family
                     (socket.AF_INET, *tcp, black.getsockname()),
                     (socket.AF_INET, *tcp, good.getsockname())]
        monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: addresses)
        started = time.monotonic()
        check_reachable("head.example:6379", timeout_s=3.0)
        assert time.monotonic() - started < 3.0
    finally:
        for s in (good, black, *fill):
            s.close()


def test_a_name_lookup_that_hangs_is_bounded_by_the_budget(monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: time.sleep(30))
    started = time.monotonic()
    with pytest.raises(ConfigError, match="cannot reach the Ray cluster.*name lookup timed out"):
        check_reachable("slow.example:6379", timeout_s=1.0)
    assert time.monotonic() - started < 3


def test_a_resolver_that_raises_something_else_is_one_line(monkeypatch):
    def broken(*a, **k):
        raise ValueError("resolver bug")

    monkeypatch.setattr(socket, "getaddrinfo", broken)
    with pytest.raises(ConfigError, match="cannot reach the Ray cluster.*name lookup failed: ValueError"):
        check_reachable("odd.example:6379", timeout_s=1.0)
