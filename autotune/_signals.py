"""SIGTERM handled like Ctrl-C, and a local Ray that a signal to our process group does not reach.

A controller stopped with SIGTERM (a scheduler's kill, `timeout`, systemd) must end as one stopped
with Ctrl-C does: cancel its trials, mark the study "interrupted", release Ray, print one line.
Two things stood in the way:
- Ray installs its own SIGTERM handler when it starts a local cluster; `sigterm_as_interrupt`
  replaces it, after Ray started, with one that raises `Terminated` (a KeyboardInterrupt, so every
  `except KeyboardInterrupt` clean-up path runs).
- A signal to the whole process group also hit Ray's raylet and GCS, whose deaths made the driver
  abort (SIGABRT, a C++ stack dump). `ray_outside_our_group` starts them in a process group of their
  own: the controller moves to a new group while Ray spawns its processes, then moves back.
A signal handler's exception lands wherever the main thread happens to be, and where that is a
finalizer (a weakref callback, `__del__`, as SQLAlchemy runs while it frees objects) Python prints
"Exception ignored" and goes on: the SIGTERM was lost and the study ran to its end with exit 0 (seen
in CI). So the handlers (SIGTERM's, and Ctrl-C's while it is Python's default) also record the signal,
and the controller's loop (`raise_if_terminated`) and the end of `sigterm_as_interrupt` raise it again
where it cannot be swallowed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from typing import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: stop as after Ctrl-C (the CLI exits with 143)."""


# The interruptions that arrived inside the outermost `sigterm_as_interrupt` (Terminated for SIGTERM,
# KeyboardInterrupt for Ctrl-C); cleared when the outermost block is entered and left. Blocks nest (`start`
# enters one again after Ray installed its own handler): an inner block must not forget what the outer saw.
_received: list[type[KeyboardInterrupt]] = []
_depth = 0


def _raise_terminated(_signum, _frame) -> None:
    already = Terminated in _received
    _received.append(Terminated)
    if not already:  # a second SIGTERM is recorded only: it must not cut short the first one's clean-up
        raise Terminated()


SIGTERM_HANDLER = _raise_terminated  # what sigterm_as_interrupt installs (a caller may check it is in place)


def _raise_interrupt(_signum, _frame) -> None:
    _received.append(KeyboardInterrupt)
    raise KeyboardInterrupt()  # every Ctrl-C: a second one is how a user insists


def record_terminated() -> None:
    """A SIGTERM that another handler took (ray.init's) counts as received inside `sigterm_as_interrupt`:
    a second one is then recorded only (outside every block nothing would clear the record)."""
    if _depth:
        _received.append(Terminated)


def raise_if_terminated() -> None:
    """Raise again the SIGTERM (Terminated) or Ctrl-C (KeyboardInterrupt) that arrived since the outermost
    `sigterm_as_interrupt` was entered.

    Called where an interruption is safe to act on (the top of the controller's loops): the handler's
    own exception may have been swallowed by a finalizer it interrupted.
    """
    if _received:
        raise _received[0]()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises Terminated in the main thread (no-op in other threads), and
    SIGTERM or Ctrl-C that a finalizer swallowed is raised again when the block ends normally.

    Ctrl-C is only recorded when its handler is still Python's default (which raises
    KeyboardInterrupt); a handler someone else installed is left alone.
    """
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _depth == 0:
        _received.clear()
    _depth += 1
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        yield
        raise_if_terminated()  # the body ended normally although a signal came: it was swallowed
    finally:
        # each step runs even if a signal lands between them (its exception then leaves after the last)
        try:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        finally:
            try:
                if previous_int is signal.default_int_handler:
                    signal.signal(signal.SIGINT, previous_int)
            finally:
                _depth -= 1
                if _depth == 0:
                    _received.clear()  # acted on: a later loop outside every block must not see it


@contextlib.contextmanager
def ray_outside_our_group() -> Iterator[None]:
    """Processes started inside land in another process group than the caller's; a block cut short
    (a SIGTERM, Ctrl-C, an error) kills every process it had started there.

    A placeholder process opens a new group; the caller joins it while inside (children inherit
    it) and returns to its own group afterwards. A session leader cannot change groups: then
    nothing changes.
    """
    original = os.getpgrp()
    if os.getsid(0) == os.getpid():
        yield
        return
    placeholder = subprocess.Popen(["sleep", "3600"], process_group=0, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        os.setpgid(0, placeholder.pid)
    except OSError:
        placeholder.kill()
        placeholder.wait()
        yield
        return

    def back_to_our_group() -> None:
        with contextlib.suppress(OSError):
            os.setpgid(0, original if original != os.getpid() else 0)

    try:
        yield
    except BaseException:
        # cut short: stop every process started inside, Ray's agents too (children of a raylet that may
        # already be gone), while the placeholder, alive or not yet reaped, still holds the group's id, so
        # that no other group can have taken it
        back_to_our_group()
        if os.getpgrp() != placeholder.pid:  # never the group we are in
            with contextlib.suppress(OSError):
                os.killpg(placeholder.pid, signal.SIGKILL)
        raise
    finally:
        back_to_our_group()
        placeholder.kill()
        placeholder.wait()
