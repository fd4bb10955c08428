"""Options shared by several commands: the workload (model and cluster), knob flags and --fix."""

from __future__ import annotations

import argparse
from typing import Any

from autotune.cli._checks import ascii_int, float_in, int_in, knob_int, positive
from autotune.config import (ALL_KNOBS, MAX_NETWORK_GBPS, MIN_NETWORK_GBPS, PERF_BOOL_KNOBS, PERF_CHOICES,
                             PERF_KNOBS, RECOMPUTE_MODULES, LayoutConfig, Workload, coerce_knob)
from autotune.errors import ConfigError

MAX_GPUS_PER_NODE = 72


def add_workload_options(parser: argparse.ArgumentParser, model_required: bool = True) -> None:
    group = parser.add_argument_group("model and cluster (defaults come from the model's recipe)")
    group.add_argument("--model", required=model_required,
                       help="catalog name (see `autotune models`), or the path of a search-space YAML file written "
                            "like those in search_spaces/")
    group.add_argument("--space", help="a search-space YAML file to use instead of the model's own")
    group.add_argument("--gpus", type=positive("--gpus"), help="GPUs one trial uses (the world size)")
    # a bound on the flag, not on stored studies: the largest NVLink domain (NVL72) is a rack of 4-GPU nodes
    group.add_argument("--gpus-per-node", type=int_in(1, MAX_GPUS_PER_NODE, "--gpus-per-node"),
                       help="GPUs per node (default: the recipe's, or the GPU type's with --gpu: 8, 4 on NVL72)")
    group.add_argument("--gpu", help="GPU type: a100, h100, h200, b200, b300, gb200, gb300")
    group.add_argument("--global-batch-size", type=positive("--global-batch-size"),
                       help="sequences per optimizer step (default: the recipe's)")
    group.add_argument("--seq-length", type=positive("--seq-length"),
                       help="tokens per sequence (default: the recipe's)")
    group.add_argument("--precision", help="bf16, fp8, mxfp8 or nvfp4")
    group.add_argument("--network-gbps", type=float_in(MIN_NETWORK_GBPS, MAX_NETWORK_GBPS, what="--network-gbps"),
                       help="the cluster's scale-out bandwidth per GPU, GB/s one direction, when it is not the "
                            "GPU type's DGX figure (e.g. 25 for a DGX H100 with half its NICs); default: the "
                            "space file's defaults.network_gbps, else the GPU type's")


def add_fix_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fix", action="append", default=[], metavar="KNOB=V",
                        help="pin a knob to one value (repeatable), e.g. --fix tp=2 --fix recompute=none")


def add_knob_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("one layout (a knob left out takes the recipe's value; --no-FLAG switches one off)")
    for name, meaning in (("tp", "tensor parallel size"), ("pp", "pipeline parallel size"),
                          ("vpp", "virtual pipeline stages per pipeline rank (1: not interleaved)"),
                          ("cp", "context parallel size"), ("ep", "expert parallel size (MoE models)"),
                          ("etp", "expert tensor parallel size (MoE models)"), ("mbs", "micro-batch size")):
        group.add_argument(f"--{name}", type=knob_int(f"--{name}"), help=meaning)
    group.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None, help="sequence parallelism")
    group.add_argument("--dist-opt", action=argparse.BooleanOptionalAction, default=None,
                       help="the distributed optimizer (optimizer state sharded over data-parallel ranks)")
    group.add_argument("--recompute", choices=("none", "selective", "full"), help="activation recomputation")
    group.add_argument("--recompute-method", choices=("uniform", "block"), help="how full recompute picks its layers")
    group.add_argument("--recompute-num-layers", type=knob_int("--recompute-num-layers"),
                       help="full recompute: layers per recomputed group (uniform) or recomputed layers per "
                            "pipeline stage (block)")
    add_perf_knob_flags(parser)


BOOL_KNOB_HELP = {"ep_overlap": "expert-parallel communication overlap", "shared_expert_overlap": "shared-expert overlap",
                  "tp_comm_overlap": "tensor-parallel communication overlap",
                  "overlap_grad_reduce": "gradient reduce-scatter overlap",
                  "overlap_param_gather": "parameter all-gather overlap"}


def add_perf_knob_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("performance knobs (left out: the recipe's value; see README)")
    group.add_argument("--dispatcher", choices=PERF_CHOICES["dispatcher"], help="MoE token dispatcher and flex backend")
    group.add_argument("--dispatcher-sms", type=ascii_int, metavar="N", help="SMs of the flex dispatcher")
    group.add_argument("--cuda-graph", choices=PERF_CHOICES["cuda_graph"], help="CUDA graphs: none, a TE scope, full iteration")
    group.add_argument("--recompute-modules", metavar="M+M",
                       help="selective recompute modules, '+'-joined: " + ", ".join(RECOMPUTE_MODULES))
    group.add_argument("--cp-comm-type", choices=PERF_CHOICES["cp_comm_type"], help="context-parallel communication")
    group.add_argument("--cpu-offload-layers", type=ascii_int, metavar="N", help="layers whose activations go to the CPU")
    for name in PERF_BOOL_KNOBS:  # every on/off knob config declares gets its --X / --no-X pair
        group.add_argument(f"--{name.replace('_', '-')}", action=argparse.BooleanOptionalAction, default=None,
                           help=BOOL_KNOB_HELP[name])


def knob_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The knob flags the user gave (those left unset are absent)."""
    return {name: getattr(args, name) for name in ALL_KNOBS if getattr(args, name, None) is not None}


def with_recipe_defaults(given: dict[str, Any], workload: Workload,
                         domains: dict[str, tuple[Any, ...]] | None = None) -> tuple[LayoutConfig, dict[str, Any]]:
    """The layout `given` describes, every knob it leaves out taken from the model's recipe, and those
    taken values (what `estimate` and `check` print, so nobody mistakes a filled knob for a given one).

    Where the recipe's value belongs to a knob the user changed, the filled value follows the change:
    sequence parallelism is on exactly when TP > 1 (every Bridge recipe pairs them); a recipe's virtual
    pipeline belongs to its PP; recompute method and layers exist only with full recompute; expert
    knobs stay 1 on a dense model. The performance knobs keep the recipe's values (None). A knob
    whose space (`domains`) allows one value only takes that value (the vTrain spaces: no sequence
    parallelism, whatever TP): the space says what the cluster's framework can run.
    """
    recipe = LayoutConfig.from_mapping(workload.model.defaults.layout).to_dict()
    values = {name: coerce_knob(name, value) for name, value in given.items()}
    filled: dict[str, Any] = {}

    def fill(name: str, value: Any) -> None:
        if name not in values:
            only = (domains or {}).get(name, ())
            # a knob that does not exist in this layout (None) stays absent whatever the space lists
            values[name] = filled[name] = only[0] if len(only) == 1 and value is not None else value

    for name in ("tp", "pp", "cp", "ep", "etp", "mbs", "dist_opt", "recompute"):
        fill(name, recipe[name])
    fill("sp", values["tp"] > 1 if values["tp"] != recipe["tp"] else recipe["sp"])
    fill("vpp", recipe["vpp"] if values["pp"] == recipe["pp"] else 1)
    full = values["recompute"] == "full"
    fill("recompute_method", (recipe["recompute_method"] or "uniform") if full else None)
    fill("recompute_num_layers", (recipe["recompute_num_layers"] or 1) if full else None)
    return LayoutConfig.from_mapping(values), filled


def filled_text(filled: dict[str, Any]) -> str:
    """`dist_opt=true, sp=false` for the line that says which knobs came from the recipe."""
    def text(value: Any) -> str:
        return "null" if value is None else ("true" if value is True else "false" if value is False else str(value))

    return ", ".join(f"{name}={text(value)}" for name, value in filled.items())


def parse_fixes(items: list[str]) -> dict[str, Any]:
    fixes: dict[str, Any] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--fix takes KNOB=VALUE, got {item!r}")
        name = name.strip().replace("-", "_")
        if name in PERF_KNOBS:
            raise ConfigError(f"--fix pins layout knobs; performance knob {name} is tuned by the knob phase "
                              "(--knob-share 0 keeps every one at the recipe's value)")
        coerced = coerce_knob(name, value.strip())
        if name in fixes and fixes[name] != coerced:  # the last one silently won: which one is meant?
            raise ConfigError(f"--fix pins {name} twice, to {fixes[name]!r} and {coerced!r}: which one is meant?")
        fixes[name] = coerced
    return fixes


def load_space_and_workload(args: argparse.Namespace):
    """The (SearchSpace, Workload) that the workload options describe, --fix applied."""
    from autotune.space import load_space, make_workload

    space = load_space(args.space or args.model)
    if args.space and args.model and space.model.name != args.model:
        raise ConfigError(f"--space {args.space} describes {space.model.name}, not --model {args.model}")
    fixes = parse_fixes(getattr(args, "fix", []) or [])
    if fixes:
        space = space.fixed(fixes)
    workload = make_workload(space, gpus=args.gpus, gpus_per_node=args.gpus_per_node, gpu=args.gpu,
                             global_batch_size=args.global_batch_size, seq_length=args.seq_length,
                             precision=args.precision, network_gbps=getattr(args, "network_gbps", None))
    return space, workload


def workload_summary(workload: Workload) -> str:
    c = workload.cluster
    # a cluster's own bandwidth (--network-gbps or the space file) is shown: it changes the estimate
    network = f", scale-out {c.network_gbps:g} GB/s/GPU" if c.network_gbps is not None else ""
    return (f"{workload.model.display_name} on {c.gpus}x {c.gpu.display_name} ({c.nodes} node(s) of "
            f"{c.gpus_per_node}{network}), GBS {workload.global_batch_size}, seq {workload.seq_length}, "
            f"{workload.precision}")
