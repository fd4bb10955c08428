"""Time the enumeration of the legal set (issue 2 target: deepseek_v3 / qwen3_235b on 1024 GPUs < 2 s).

Prints, per case, the candidates, legal layouts and the best of N wall-clock times.
Run: python benchmarks/enumerate_space.py
"""

from __future__ import annotations

import time

from autotune.space import enumerate_legal, load_space, make_workload

CASES = [("qwen3_30b", 16), ("qwen3_30b", 64), ("llama3_70b", 64), ("qwen3_235b", 1024), ("deepseek_v3", 1024)]
REPEATS = 3


def main() -> None:
    print(f"{'model':<12} {'gpus':>5} {'candidates':>11} {'legal':>8} {'best s':>7}")
    for model, gpus in CASES:
        space = load_space(model)
        workload = make_workload(space, gpus=gpus)
        best = float("inf")
        for _ in range(REPEATS):
            start = time.perf_counter()
            legal = enumerate_legal(space, workload)
            best = min(best, time.perf_counter() - start)
        print(f"{model:<12} {gpus:>5} {legal.candidates:>11,} {len(legal.configs):>8,} {best:>7.3f}")


if __name__ == "__main__":
    main()
