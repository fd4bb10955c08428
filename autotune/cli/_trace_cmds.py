"""`autotune trace summarize` and `autotune import-log`."""

from __future__ import annotations

import argparse
import json


def register(sub) -> None:
    from autotune.cli._options import add_knob_flags
    from autotune.cli._study_cmds import add_storage_option

    p = sub.add_parser("trace", help="Nsight Systems traces")
    actions = p.add_subparsers(dest="trace_command", metavar="{summarize}", parser_class=type(p), required=True)
    q = actions.add_parser("summarize", help="compute, NCCL, overlapped and exposed time per device")
    q.add_argument("file", help="an .nsys-rep (needs nsys) or its `nsys export --type sqlite` file")
    q.add_argument("--json", action="store_true", help="print the per-device summary as JSON")
    q.set_defaults(handler=cmd_summarize)

    p = sub.add_parser("import-log", help="bring a finished run's Megatron log into a study as a trial")
    p.add_argument("log", help="the run's log (stdout of the last rank and rank 0)")
    p.add_argument("--study", required=True, help="the study that receives the run (it must exist)")
    add_knob_flags(p)
    add_storage_option(p)
    p.add_argument("--json", action="store_true", help="print the imported trial as JSON")
    p.set_defaults(handler=cmd_import_log)


def cmd_summarize(args: argparse.Namespace) -> int:
    from autotune.megatron import trace

    summaries = trace.summarize(args.file)
    if not summaries:  # found by review: an empty table and exit 0, as if the trace had been read
        from autotune._paths import shown
        from autotune.errors import ConfigError

        raise ConfigError(f"{shown(args.file)} holds no GPU kernel with a start, end, device and name: nothing to "
                          "summarize (was the run traced with CUDA activity?)")
    data = trace.to_dict(summaries)
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    from rich.table import Table

    from autotune.cli._study_cmds import wide_console

    from rich.markup import escape

    from autotune._paths import one_line

    # the file's name on one line, its escape sequences and bidi controls shown, not obeyed (adversarial pass)
    table = Table(title=escape(f"{one_line(str(args.file))}: kernel time per device (interval unions)"))
    for column in ("device", "kernels", "busy s", "compute s", "NCCL s", "overlapped s", "exposed NCCL s", "overlap"):
        table.add_column(column, justify="right")
    for s in summaries:
        table.add_row(str(s.device), str(s.kernels), f"{s.busy_s:.4f}", f"{s.compute_s:.4f}",
                      f"{s.communication_s:.4f}", f"{s.overlapped_s:.4f}", f"{s.exposed_communication_s:.4f}",
                      f"{s.overlap_share:.0%}")
    wide_console().print(table)
    return 0


def cmd_import_log(args: argparse.Namespace) -> int:
    import io
    import os
    import stat

    from autotune._paths import require_file, shown
    from autotune._tables import terminal_safe
    from autotune.cli._options import knob_flags, with_recipe_defaults
    from autotune.space import study_space_and_workload
    from autotune.cli._study_cmds import open_repo
    from autotune.controller.imports import import_log
    from autotune.errors import ConfigError
    from autotune.megatron.logparse import read_lines

    path = require_file(args.log, "log file")
    repo = open_repo(args, read_only=True, writes=True)  # the study must exist already
    study = repo.get_study(args.study)
    # a knob the user left out is the recipe's (as `estimate` and `check` fill it), not LayoutConfig's own
    # default: ep=1 without the distributed optimizer is no layout a Bridge recipe runs (review)
    space, workload = study_space_and_workload(study)
    layout, filled = with_recipe_defaults(knob_flags(args), workload, space.domains)
    try:
        # non-blocking, then checked again on the open file: a pipe or folder swapped in after require_file
        # neither hangs the open nor is read
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ConfigError(f"log file {shown(str(path))} is not a regular file")
        # read line by line: a log of many GB (a whole training run's) is never held in memory; nothing is
        # stored before the whole log has been read
        with io.open(fd, encoding="utf-8", errors="replace") as log:
            trial, notes = import_log(repo, study, layout, read_lines(log),
                                      source=str(path.resolve()),  # absolute: the dashboard does not run where this did
                                      space_and_workload=(space, workload))
    except OSError as exc:  # unreadable (permissions, an I/O error mid-way, /proc/self/mem)
        raise ConfigError(f"log file {shown(str(path))}: cannot be read ({exc.strerror or exc})") from None
    if args.json:
        print(json.dumps({**trial.to_dict(), "filled_from_recipe": filled, "notes": notes}, indent=2, default=str))
    else:
        taken = ", ".join(f"{k}={v}" for k, v in filled.items())
        print(f"imported as trial {trial.number} ({trial.status}) of {terminal_safe(args.study)}"
              + (f"; from the recipe: {taken}" if taken else ""))
        for note in notes:
            print(f"note: {note}")
    from autotune.controller.imports import refresh_pooled_cache

    refresh_pooled_cache(repo, study)  # after the import has succeeded and said so: only a cache
    return 0
