"""Process helpers shared by the backends that start processes (command, megatron): splitting and
checking a command line, the parent-death signal, killing a process group, the subreaper."""

from __future__ import annotations

import ctypes
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

from autotune.errors import ConfigError

KILL_GRACE_S = 5.0  # SIGTERM first; SIGKILL what is still there after this


def parse_command(command: str | list[str]) -> list[str]:
    try:
        argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    except ValueError as exc:  # an unbalanced quote
        raise ConfigError(f"--command {command!r} cannot be split into arguments: {exc}") from None
    if not argv:
        raise ConfigError("--command is empty")
    return argv


def shell_word(arg: str) -> str:
    """`arg` quoted for a POSIX shell as shlex.quote quotes it; one with an unprintable character (a newline, an
    ESC, a bidi override, an undecodable byte) in bash's $'...' form, its bytes (as the OS gets them: os.fsencode)
    outside printable ASCII escaped as \\xHH, so that a printed command (`--dry-run`) neither reads as two lines
    nor drives the reader's terminal, and pasted into bash, in any locale, it is the same argument (review: a
    \\uXXXX escape is the literal text in the C locale, and an undecodable byte came back as another)."""
    if arg.isprintable():
        return shlex.quote(arg)
    escaped = []
    for byte in os.fsencode(arg):
        ch = chr(byte)
        if ch in "\\'":
            escaped.append("\\" + ch)
        elif 0x20 <= byte < 0x7f:
            escaped.append(ch)
        else:
            escaped.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch, f"\\x{byte:02x}"))
    return "$'" + "".join(escaped) + "'"


def check_command(command: str | list[str]) -> list[str]:
    """The argv, checked to name an executable that exists (ConfigError otherwise)."""
    import shutil

    argv = parse_command(command)
    program = argv[0]
    # a folder is "executable" too (os.access X_OK): only a file can be run
    found = shutil.which(program) if os.sep not in program else \
        (program if os.path.isfile(program) and os.access(program, os.X_OK) else None)
    if not found:
        raise ConfigError(f"--command: {program!r} is not an executable file or a program on PATH")
    return argv


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def kill_group(process: subprocess.Popen, grace_s: float = KILL_GRACE_S) -> None:
    """SIGTERM the child's whole process group, then SIGKILL whatever is left after `grace_s`."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


REAPER = str(Path(__file__).with_name("_reaper.py"))


def reaped_argv(argv: list[str]) -> list[str]:
    """`argv` run under the subreaper, so no descendant of the launcher outlives the trial."""
    return [sys.executable, "-S", REAPER, "--", *argv]


def bounded_lines(stream, limit: int):
    """The lines of a text `stream`, none longer than `limit` characters: the rest of a longer line is read and
    dropped, so a launcher writing gigabytes without a newline costs `limit` characters of memory, not gigabytes
    (found by an adversarial pass: 400 MB on stdout without a newline took ~950 MB in the reader). A cut line
    keeps its first `limit` characters and ends with a newline."""
    while True:
        line = stream.readline(limit)
        if not line:
            return
        if len(line) >= limit and not line.endswith("\n"):
            while True:  # the rest of the overlong line, in pieces of `limit`
                rest = stream.readline(limit)
                if not rest or rest.endswith("\n"):
                    break
            line += "\n"
        yield line
