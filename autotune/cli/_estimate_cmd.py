"""`autotune estimate`: the cost model's prediction for one layout."""

from __future__ import annotations

import argparse
import json

from autotune.cli._options import (add_knob_flags, add_workload_options, filled_text, knob_flags,
                                   load_space_and_workload, with_recipe_defaults)
from autotune.errors import IllegalLayoutError


def register(sub) -> None:
    p = sub.add_parser("estimate", help="predict step time, throughput, MFU and memory of one layout")
    add_workload_options(p)
    add_knob_flags(p)
    p.add_argument("--json", action="store_true",
                   help="print the estimate (step time, throughput, MFU, memory terms) as JSON")
    p.set_defaults(handler=cmd_estimate)


def cmd_estimate(args: argparse.Namespace) -> int:
    from autotune.cost import estimate
    from autotune.space import policy_violations, violations

    space, workload = load_space_and_workload(args)
    layout, filled = with_recipe_defaults(knob_flags(args), workload, space.domains)
    bad = violations(layout, workload)
    if bad:
        details = "; ".join(f"{v.rule}: {v.message}" for v in bad)
        raise IllegalLayoutError(f"illegal layout {layout.short()}: {details}", bad)
    result = estimate(workload, layout)
    payload = {"model": workload.model.name, "workload": workload.to_dict(), "config": layout.to_dict(),
               "filled_from_recipe": filled,
               "policy": [v.to_dict() for v in policy_violations(layout, workload, space.policy)],
               **result.to_dict()}
    if args.json:
        print(json.dumps(payload, indent=2))
        return 0
    _print_table(workload, layout, result, filled)
    return 0


def _print_table(workload, layout, result, filled) -> None:
    from rich.console import Console
    from rich.table import Table

    from autotune.cli._options import workload_summary

    console = Console()
    console.print(workload_summary(workload), markup=False)  # the model's name is text
    console.print(f"layout: [bold]{layout.short()}[/bold]")
    if filled:
        console.print(f"not given, so taken from the recipe (or following the knobs given: SP with TP > 1, VPP with PP) or the space's only value: {filled_text(filled)}",
                      markup=False)
    def tokens(value: float) -> str:  # a sequence of a billion tokens runs at 0.0067 tokens/s, not "0"
        return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"

    console.print(f"step {result.step_time_s:.3f} s | {tokens(result.tokens_per_s_per_gpu)} tokens/s/GPU | "
                  f"{result.tflops_per_gpu:.0f} TFLOP/s/GPU | MFU {result.mfu:.1%} (of dense BF16 peak) | "
                  f"peak memory {result.peak_mem_gib:.1f} / {result.memory_limit_gib:g} GiB "
                  f"{'fits' if result.fits else '[red]does not fit[/red]'}")
    # the cost model's 80% prediction interval, from its held-out validation residuals
    (tokens_low, tokens_high), (mem_low, mem_high) = result.tokens_per_s_per_gpu_80, result.peak_mem_gib_80
    console.print(f"80% interval: {tokens(tokens_low)}-{tokens(tokens_high)} tokens/s/GPU | "
                  f"peak memory {mem_low:.1f}-{mem_high:.1f} GiB "
                  f"(benchmarks/validate_cost_model.py, leave-one-model-out)")
    table = Table(title="step time breakdown")
    table.add_column("term")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for term, seconds in result.breakdown.items():
        table.add_row(term, f"{seconds:.3f}", f"{seconds / result.step_time_s:.0%}")
    memory = Table(title="memory (GiB)")
    memory.add_column("term")
    memory.add_column("GiB", justify="right")
    for term, gib in result.memory.items():
        memory.add_row(term.removesuffix("_gib"), f"{gib:.2f}")
    console.print(table)
    console.print(memory)
