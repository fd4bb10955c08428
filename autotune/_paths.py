"""Checking a file the user names before reading it: one line saying what is wrong with it."""

from __future__ import annotations

from pathlib import Path

from autotune.errors import ConfigError


def shown(text: str) -> str:
    """A name as an error message shows it: on one line (a newline or other unprintable character is
    written as its escape, so a file name cannot fake a second message) and a very long one (a
    300-character model name) shortened."""
    text = one_line(text)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text)} characters)"


def one_line(text: str) -> str:
    """A message (which may quote names) on one line, every unprintable character as its escape, not shortened."""
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


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


def with_absolute_workdir(options: dict) -> dict:
    """`options` with a relative `workdir` made absolute against the current folder: stored relative, it
    meant the folder `start` ran in, which the trials, a later `resume` and the dashboard (it serves
    artifacts from the run folder) would each read against their own. ConfigError (one line) when the
    current folder cannot be read (deleted under the shell)."""
    workdir = options.get("workdir")
    if not (isinstance(workdir, str) and workdir.strip()) or Path(workdir).is_absolute():
        return options
    try:
        return {**options, "workdir": str(Path(workdir).absolute())}
    except OSError as exc:
        raise ConfigError(f"--workdir {workdir!r}: a relative folder, and the current folder cannot be read "
                          f"({exc.strerror or exc}): give an absolute one") from None
