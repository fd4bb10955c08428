"""Time the cost model over whole legal sets (issue 3 target: every legal qwen3_30b layout on 64 GPUs < 1 s).

Prints layouts, the best of N wall-clock times of `estimate_many` (enumeration excluded), and the
time per layout. Run: python benchmarks/cost_model_speed.py
"""

from __future__ import annotations

import time

from autotune.cost import LayoutArrays, estimate_many
from autotune.space import enumerate_legal, load_space, make_workload

CASES = [("qwen3_30b", 16), ("qwen3_30b", 64), ("llama3_70b", 64), ("deepseek_v3", 1024)]
REPEATS = 3


def main() -> None:
    print(f"{'model':<12} {'gpus':>5} {'layouts':>8} {'arrays s':>9} {'model s':>8} {'us/layout':>10}")
    for model, gpus in CASES:
        space = load_space(model)
        workload = make_workload(space, gpus=gpus)
        configs = enumerate_legal(space, workload).configs
        start = time.perf_counter()
        arrays = LayoutArrays.from_configs(configs)
        to_arrays = time.perf_counter() - start
        best = float("inf")
        for _ in range(REPEATS):
            start = time.perf_counter()
            estimate_many(workload, arrays)
            best = min(best, time.perf_counter() - start)
        print(f"{model:<12} {gpus:>5} {len(configs):>8,} {to_arrays:>9.3f} {best:>8.3f} "
              f"{1e6 * (best + to_arrays) / len(configs):>10.2f}")


if __name__ == "__main__":
    main()
