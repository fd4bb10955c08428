"""Reading artifact files for the dashboard without letting a launcher name any file on the machine.

A trial's artifact paths come from its launcher, so they are not trusted: a result line saying
{"artifacts": {"shadow": "/etc/shadow"}} must not make the dashboard serve /etc/shadow. A file is
served only when its fully resolved path (symlinks followed) lies inside the study's own run
folder (`backends.runs.study_dir`), and it is opened without following a symlink in its last
component, so a link swapped in after the check is refused too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

MAX_ARTIFACT_BYTES = 512 * 1024 * 1024


def confined_path(path: str, backend_options: dict[str, Any], study: str) -> Path | None:
    """The resolved file inside the study's run folder, or None when it is elsewhere or missing."""
    from autotune.backends.runs import study_dir

    if "\0" in path:
        return None
    try:
        root = study_dir(backend_options or {}, study).resolve(strict=True)
        resolved = Path(path).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if resolved == root or not resolved.is_relative_to(root) or not resolved.is_file():
        return None
    return resolved


def read_confined(path: str, backend_options: dict[str, Any], study: str) -> bytes | None:
    resolved = confined_path(path, backend_options, study)
    if resolved is None:
        return None
    try:
        descriptor = os.open(resolved, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as handle:
        return handle.read(MAX_ARTIFACT_BYTES)
