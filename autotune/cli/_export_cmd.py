"""`autotune export`: the winner as a Megatron-Bridge recipe, overrides, YAML/JSON, or a replay table."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def register(sub) -> None:
    from autotune.cli._checks import trial_number
    from autotune.cli._study_cmds import add_storage_option

    p = sub.add_parser("export", help="export a completed trial (default: the best) for Megatron-Bridge")
    p.add_argument("study")
    p.add_argument("--trial", type=trial_number,
                   help="trial number (default: the study's recommendation: the best mean over runs that keeps "
                        "the memory headroom)")
    p.add_argument("--format", required=True, choices=("recipe", "overrides", "yaml", "json", "table"))
    p.add_argument("-o", "--output", help="write to this file (default: stdout; .parquet for a Parquet table)")
    add_storage_option(p)
    p.set_defaults(handler=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    from autotune import export
    from autotune.errors import ConfigError
    from autotune.cli._study_cmds import open_repo

    repo = open_repo(args, read_only=True)
    study = repo.get_study(args.study)
    try:
        if args.format == "table" and args.output and Path(args.output).suffix in (".parquet", ".pq"):
            export.table_frame(repo, study).to_parquet(args.output, index=False)
            return 0
        text = export.render(repo, study, args.format, args.trial)
        if args.trial is None and args.format != "table":
            warning = export.risk_warning(repo, study)
            if warning:
                print(warning, file=sys.stderr)
        if args.output:
            Path(args.output).write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
    except OSError as exc:  # a missing or read-only folder, a full disk
        raise ConfigError(f"cannot write {args.output}: {exc.strerror or exc}") from None
    return 0
