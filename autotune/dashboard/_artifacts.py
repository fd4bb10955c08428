"""Reading artifact files for the dashboard without letting a launcher name any file on the machine.

A trial's artifact paths come from its launcher, so they are not trusted: a result line saying
{"artifacts": {"shadow": "/etc/shadow"}} must not make the dashboard serve /etc/shadow. A file is
served only when its fully resolved path (symlinks followed) lies inside the study's own run
folder (`backends.runs.study_dir`), and it is opened one component at a time without following a
symlink, so a link swapped in after the check is refused too.

The run folder itself is not trusted either: whoever starts a study chooses its `--workdir` and its
name, and a study named `.ssh` started with `--workdir ~` once made `~/.ssh` "its own run folder"
(review). So the folder must also lie inside one of the roots the person running the dashboard
named (`autotune dashboard --artifact-root DIR`, default /tmp/autotune-runs, the default
`--workdir`), and a workdir stored as a relative path (older versions kept it as typed, so it
meant the dashboard's own working folder) is served from nowhere.

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


class ArtifactRoots:
    """The folders whose run folders the dashboard serves files from, each pinned to the real folder it
    named the first time it existed (resolved once): a root swapped later for a symlink to `/` (by anyone
    who can write beside it) changes nothing. A root named by the operator that exists when the dashboard
    starts is taken as it is (it may be a link, owned by anyone: the operator chose it). Any other root (the
    default one, in the world-writable /tmp, or a named one that appears later, perhaps in a shared folder)
    is used only as a real folder, not a link, owned by this user or root: another user could otherwise make
    it first, as a link to anywhere (review)."""

    def __init__(self, roots: tuple[Path, ...], trusted: bool) -> None:
        self.roots = tuple(roots)
        self._pinned: dict[Path, Path] = {}
        self._refused: dict[Path, str] = {}
        if trusted:
            for root in self.roots:
                pinned = self._pin(root, trusted=True)
                if pinned is not None:
                    self._pinned[root] = pinned

    def __iter__(self):
        return iter(self.roots)

    def __str__(self) -> str:
        return ", ".join(str(root) + (f" (not used: {self._refused[root]})" if root in self._refused else "")
                         for root in self.roots)

    def allowed(self) -> list[Path]:
        """The pinned real folders (a root that does not exist yet, or fails its check, serves nothing)."""
        for root in self.roots:
            if root not in self._pinned:
                pinned = self._pin(root, trusted=False)
                if pinned is not None:
                    self._pinned[root] = pinned
                    self._refused.pop(root, None)
        return list(self._pinned.values())

    def _pin(self, root: Path, trusted: bool) -> Path | None:
        try:
            if not trusted:
                info = root.lstat()
                if not stat.S_ISDIR(info.st_mode):
                    self._refused[root] = "a link or a file, not a folder"
                    return None
                if info.st_uid not in (os.getuid(), 0):
                    self._refused[root] = "owned by another user"
                    return None
            resolved = root.resolve(strict=True)
        except (OSError, RuntimeError, AttributeError):  # missing (yet); a loop; no getuid (not POSIX)
            return None
        return None if resolved.parent == resolved or not resolved.is_dir() else resolved


def default_roots() -> ArtifactRoots:
    from autotune.backends.runs import DEFAULT_WORKDIR

    return ArtifactRoots((Path(DEFAULT_WORKDIR),), trusted=False)


def check_roots(roots: list[str]) -> ArtifactRoots:
    """The folders named by `--artifact-root`, made absolute and pinned (ArtifactRoots); ConfigError (one line)
    for one that is a file or the file system's root (that would serve every file a launcher names). One that
    does not exist yet is kept (a study makes its --workdir when it starts; the dashboard may start first):
    nothing under it is served until then."""
    from autotune._paths import shown
    from autotune.errors import ConfigError

    checked = []
    for root in roots:
        if not root.strip() or "\0" in root:
            raise ConfigError("--artifact-root is empty: give a folder that holds run folders (--workdir of a study)")
        try:
            path = Path(os.path.expanduser(root)).absolute()
            existing = next(p for p in (path, *path.parents) if p.exists())  # `/` always exists
            if not existing.is_dir():
                raise ConfigError(f"--artifact-root {shown(root)}: {'not' if existing == path else 'inside'} a file, "
                                  "not a folder")
            resolved = path.resolve()
        except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop (Python 3.11)
            raise ConfigError(f"--artifact-root {shown(root)}: cannot use it "
                              f"({getattr(exc, 'strerror', None) or exc})") from None
        if resolved.parent == resolved:  # `/`, `//`, `/etc/..`
            raise ConfigError(f"--artifact-root {shown(root)}: the file system's root would let a study's "
                              "launcher name any file on this machine; give the folder its runs are in")
        checked.append(path)
    return ArtifactRoots(tuple(dict.fromkeys(checked)), trusted=True)


def as_roots(roots: "ArtifactRoots | tuple[Path, ...] | None") -> ArtifactRoots:
    """A caller's roots (a tuple of folders is the operator's choice), or the default."""
    if roots is None:
        return default_roots()
    return roots if isinstance(roots, ArtifactRoots) else check_roots([str(root) for root in roots])


def served_folder(backend_options: dict[str, Any], study: str, roots: ArtifactRoots) -> Path | None:
    """The study's resolved run folder when the dashboard may serve files from it (module doc), else None."""
    from autotune.backends.runs import study_dir

    workdir = (backend_options or {}).get("workdir")
    if workdir is not None and not (isinstance(workdir, str) and "\0" not in workdir and Path(workdir).is_absolute()):
        return None  # a relative folder meant the controller's working folder, unknown here
    try:
        folder = study_dir(backend_options or {}, study)
        # the study's folder is autotune's; a launcher (which writes beside it) that swaps it for a symlink
        # to / would make every file on the machine "inside" it. The workdir above may be a link (the user's).
        if folder.is_symlink():
            return None
        resolved = folder.resolve(strict=True)
    except (OSError, RuntimeError, ValueError):
        return None
    allowed = as_roots(roots).allowed()
    return resolved if any(resolved != root and resolved.is_relative_to(root) for root in allowed) else None


def confined_path(path: str, backend_options: dict[str, Any], study: str,
                  roots: ArtifactRoots) -> Path | None:
    """The resolved file inside the study's run folder, or None when it is elsewhere or missing."""
    found = _confined(path, backend_options, study, roots)
    return found[1] if found else None


def _confined(path: str, backend_options: dict[str, Any], study: str,
              roots: ArtifactRoots) -> tuple[Path, Path] | None:
    """(the run folder, the resolved file inside it), or None. Only the study's own folder (runs.study_dir):
    the folder an older version gave it can be another study's folder now (`a/b` had `a_b`'s; on a
    case-insensitive file system `Demo` had `demo`'s), and nothing in a file says which study wrote it."""
    if not isinstance(path, str) or "\0" in path or not Path(path).is_absolute():
        return None  # a relative path is relative to the launcher's folder, not the dashboard's
    root = served_folder(backend_options, study, roots)
    if root is None:
        return None
    try:
        resolved = Path(path).resolve(strict=True)
    except (OSError, RuntimeError, ValueError):
        return None
    if resolved != root and resolved.is_relative_to(root) and resolved.is_file():
        return root, resolved
    return None


def open_confined(path: str, backend_options: dict[str, Any], study: str,
                  roots: ArtifactRoots) -> BinaryIO | None:
    """The file opened for reading (the caller closes it; serve at most MAX_ARTIFACT_BYTES of it), opened one
    path component at a time from `/` along its resolved path (which has no symlink in it), with O_NOFOLLOW
    on each: any folder of the path swapped for a symlink between the check above and the open (a launcher
    still running can do it; review: the workdir, not only the study's folder) fails the open instead of
    leading outside. Opened non-blocking, and only a regular file is kept (a FIFO would hang the reader)."""
    found = _confined(path, backend_options, study, roots)
    if found is None:
        return None
    _root, resolved = found
    opened: list[int] = []
    try:
        opened.append(os.open(resolved.anchor, os.O_RDONLY | os.O_DIRECTORY))
        *folders, name = resolved.parts[1:]
        for folder in folders:
            opened.append(os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=opened[-1]))
        descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=opened[-1])
    except (OSError, ValueError, NotImplementedError, AttributeError):  # no dir_fd / O_NOFOLLOW: not POSIX
        return None
    finally:
        for fd in opened:
            os.close(fd)
    handle = os.fdopen(descriptor, "rb")
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):  # a FIFO or device put there since the check
        handle.close()
        return None
    return handle
