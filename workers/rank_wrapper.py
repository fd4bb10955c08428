"""Wraps one rank's worker in Nsight Systems when that rank is chosen (torchrun sets RANK).

    torchrun ... --no-python python -m workers.rank_wrapper --nsys-ranks 0 --nsys-out DIR -- \\
        python -m workers.launcher --spec ... --result ...

The capture range is the CUDA profiler API, which Megatron-Bridge opens and closes around the
measured steps when profiling.use_nsys_profiler=true (profile_step_start / profile_step_end).
"""

from __future__ import annotations

import argparse
import os
import sys


def nsys_command(output_prefix: str, command: list[str]) -> list[str]:
    # --cuda-graph-trace=node: a kernel launched inside a CUDA graph is recorded as itself; the default (graph) keeps
    # one row per graph launch and none of its kernels, which under-counts compute and hides NCCL in graphed layouts
    return ["nsys", "profile", "-s", "none", "-t", "nvtx,cuda", "--cuda-graph-trace=node",
            "--capture-range=cudaProfilerApi", "--capture-range-end=stop", "--force-overwrite=true",
            "-o", output_prefix, *command]


def wrapped(argv: list[str], rank: int) -> list[str]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nsys-ranks", type=lambda s: {int(r) for r in s.split(",") if r}, default=set())
    parser.add_argument("--nsys-out", default=".")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if rank in args.nsys_ranks:
        return nsys_command(os.path.join(args.nsys_out, f"rank{rank}"), command)
    return command


def main() -> None:
    command = wrapped(sys.argv[1:], int(os.environ.get("RANK", "0")))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
