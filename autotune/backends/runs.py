"""Run folders: where a trial's files live, and the outcome file that outlives a dead controller.

    <workdir>/<study>/trial<N>-attempt<K>/   spec.json, outcome.json, the launcher's own files

`workdir` is the backend option (default /tmp/autotune-runs). The command and megatron backends
write `outcome.json` (atomically: a temporary file renamed) as soon as a run ends. When a
controller dies between that moment and recording the outcome, the controller that adopts the
trial reads the file (`harvest`) instead of launching the same run again.

The same folder bounds what the dashboard serves as artifacts: `study_dir` is the only tree it
reads files from, whatever path a launcher reported, and only when it lies inside a root the
dashboard's operator named (dashboard/_artifacts.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from autotune.backends.base import TrialOutcome, TrialSpec
from autotune._json import loads_flagged
from autotune.backends.validation import outcome_from_record

DEFAULT_WORKDIR = "/tmp/autotune-runs"
OUTCOME_FILE = "outcome.json"


def safe_name(study: str) -> str:
    """The study name as one path component (no separators, no `..`), one per name: a name that had to be
    changed gets a digest of itself, so `a/b` and `a_b` (or `a b`) never share a run folder, where each
    study's dashboard could serve the other's artifacts. So does a name with a capital letter: on a
    case-insensitive file system (macOS, Windows) `Demo` and `demo` would otherwise be one folder. So does a
    name with a leading dot: a study named `.ssh` with `--workdir ~` would otherwise own `~/.ssh` (review)."""
    import hashlib
    import re

    name = "".join(ch if ch.isascii() and (ch.isalnum() or ch in "-_.") else "_" for ch in study)
    # a kept name that ends like a digest gets one too: `a_b-c14cddc033f6` is otherwise the folder of `a/b`
    if (name != study or name != name.lower() or name.startswith(".") or re.search(r"-[0-9a-f]{12}$", name)):
        name = f"{name[:100]}-{hashlib.sha256(study.encode()).hexdigest()[:12]}"
    return name


def _legacy_name(study: str) -> str:
    """The folder name versions before 2026-11-25 gave a study (no digest; `a/b` and `a_b` alike)."""
    name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in study)
    return name if name.strip(".") else f"_{name}"


def check_workdir(options: dict[str, Any]) -> None:
    """ConfigError (one line naming --workdir) when the run folder can be neither used nor created (a
    file is in the way, a read-only or virtual file system such as /proc). Tried for real: the folders
    it had to make are removed again, so a study that is refused leaves no folder behind."""
    import os

    from autotune.errors import ConfigError

    from autotune._paths import one_line, shown

    path = Path(options.get("workdir") or DEFAULT_WORKDIR)  # as study_dir reads it (no ~ expansion)
    missing = []
    probe = path
    try:
        # exists() raises for what it does not treat as "missing" (a name over 255 bytes, EACCES)
        while not probe.exists() and probe != probe.parent:
            missing.append(probe)
            probe = probe.parent
    except OSError as exc:
        raise ConfigError(f"--workdir {shown(str(path))}: cannot use the run folder ({exc.strerror or exc})") from None
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not options.get("workdir"):
            _require_own(path, allow_root=True)  # /tmp/autotune-runs made first by another user, or a link
        test = path / f".autotune-write-test-{os.getpid()}"
        test.mkdir()
        test.rmdir()
    except UnsafeRunFolder as exc:
        raise ConfigError(f"--workdir: {one_line(str(exc))}") from None
    except OSError as exc:
        raise ConfigError(f"--workdir {shown(str(path))}: cannot create or write the run folder "
                          f"({exc.strerror or exc})") from None
    finally:
        for folder in missing:  # deepest first
            try:
                folder.rmdir()
            except OSError:
                break


def study_dir(options: dict[str, Any], study: str) -> Path:
    return Path(options.get("workdir") or DEFAULT_WORKDIR) / safe_name(study)


def study_dirs(options: dict[str, Any], study: str) -> list[Path]:
    """Where a study's runs may be: its folder, then (a study begun before safe_name gave changed names a
    digest) the folder an older version gave it, so its unharvested outcomes are still found (each outcome
    file names its study: `harvest` takes only this study's). The dashboard serves artifacts from the
    study's own folder only (dashboard/_artifacts.py)."""
    workdir = Path(options.get("workdir") or DEFAULT_WORKDIR)
    return list(dict.fromkeys([workdir / safe_name(study), workdir / _legacy_name(study)]))


def trial_dir(options: dict[str, Any], spec: TrialSpec) -> Path:
    return study_dir(options, spec.study) / f"trial{spec.trial}-attempt{spec.attempt}"


class UnsafeRunFolder(OSError):
    """A run folder that is a link, or another user's: nothing is written there."""


def prepare_trial_dir(options: dict[str, Any], spec: TrialSpec) -> Path:
    """The trial's folder, made (or found) and checked before anything is written into it: the study's and the
    trial's folders must be real folders, not links. The default workdir lies in /tmp, where anyone may have made
    it first: it must be this user's folder (or root's), and then so must the folders in it. Found by an
    adversarial pass: a link planted at /tmp/autotune-runs/<study>, or at a trial's spec.json, made autotune write
    its files where the link pointed. A --workdir the user named is theirs to choose, and whose its folders are is
    not checked (review: NFS with root or all squash, or an unmapped NFSv4 domain, shows every folder as nobody's,
    and a team's shared folder may be another account's); links in it are refused all the same.
    UnsafeRunFolder (an OSError) names the folder."""
    workdir = Path(options.get("workdir") or DEFAULT_WORKDIR)
    workdir.mkdir(parents=True, exist_ok=True)
    default = not options.get("workdir")
    if default:
        _require_own(workdir, allow_root=True)
    for folder in (study_dir(options, spec.study), trial_dir(options, spec)):
        try:
            folder.mkdir(mode=0o755)
        except FileExistsError:
            pass
        _require_own(folder, any_owner=not default)
    return folder


def _require_own(folder: Path, allow_root: bool = False, any_owner: bool = False) -> None:
    import stat

    info = folder.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeRunFolder(f"run folder {folder} is a link or a file, not a folder: nothing is written there")
    if not any_owner and info.st_uid != os.getuid() and not (allow_root and info.st_uid == 0):
        raise UnsafeRunFolder(f"run folder {folder} belongs to another user (uid {info.st_uid}) in the default "
                              f"workdir {DEFAULT_WORKDIR}, which anyone may make first: nothing is written there "
                              "(give --workdir a folder of your own)")


def write_new_file(path: Path, text: str) -> None:
    """Write `path` (in a folder prepare_trial_dir checked) without following a link that stands in its place."""
    import errno

    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link
            raise UnsafeRunFolder(f"{path} is a link: nothing is written there") from None
        raise
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


MAX_OUTCOME_BYTES = 1 << 20  # an outcome file larger than this is read as none


def write_outcome(options: dict[str, Any], spec: TrialSpec, outcome: TrialOutcome) -> None:
    """Record how the run ended, next to its files; a failure to write never fails the trial."""
    try:
        directory = prepare_trial_dir(options, spec)
        temporary = directory / f".{OUTCOME_FILE}.{os.getpid()}"
        write_new_file(temporary, json.dumps({"spec": spec.to_dict(), "outcome": outcome.to_dict()}))
        os.replace(temporary, directory / OUTCOME_FILE)  # replaces a link in its place, never follows it
    except OSError:
        pass


def harvest(options: dict[str, Any], study: str, trial: int, attempt: int, config: dict[str, Any]) -> TrialOutcome | None:
    """The recorded outcome of that attempt when its run finished and its spec matches `config`."""
    for folder in study_dirs(options, study):
        outcome = _harvested(folder / f"trial{trial}-attempt{attempt}" / OUTCOME_FILE, study, trial, config)
        if outcome is not None:
            return outcome
    return None


def _harvested(path: Path, study: str, trial: int, config: dict[str, Any]) -> TrialOutcome | None:
    try:
        with path.open("rb") as handle:  # a backend's record is a few kB; a larger file is not one
            raw = handle.read(MAX_OUTCOME_BYTES + 1)
        if len(raw) > MAX_OUTCOME_BYTES:
            return None
        data, problem = loads_flagged(raw.decode("utf-8", errors="replace"))
        if problem:  # a key twice (which status?): no backend wrote it
            return None
        spec, outcome = data["spec"], outcome_from_record(data["outcome"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):  # RecursionError: nested brackets
        return None  # no outcome, or one that is not a backend's record: the trial runs again
    if not isinstance(spec, dict) or [spec.get(k) for k in ("study", "trial", "config")] != [study, trial, config]:
        return None  # a folder of another study that shares the safe name, or a stale leftover
    if outcome.trial != trial:
        return None
    return outcome
