"""Is a Ray cluster there? A bounded check before `ray.init`, which retries for minutes otherwise."""

from __future__ import annotations

import socket

from autotune.errors import ConfigError

CONNECT_TIMEOUT_S = 10.0
RAY_CLIENT_PORT = 10001  # Ray Client's port when a ray:// address names none


def split_address(address: str) -> tuple[str, int] | None:
    """(host, port) of a `host:port` or `ray://host:port` address; None for `auto` / `local`."""
    text = address.removeprefix("ray://")
    host, sep, port = text.rpartition(":")
    if not sep:
        # `ray://host` is Ray Client's default port; a bare word other than auto/local is no address
        return (text, RAY_CLIENT_PORT) if address.startswith("ray://") and text else None
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--ray-address {address!r}: the port must be a number in 1..65535")
    return host.strip("[]") or "127.0.0.1", int(port)


def check_reachable(address: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """ConfigError (one line) when nothing listens at the Ray address within `timeout_s`."""
    if not address or address in ("auto", "local"):
        return
    target = split_address(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout_s):
            return
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise ConfigError(f"cannot reach the Ray cluster at {address} within {timeout_s:g} s: {reason}") from None
