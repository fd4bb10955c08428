"""`autotune models`, `autotune space` and `autotune check`."""

from __future__ import annotations

import argparse
import json
import sys

from autotune._json import loads_flagged
from autotune.cli._options import (add_fix_option, add_knob_flags, add_workload_options, knob_flags,
                                   load_space_and_workload, workload_summary)
from autotune.errors import ConfigError


def register(sub) -> None:
    p = sub.add_parser("models", help="list the model catalog (and GPU types)")
    p.add_argument("--json", action="store_true", help="print the catalog as JSON (every field of every model and GPU)")
    p.set_defaults(handler=cmd_models)

    p = sub.add_parser("space", help="size of the legal set and rejections by rule")
    add_workload_options(p)
    add_fix_option(p)
    p.add_argument("--json", action="store_true", help="print the counts and rejections by rule as JSON")
    p.add_argument("--list", action="store_true", help="print every legal layout as one JSON object per line")
    p.set_defaults(handler=cmd_space)

    p = sub.add_parser("check", help="check layouts (JSON lines on stdin, or knob flags) against Megatron's rules",
                       description="Check layouts against Megatron's rules: the one layout the knob flags give, or, "
                                   "without knob flags, one JSON object per line on stdin (stdin is not read when "
                                   "knob flags are given). Knobs not given take the recipe's values.")
    add_workload_options(p)
    add_knob_flags(p)
    p.add_argument("--json", action="store_true", help="(output is always JSON lines; accepted for symmetry)")
    p.set_defaults(handler=cmd_check)


def cmd_models(args: argparse.Namespace) -> int:
    from autotune.catalog import GPU_TYPES
    from autotune.space import list_models

    models = list_models()
    if args.json:
        print(json.dumps({"models": [m.to_dict() for m in models],
                          "gpus": [g.to_dict() for g in GPU_TYPES.values()]}, indent=2))
        return 0
    from rich.markup import escape

    from autotune._tables import Col, FittedTable
    from autotune.cli._study_cmds import wide_console

    # recipe: the function trials run and `export` builds on (the catalog's recipe target)
    table = FittedTable([Col("name"), Col("model", wrap=True), Col("layers", "right", optional=3),
                         Col("hidden", "right", optional=2), Col("experts", wrap=True, optional=1), Col("recipe"),
                         Col("recipe default", wrap=True)], title="Models")
    for m in models:
        a, d = m.architecture, m.defaults
        experts = f"{a.num_moe_experts} top-{a.moe_router_topk}" if a.is_moe else "-"
        default = f"{d.gpus}x {d.gpu}, GBS {d.global_batch_size}, seq {d.seq_length}"
        recipe = m.recipe_target.partition(":")[2] if m.exportable else "- (no Bridge recipe)"
        table.add_row(m.name, escape(m.display_name), str(a.num_layers), str(a.hidden_size), experts, recipe, default)
    gpus = FittedTable([Col("name"), Col("GPU", wrap=True), Col("memory GiB", "right"), Col("BF16 TFLOP/s", "right"),
                        Col("precisions", wrap=True), Col("NVLink GB/s", "right"), Col("network GB/s", "right")],
                       title="GPU types")
    for g in GPU_TYPES.values():
        gpus.add_row(g.name, g.display_name, f"{g.memory_gib:g}", f"{g.bf16_peak_tflops:g}", ", ".join(g.peak_tflops),
                     f"{g.nvlink_gbps:g}", f"{g.network_gbps:g}")
    console = wide_console()
    console.print(table)
    console.print(gpus)
    return 0


def cmd_space(args: argparse.Namespace) -> int:
    from autotune.space import enumerate_legal

    space, workload = load_space_and_workload(args)
    legal = enumerate_legal(space, workload)
    if args.list:
        out = sys.stdout
        for config in legal.configs:
            out.write(json.dumps(config.to_dict(), separators=(",", ":")) + "\n")
        return 0
    summary = {
        "model": workload.model.name,
        "workload": workload.to_dict(),
        "candidates": legal.candidates,
        "legal": len(legal.configs),
        "megatron_legal": legal.megatron_legal,
        "rejected_by_rule": dict(legal.rejected_by_rule.most_common()),
        "filtered_by_policy": dict(legal.filtered_by_policy.most_common()),
        "domains": {k: list(v) for k, v in space.domains.items()},
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(workload_summary(workload), markup=False)  # the model's name is text
    console.print(f"{legal.candidates:,} candidates, [bold]{len(legal.configs):,} legal[/bold] "
                  f"({legal.megatron_legal:,} pass Megatron's rules before policy filters)")
    table = Table(title="Rejections (first failing check)")
    table.add_column("check")
    table.add_column("kind")
    table.add_column("candidates", justify="right")
    for name, count in legal.rejected_by_rule.most_common():
        table.add_row(name, "rule", f"{count:,}")
    for name, count in legal.filtered_by_policy.most_common():
        table.add_row(name, "policy", f"{count:,}")
    console.print(table)
    return 0


CHECK_FOUND_ILLEGAL = 1  # the exit code when a checked layout breaks a Megatron rule


def cmd_check(args: argparse.Namespace) -> int:
    from autotune.space import policy_violations, violations

    space, workload = load_space_and_workload(args)
    from autotune.cli._options import with_recipe_defaults

    flags = knob_flags(args)
    if flags:
        if _stdin_has_text():  # found by a new-user pass: piped layouts were not checked, without a word. Said,
            # not refused: in a shell loop (`while read m; do autotune check --tp 2 ...; done < f`) stdin is the loop's
            print("autotune check: note: stdin holds text that is not read: the knob flags give the layout to check "
                  "(leave them out to check one JSON layout per stdin line)", file=sys.stderr)
        given = [flags]
    else:
        lines = sys.stdin if sys.stdin is not None else []  # a closed stdin (`<&-`) is an empty one
        given = [_given(number, line) for number, line in enumerate(lines, 1) if line.strip()]
        if not given:  # found by review: an empty stdin printed nothing and exited 0, as if all were checked
            raise ConfigError("no layout to check: give one JSON object per line on stdin (echo '{\"tp\": 2}' | "
                              "autotune check ...) or knob flags (--tp 2 --ep 8)")
    any_illegal = False
    for values in given:
        config, filled = with_recipe_defaults(values, workload, space.domains)
        bad = violations(config, workload)
        policy = policy_violations(config, workload, space.policy)
        any_illegal = any_illegal or bool(bad)
        print(json.dumps({"config": config.to_dict(), "legal": not bad, "filled_from_recipe": filled,
                          "violations": [v.to_dict() for v in bad], "policy": [v.to_dict() for v in policy]}))
    # exit 1 when a layout is illegal, as a linter does: `autotune check --tp 2 ... && submit` must not submit an
    # illegal layout (it exited 0 with "legal": false). Exit 2 stays for input that could not be checked at all.
    return CHECK_FOUND_ILLEGAL if any_illegal else 0


def _stdin_has_text() -> bool:
    """Whether stdin holds bytes already written (a file, or a pipe with data in it), found without reading it
    (stdin stays as it was, for a shell loop's next `read`) and without waiting for a writer: a terminal, an empty
    pipe or a writer not yet done is taken as empty."""
    import fcntl
    import os
    import stat
    import struct
    import termios

    try:
        fd = sys.stdin.fileno()
        if os.isatty(fd):
            return False
        mode = os.fstat(fd)
        if stat.S_ISREG(mode.st_mode):
            return mode.st_size > os.lseek(fd, 0, os.SEEK_CUR)
        if stat.S_ISFIFO(mode.st_mode) or stat.S_ISSOCK(mode.st_mode):
            return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0] > 0
    except (AttributeError, OSError, ValueError):  # no stdin, a closed one, or one that is no real file
        pass
    return False


def _given(number: int, line: str) -> dict:
    """The knobs a stdin line gives, checked (a bad line is one error naming its number): only those it names,
    so that the others are filled from the recipe, not from LayoutConfig's defaults."""
    from autotune.config import LayoutConfig

    try:
        value, problem = loads_flagged(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"stdin line {number} is not JSON ({exc.msg})") from None
    except RecursionError:
        raise ConfigError(f"stdin line {number} nests too deeply") from None
    if problem:  # a key twice: which value is meant?
        raise ConfigError(f"stdin line {number} is not usable JSON: {problem}")
    try:
        config = LayoutConfig.from_mapping(value)  # checks every key and value
        return {name: getattr(config, name) for name in value}
    except ConfigError as exc:
        raise ConfigError(f"stdin line {number}: {exc}") from None
