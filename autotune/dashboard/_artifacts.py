"""Reading artifact files for the dashboard without letting a launcher name any file on the machine.

A trial's artifact paths come from its launcher, so they are not trusted: a result line saying
{"artifacts": {"shadow": "/etc/shadow"}} must not make the dashboard serve /etc/shadow. A file is
served only when its fully resolved path (symlinks followed) lies inside the study's own run
folder (`backends.runs.study_dir`), and it is opened without following a symlink in its last
component, so a link swapped in after the check is refused too.

Its content is not trusted either: an HTML or JavaScript file a launcher wrote must not run in the
dashboard's origin (it could read every study through the dashboard's own API). So the type an
artifact is served with comes from a short list, never from its name alone: raster images inline,
text as text/plain, anything else (HTML, SVG, scripts, traces) as a download (the server adds
`Content-Disposition: attachment` and a sandboxing CSP to every artifact).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

MAX_ARTIFACT_BYTES = 512 * 1024 * 1024
# shown in the browser: images that cannot hold script, and text that is never rendered as markup
INLINE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".gif": "image/gif",
                ".webp": "image/webp"}
TEXT_SUFFIXES = {".txt", ".log", ".json", ".csv", ".yaml", ".yml", ".out", ".err"}
DOWNLOAD_TYPE = "application/octet-stream"


def artifact_type(path: str) -> str:
    """The Content-Type an artifact is served with (module doc): never HTML, SVG or script."""
    suffix = Path(path).suffix.lower()
    if suffix in INLINE_TYPES:
        return INLINE_TYPES[suffix]
    if suffix in TEXT_SUFFIXES:
        return "text/plain; charset=utf-8"
    return DOWNLOAD_TYPE


def confined_path(path: str, backend_options: dict[str, Any], study: str) -> Path | None:
    """The resolved file inside the study's run folder, or None when it is elsewhere or missing."""
    found = _confined(path, backend_options, study)
    return found[1] if found else None


def _confined(path: str, backend_options: dict[str, Any], study: str) -> tuple[Path, Path] | None:
    """(the run folder, the resolved file inside it), or None. Only the study's own folder (runs.study_dir):
    the folder an older version gave it can be another study's folder now (`a/b` had `a_b`'s; on a
    case-insensitive file system `Demo` had `demo`'s), and nothing in a file says which study wrote it."""
    from autotune.backends.runs import study_dir

    if "\0" in path:
        return None
    try:
        resolved = Path(path).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):
        return None
    try:
        folder = study_dir(backend_options or {}, study)
        # the study's folder is autotune's; a launcher (which writes beside it) that swaps it for a symlink
        # to / would make every file on the machine "inside" it. The workdir above may be a link (the user's).
        if folder.is_symlink():
            return None
        root = folder.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if resolved != root and resolved.is_relative_to(root) and resolved.is_file():
        return root, resolved
    return None


def open_confined(path: str, backend_options: dict[str, Any], study: str) -> BinaryIO | None:
    """The file opened for reading (the caller closes it; serve at most MAX_ARTIFACT_BYTES of it), opened one
    path component at a time from the run folder with O_NOFOLLOW on each: a folder swapped for a symlink
    between the check above and the open (a launcher still running can do it) fails the open instead of
    leading outside."""
    found = _confined(path, backend_options, study)
    if found is None:
        return None
    root, resolved = found
    opened: list[int] = []
    try:
        opened.append(os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW))  # swapped since: no
        *folders, name = resolved.relative_to(root).parts
        for folder in folders:
            opened.append(os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=opened[-1]))
        descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=opened[-1])
    except (OSError, ValueError):
        return None
    finally:
        for fd in opened:
            os.close(fd)
    handle = os.fdopen(descriptor, "rb")
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):  # a FIFO or device put there since the check
        handle.close()
        return None
    return handle
