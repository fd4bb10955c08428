"""Run one launcher as a child subreaper and leave nothing of it behind (standard library only).

    python -S _reaper.py -- PROGRAM ARGS...

The reaper marks itself PR_SET_CHILD_SUBREAPER, so a grandchild the launcher orphans (a daemon, a
`setsid` child) is re-parented to the reaper rather than to init. When the launcher exits, or
when the reaper gets SIGTERM (a cancel or a timeout), every remaining descendant gets SIGTERM,
then SIGKILL after a grace period, and is reaped. The exit code is the launcher's (128 + signal
when a signal ended it). stdin, stdout and stderr are the launcher's own (inherited).
Run as a script, not imported: it must start fast and import nothing of autotune.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
GRACE_S = float(os.environ.get("AUTOTUNE_REAPER_GRACE_S", "3"))


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(option, value, 0, 0, 0)
    except OSError:
        pass


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    fields = handle.read().decode(errors="replace").rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == pid and fields[0] not in ("Z", "X"):
                found.append(int(entry))
    return found


def _descendants() -> list[int]:
    found, frontier = [], [os.getpid()]
    while frontier:
        kids = _children(frontier.pop())
        found.extend(kids)
        frontier.extend(kids)
    return found


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def clean_up() -> None:
    """SIGTERM every descendant, SIGKILL the survivors after GRACE_S, reap them all."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _descendants():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + (GRACE_S if sig == signal.SIGTERM else 1.0)
        while time.monotonic() < deadline:
            _reap()
            if not _descendants():
                return
            time.sleep(0.02)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # the backend's runner died: go too
    try:
        # the launcher dies with the reaper too (a SIGKILLed reaper runs no clean-up of its own)
        child = subprocess.Popen(argv, preexec_fn=lambda: _prctl(PR_SET_PDEATHSIG, signal.SIGKILL))
    except OSError as exc:
        sys.stderr.write(f"cannot start {argv[0] if argv else ''!r}: {exc}\n")
        return 127

    def stop(signum, _frame):
        clean_up()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    code = child.wait()
    clean_up()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
