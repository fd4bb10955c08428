"""One exception hierarchy for autotune.

`UserError` and its subclasses are the user's mistakes: the CLI prints their message as one
line and exits with code 2, with no traceback. Failures of *trials* are never exceptions: they
are data (a TrialOutcome with a status), see `autotune.backends`.
"""

from __future__ import annotations


class AutotuneError(Exception):
    """Root of every exception autotune raises on purpose."""


class UserError(AutotuneError):
    """Bad input: an unknown model, a malformed file, an impossible option. Exit code 2."""

    exit_code = 2


class ConfigError(UserError):
    """A knob, a config or a search-space file is malformed."""


class IllegalLayoutError(UserError):
    """A layout breaks a Megatron rule; `violations` holds the rules it breaks."""

    def __init__(self, message: str, violations: list | None = None) -> None:
        super().__init__(message)
        self.violations = violations or []


class StorageError(UserError):
    """The storage URL is unreachable, malformed, or its schema does not match this version."""


class StudyError(UserError):
    """A study that should exist does not, or one that should not exist does."""


class OutputClosed(BrokenPipeError):
    """A study stopped because the output it wrote to was closed (`autotune start | head`): interrupted,
    as by Ctrl-C, and `resume` continues it. A broken pipe after a study ended is not this. `stored` False:
    `start` stopped before it stored its study (nothing to resume)."""

    def __init__(self, message: str = "output closed", stored: bool = True) -> None:
        super().__init__(message)
        self.stored = stored
