"""`autotune export`: the winner as a Megatron-Bridge recipe, overrides, YAML/JSON, or a replay table."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from autotune.backends.replay import PARQUET_SUFFIXES


def register(sub) -> None:
    from autotune.cli._checks import trial_number
    from autotune.cli._study_cmds import add_storage_option

    p = sub.add_parser("export", help="export a completed trial (default: the best) for Megatron-Bridge")
    p.add_argument("study", help="the study's name (see `autotune status`)")
    p.add_argument("--trial", type=trial_number,
                   help="trial number (default: the study's recommendation: the best pooled estimate over the "
                        "layouts that ran, keeping the memory headroom)")
    p.add_argument("--format", required=True, choices=("recipe", "overrides", "yaml", "json", "table"),
                   help="recipe (a Python module building the trials' Megatron-Bridge recipe with the tuned layout), "
                        "overrides (run_recipe.py overrides and the torchrun line), yaml or json (layout, workload, "
                        "metrics), table (every finished trial, the replay backend's input)")
    p.add_argument("-o", "--output", help="write to this file (default, or -: stdout; .parquet for a Parquet table; a name ending in "
                        "another format's suffix, .json with --format yaml, is refused)")
    p.add_argument("--allow-benchmark-settings", action="store_true",
                   help="export a study that ran with benchmark-only settings (--benchmark-setting), including "
                        "them (refused without this flag: such numbers are not a tuned result)")
    add_storage_option(p)
    p.set_defaults(handler=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from autotune import export
    from autotune.errors import ConfigError
    from autotune.cli._study_cmds import open_repo

    if args.output == "-":  # the usual name of stdout (found by review: it made a file named '-')
        args.output = None
    if args.output is not None:
        _check_suffix(args.output, args.format)
    repo = open_repo(args, read_only=True)
    if args.output:
        _check_output(args.output, repo.url)
    study = repo.get_study(args.study)
    notes: list[str | None] = []  # what export says of the export once it is written
    try:
        if args.format == "table":
            settings = export.benchmark_settings(study, args.allow_benchmark_settings)
            frame = export.table_frame(repo, study, settings)
            if args.output and _written_suffix(args.output) in PARQUET_SUFFIXES:
                _write(args.output, lambda path: frame.to_parquet(path, index=False))
            else:
                _write(args.output, frame.to_csv(index=False))
            what = f"a replay table of {len(frame)} trial(s) (completed, OOM and failed) of study {study.name!r}"
        else:
            pick = export.recommendation(repo, study)  # pools every run: once for the export and its notes
            trial = export.choose_trial(repo, study, args.trial, pick)
            text = export.render(repo, study, args.format, args.trial, args.allow_benchmark_settings, pick)
            # everything the note needs is read before the file is written
            what = _what(study, args, trial, pick)
            from autotune.config import LayoutConfig
            from autotune.megatron.overrides import safety_checks_off

            # said once the export is written: a write that fails is one line (a new-user pass got the notes first)
            notes += [f"note: the exported layout sets {check}"
                      for check in safety_checks_off(LayoutConfig.from_mapping(trial.config))]
            if args.trial is not None:
                notes.append(export.chosen_trial_risk(pick, trial))
            if args.trial is None:
                notes.append(export.risk_warning(study, pick))
                if study.status != "finished":  # found by review: a mid-study recommendation went out unmarked
                    counts = repo.counts(study.id)
                    notes.append(f"note: study {study.name!r} is {study.status} ({counts['dispatched']} of "
                                 f"{study.budget} runs dispatched): its recommendation may still change")
            _write(args.output, text)
    except OSError as exc:  # a missing or read-only folder, a full disk
        raise ConfigError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    for note in filter(None, notes):
        print(note, file=sys.stderr)
    # without -o (or with -o /dev/stdout, a pipe...) the export itself may be on stdout: the note goes to stderr
    to_file = bool(args.output) and Path(args.output).is_file()
    print(f"wrote {args.output or 'the export to stdout'}: {what}", file=sys.stdout if to_file else sys.stderr)
    return 0


SQLITE_HEADER = b"SQLite format 3\x00"
# What a file name's ending promises, for the endings that name one of export's formats: a file whose
# name promises another format than the one written would mislead whoever opens it next (a replay
# table that is JSON, a recipe module that is YAML).
SUFFIX_FORMATS = {**{suffix: ("table", "a Parquet table") for suffix in PARQUET_SUFFIXES},
                  ".csv": ("table", "a CSV table"), ".json": ("json", "JSON"), ".yaml": ("yaml", "YAML"),
                  ".yml": ("yaml", "YAML"), ".py": ("recipe", "a Python module")}
FORMAT_WRITES = {"recipe": "a Python module", "overrides": "override lines and a torchrun line", "yaml": "YAML",
                 "json": "JSON", "table": "a CSV table (Parquet for .parquet or .pq)"}


COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".zip", ".tgz", ".lz4", ".lzma", ".br", ".7z", ".tar")


def _suffix(name: str) -> str:
    """A name's ending as it promises a format: case-blind, trailing dots and spaces ignored (`x.parquet.`)."""
    return Path(name.rstrip(". ")).suffix.lower()


def _written_suffix(output: str) -> str:
    """The ending that decides a table's writer: a symlink's target's when it names a format (it is that
    file that is replaced), else the name given (a link to `blob` or a device named out.parquet)."""
    import os

    target = _suffix(Path(os.path.realpath(output)).name)
    return target if target in SUFFIX_FORMATS else _suffix(Path(output).name)


def _check_suffix(output: str, fmt: str) -> None:
    """Refuse `-o` that is empty, or whose ending (or, through a symlink, its target's) names another
    format than `--format` (`--format json -o x.parquet`) or a compression export does not apply.
    JSON is YAML (1.2), so a JSON document may be named .yaml."""
    import os

    from autotune.errors import ConfigError

    if not output:
        raise ConfigError("-o needs a file name (leave -o out to write to stdout)")
    name = Path(output).name
    if name != name.strip() and not os.path.lexists(output):
        # `-o "tuned.py "` (a quoting slip) would write a file that `python tuned.py` and tab completion miss
        raise ConfigError(f"-o {output!r}: the file name {'ends' if name != name.rstrip() else 'starts'} with "
                          "white space; give the name without it")
    names = list(dict.fromkeys((Path(output).name, Path(os.path.realpath(output)).name)))
    promises = []  # what each name that names a format promises
    for name in names:
        suffix = _suffix(name)
        if suffix in COMPRESSED_SUFFIXES:
            raise ConfigError(f"-o {name!r} names a compressed file or an archive, but export writes it uncompressed: "
                              "compress it afterwards, or give another file name")
        promised = SUFFIX_FORMATS.get(suffix)
        if promised and promised[0] != fmt and not (fmt == "json" and promised[0] == "yaml"):
            raise ConfigError(f"-o {name!r} names {promised[1]}, but --format {fmt} writes {FORMAT_WRITES[fmt]}: "
                              f"use --format {promised[0]} or another file name")
        if promised:
            promises.append(promised)
    # a link and its target that promise different things (x.csv -> t.parquet): whichever is written,
    # one of the two names lies about the content
    if len(promises) == 2 and promises[0] != promises[1] and not (fmt == "json" and promises[0][0] == "json"):
        raise ConfigError(f"-o {names[0]!r} names {promises[0][1]} but links to {names[1]!r}, {promises[1][1]}: "
                          "give the file's own name")


def _check_output(output: str, storage_url: str) -> None:
    """Refuse an output that would overwrite a database: the store being read (its file or the
    -wal / -shm / -journal files beside it) or any other SQLite file (another study store). Only a
    regular file's header is read: a FIFO or a device (`-o /dev/stdout`) is never opened here."""
    import os
    import stat

    from autotune.errors import ConfigError
    from autotune.storage import sqlite_path

    target = Path(output)
    store = sqlite_path(storage_url)
    if store is not None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            own = Path(f"{store}{suffix}")
            try:
                same = own.exists() and target.exists() and os.path.samefile(target, own)
            except OSError:
                same = False
            if same or os.path.realpath(target) == os.path.realpath(own):
                raise ConfigError(f"refusing to write the export over {output}: it is the study store's own "
                                  f"database{' file' if not suffix else ' (' + suffix.lstrip('-') + ' file)'}")
    try:
        if not stat.S_ISREG(os.stat(target).st_mode):
            return
        with open(target, "rb") as handle:
            header = handle.read(len(SQLITE_HEADER))
    except OSError:  # absent (the usual case), unreadable: the write reports what is wrong
        return
    if header == SQLITE_HEADER:
        raise ConfigError(f"refusing to write the export over {output}: it is an SQLite database")


def _write(output: str | None, content) -> None:
    """`content` (text, or a function writing a file at the path it is given) to `output`, or the text
    to stdout. A regular file (or a new one) is written beside the target and renamed over it, so a
    failed or interrupted export leaves the old file whole, never half a file; a symlink is followed
    (the file it names is replaced, the link stays); a device or FIFO (`-o /dev/stdout`) is written
    directly."""
    import os
    import stat
    import tempfile

    if not output:
        sys.stdout.write(content)
        return
    try:
        mode = os.stat(output).st_mode  # of what the path names, symlinks followed
    except FileNotFoundError:
        mode = None
    if mode is not None and stat.S_ISDIR(mode):
        raise IsADirectoryError(21, "Is a directory", output)
    if mode is not None and not stat.S_ISREG(mode):  # a device, a FIFO, /dev/stdout on a pipe
        if callable(content):
            content(output)
        else:
            with open(output, "w", encoding="utf-8") as handle:
                handle.write(content)
        return
    if mode is None and not _folder_exists_for_the_kernel(output):
        # resolved by the kernel as a shell would: realpath below folds `missing/../..` lexically and would
        # write where `missing` never led
        raise FileNotFoundError(2, "No such file or directory", output)
    target = Path(os.path.realpath(output))  # a regular file (or a new one): through any symlink
    fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    try:
        if callable(content):
            os.close(fd)
            content(temp)
        else:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(content)
        os.chmod(temp, stat.S_IMODE(mode) if mode is not None else 0o666 & ~_umask())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise


def _folder_exists_for_the_kernel(path: str) -> bool:
    """Would the kernel find the folder a new file at `path` goes into? A dangling symlink is followed hop by
    hop (its target may itself name `missing/..`), at most 40 hops as the kernel allows."""
    import os

    for _ in range(40):
        if not os.path.isdir(os.path.dirname(path) or "."):
            return False
        if not os.path.islink(path):
            return True
        path = os.path.join(os.path.dirname(path), os.readlink(path))
    return False


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def _what(study, args: argparse.Namespace, trial, pick) -> str:
    """Which trial went out in which format, and what its numbers are (measured, simulated, replayed)."""
    from autotune import export
    from autotune.space import study_space_and_workload

    source, note = export.metrics_note(study, trial)
    why = f"--trial {args.trial}" if args.trial is not None else "the study's recommendation"
    recipe = export.recipe_import(study_space_and_workload(study)[0].model)[1]
    kind = {"recipe": f"a recipe module building on {recipe}",
            "overrides": f"run_recipe.py overrides for {recipe} and the torchrun line", "yaml": "a YAML document",
            "json": "a JSON document"}[args.format]
    return (f"{kind}, trial {trial.number} of study {study.name!r} ({why}): {source} "
            f"{export.figure_text(trial, export.layout_figure(pick, trial))} ({note})")
