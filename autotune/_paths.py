"""Checking a file the user names before reading it: one line saying what is wrong with it."""

from __future__ import annotations

from pathlib import Path

from autotune.errors import ConfigError


def shown(text: str) -> str:
    """A name as an error message shows it: on one line (a newline or other unprintable character is
    written as its escape, so a file name cannot fake a second message) and a very long one (a
    300-character model name) shortened."""
    text = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def is_regular_file(path: Path) -> bool:
    """Path.is_file, False for a name the OS refuses (too long, a NUL byte) instead of raising."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def require_file(path: str | Path, what: str) -> Path:
    """`path` as a Path when it is a regular file; ConfigError naming `what` otherwise (absent, a
    folder, a device such as /dev/zero that would be read for ever, a name the OS refuses)."""
    path = Path(path)
    if is_regular_file(path):
        return path
    try:
        exists, folder = path.exists(), path.is_dir()
    except (OSError, ValueError):  # a name too long, a NUL byte
        exists = folder = False
    if not exists:
        raise ConfigError(f"{what} {shown(str(path))} does not exist")
    kind = "a folder" if folder else "not a regular file (a device, a pipe or a socket)"
    raise ConfigError(f"{what} {shown(str(path))} is {kind}")
