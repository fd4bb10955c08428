"""Checking a file the user names before reading it: one line saying what is wrong with it."""

from __future__ import annotations

from pathlib import Path

from autotune.errors import ConfigError


def require_file(path: str | Path, what: str) -> Path:
    """`path` as a Path when it is a regular file; ConfigError naming `what` otherwise (absent, a
    folder, a device such as /dev/zero that would be read for ever, a name the OS refuses)."""
    path = Path(path)
    try:
        exists, regular = path.exists(), path.is_file()
    except (OSError, ValueError):  # a name too long, a NUL byte
        exists = regular = False
    if not exists:
        raise ConfigError(f"{what} {path} does not exist")
    if not regular:
        kind = "a folder" if path.is_dir() else "not a regular file (a device, a pipe or a socket)"
        raise ConfigError(f"{what} {path} is {kind}")
    return path
