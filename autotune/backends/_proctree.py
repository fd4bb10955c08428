"""A trial's whole process tree, found and killed when the trial ends (Linux /proc).

A launcher's process group is not enough: a child may `setsid` out of it, or ignore SIGTERM and
outlive its parent. Two marks find such processes:
- the reaper (`_reaper.py`) runs the launcher as a child subreaper (PR_SET_CHILD_SUBREAPER), so
  orphaned descendants become its children instead of init's, and it kills them at the end;
- every process of the trial inherits the environment variable TRIAL_TOKEN_ENV with a token unique
  to the trial, so what is left after the reaper itself died is still found by its environment.
"""

from __future__ import annotations

import os
import signal
import time

TRIAL_TOKEN_ENV = "AUTOTUNE_TRIAL_TOKEN"


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().decode(errors="replace").rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def children_of(pid: int) -> list[int]:
    """Direct children of `pid` (scanning /proc: works on every kernel, no CONFIG_PROC_CHILDREN needed)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None and int(fields[1]) == pid:
                found.append(int(entry))
    return found


def descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        kids = children_of(frontier.pop())
        found.extend(kids)
        frontier.extend(kids)
    return found


def marked(token: str) -> list[int]:
    """Living processes (not this one) whose environment carries the trial's token."""
    needle = f"{TRIAL_TOKEN_ENV}={token}".encode() + b"\0"
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read() + b"\0"
        except OSError:
            continue
        if (b"\0" + environ).find(b"\0" + needle) >= 0 and _alive(int(entry)):
            found.append(int(entry))
    return found


def kill_pids(pids: list[int], grace_s: float) -> None:
    """SIGTERM, then SIGKILL whatever is still alive after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        if sig == signal.SIGTERM:
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and any(_alive(p) for p in pids):
                time.sleep(0.02)


def kill_marked(token: str, grace_s: float) -> list[int]:
    """Kill every process that carries the trial's token; returns their ids."""
    pids = marked(token)
    if pids:
        kill_pids(pids, grace_s)
    return pids
