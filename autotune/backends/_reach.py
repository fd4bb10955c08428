"""Is a Ray cluster there? A bounded check before `ray.init`, which retries for minutes otherwise."""

from __future__ import annotations

import socket
import threading
import time

from autotune.errors import ConfigError

CONNECT_TIMEOUT_S = 10.0
HANDSHAKE_FLOOR_S = 2.0  # what the gRPC answer gets even when connecting took the whole budget
RAY_CLIENT_PORT = 10001  # Ray Client's port when a ray:// address names none


def split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of a `host:port`, `[v6]:port` or `ray://host[:port]` address; None for `auto`,
    `local` or another bare word (left to `ray.init`, which says what it makes of it)."""
    text = address.removeprefix("ray://")
    bracketed = text.startswith("[") and text.endswith("]")  # an IPv6 host without a port
    host, sep, port = text.rpartition(":")
    if not sep or bracketed:
        # `ray://host` is Ray Client's default port; a bare word other than auto/local is no address
        return (text.strip("[]"), RAY_CLIENT_PORT) if address.startswith("ray://") and text else None
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ConfigError(f"--ray-address {address!r}: the port must be a number in 1..65535")
    return host.strip("[]") or "127.0.0.1", int(port)


# What a gRPC server (Ray's GCS, Ray Client's server) answers first: an HTTP/2 SETTINGS frame (RFC 9113,
# section 3.4: the server's connection preface). A listener that is not gRPC (a web server, a database, a
# port that accepts and stays silent) never sends one, and `ray.init` would retry it for minutes.
HTTP2_CLIENT_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
HTTP2_SETTINGS = 4  # the frame type byte (offset 3 of the 9-byte frame header)


def _resolve(target: tuple[str, int], deadline: float) -> list:
    """getaddrinfo within the budget: a resolver that retries for longer is not waited for (the lookup
    goes on in a daemon thread, which the process does not wait for)."""
    found: dict = {}

    def lookup() -> None:
        try:
            found["infos"] = socket.getaddrinfo(*target, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:  # unknown host; IDNA refuses a name like a..b
            found["error"] = exc
        except Exception as exc:  # anything else the resolver raises is still one line, not a thread's traceback
            found["error"] = OSError(f"the name lookup failed: {exc.__class__.__name__}")

    worker = threading.Thread(target=lookup, daemon=True)
    worker.start()
    worker.join(max(0.0, deadline - time.monotonic()))
    if worker.is_alive():
        raise TimeoutError("the name lookup timed out")
    if "infos" not in found:
        raise found.get("error") or OSError("the name lookup failed")
    return found["infos"]


def _connect(target: tuple[str, int], deadline: float) -> socket.socket:
    """A connection to the first of the host's addresses that accepts before `deadline`. Each address
    gets an equal share of what is left (the last one all of it), so a dual-stack host whose first
    address drops packets still has time for the next (socket.create_connection gives every address
    the whole timeout); an address this machine cannot even dial (no IPv6) is skipped."""
    error: OSError = TimeoutError("timed out")
    infos = _resolve(target, deadline)
    for k, (family, kind, proto, _, sockaddr) in enumerate(infos):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            conn = socket.socket(family, kind, proto)
        except OSError as exc:
            error = exc
            continue
        try:
            conn.settimeout(left / (len(infos) - k))
            conn.connect(sockaddr)
            return conn
        except OSError as exc:
            error = exc
            conn.close()
    raise error


def _first_frame_header(conn: socket.socket, deadline: float) -> bytes:
    """The first 9 bytes the server sends after HTTP/2's client preface (fewer: it closed or stayed silent)."""
    conn.settimeout(max(0.01, deadline - time.monotonic()))
    conn.sendall(HTTP2_CLIENT_PREFACE)
    head = b""
    while len(head) < 9:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        conn.settimeout(left)
        try:
            chunk = conn.recv(9 - len(head))
        except socket.timeout:
            break
        if not chunk:  # closed: whatever listens there hung up on an HTTP/2 client
            break
        head += chunk
    return head


def check_reachable(address: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """ConfigError (one line) when nothing at the Ray address answers as a gRPC server within about
    `timeout_s` (the answer gets at least HANDSHAKE_FLOOR_S after a slow connect): nothing listens, or
    what listens is not Ray (it never sends HTTP/2's SETTINGS). With Ray's TLS on (RAY_USE_TLS) the
    handshake is TLS first, so only the connection is checked."""
    import os

    if not address or address in ("auto", "local"):
        return
    target = split_address(address)
    if target is None:
        return
    deadline = time.monotonic() + timeout_s
    try:
        conn = _connect(target, deadline)
    except (OSError, UnicodeError) as exc:  # refused, timed out, unknown host; IDNA refuses a name like a..b
        reason = getattr(exc, "strerror", None) or str(exc) or exc.__class__.__name__
        raise ConfigError(f"cannot reach the Ray cluster at {address!r} within {timeout_s:g} s: "
                          f"{reason.splitlines()[0][:200]}") from None
    with conn:
        if os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true", "yes"):
            return
        try:
            head = _first_frame_header(conn, max(deadline, time.monotonic() + HANDSHAKE_FLOOR_S))
        except OSError:  # reset or broken pipe: something listens there and hung up on gRPC
            head = b""
    if len(head) < 9 or head[3] != HTTP2_SETTINGS:
        raise ConfigError(f"what listens at {address!r} does not answer as a Ray cluster within {timeout_s:g} s "
                          "(no gRPC); give Ray's GCS address (head node, port 6379 by default) or ray://host:10001")
