"""Search quality on landscapes that are NOT the tuner's own cost model (issue 8).

Each landscape distorts the cost model with seeded per-knob-value biases (up to +-12%), per-layout
noise (+-2%) and a memory-model error (+-5% per structural family), hidden from the tuner (they live
in the simulate backend's options). Per case and sampler, studies of budget 40 run through the real
controller (SQLite file, local Ray), one per seed, and the script prints the median over seeds of
  ratio      best true throughput found / best true throughput of the whole legal set
  oom share  dispatched trials that ran out of memory
  ms/trial   the controller's own time per dispatched trial (proposal, bookkeeping, storage)

    python benchmarks/search_quality.py                  # the full table: 3 cases x 5 seeds x 3 samplers
    python benchmarks/search_quality.py --seeds 2 --cases qwen3_30b:16
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from autotune.backends.simulate import HiddenLandscape  # noqa: E402
from autotune.config import LayoutConfig  # noqa: E402
from autotune.controller.session import build_controller, create_study  # noqa: E402
from autotune.cost import estimate_many  # noqa: E402
from autotune.space import enumerate_legal, load_space, make_workload  # noqa: E402
from autotune.storage import Repository  # noqa: E402

CASES = ["qwen3_30b:16", "qwen3_30b:64", "llama3_70b:64"]
SAMPLERS = ["auto", "tpe", "random"]
BUDGET = 40


def truth(model: str, gpus: int, seed: int):
    """True throughput of every legal layout under the hidden landscape (0 where it does not fit)."""
    space = load_space(model)
    workload = make_workload(space, gpus=gpus)
    legal = enumerate_legal(space, workload).configs
    predicted = estimate_many(workload, legal)
    land = HiddenLandscape(seed)
    speed = predicted.tokens_per_s_per_gpu * land.speed_factors(legal)
    memory = np.array([land.memory_factor(c) for c in legal]) * predicted.peak_mem_gib
    speed[memory > workload.cluster.gpu.memory_gib] = 0.0
    return space, workload, {c.key(): s for c, s in zip(legal, speed)}, float(speed.max())


def run_study(model, gpus, seed, sampler, directory):
    space, workload, true_speed, best = TRUTH[(model, gpus, seed)]
    url = f"sqlite:///{directory}/{model}-{gpus}-{seed}-{sampler}.db"
    repo = Repository.open(url)
    study = create_study(repo, name="bench", space=space, workload=workload, budget=BUDGET, sampler=sampler,
                         backend="simulate", seed=seed,
                         backend_options={"landscape_seed": 1000 + seed, "seconds_per_trial": 0.0, "noise": 0.01})
    summary = build_controller(repo, study).run()
    trials = repo.trials(study.id, dispatched_only=True)
    found = max((true_speed.get(LayoutConfig.from_mapping(t.config).key(), 0.0)
                 for t in trials if t.status == "completed"), default=0.0)
    repo.close()
    return found / best, summary.counts["oom"] / max(1, summary.counts["dispatched"]), \
        1000 * summary.controller_s_per_trial, summary.counts["rejected"]


TRUTH: dict = {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--cases", nargs="*", default=CASES)
    parser.add_argument("--samplers", nargs="*", default=SAMPLERS)
    args = parser.parse_args()
    import ray

    ray.init(address="local", num_cpus=2, num_gpus=64, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    print(f"{'case':<15} {'sampler':<7} {'median ratio':>12} {'min ratio':>9} {'OOM share':>9} "
          f"{'ms/trial':>8} {'rejected/study':>14} {'wall s':>7}")
    with tempfile.TemporaryDirectory() as directory:
        for case in args.cases:
            model, gpus = case.split(":")[0], int(case.split(":")[1])
            for seed in range(args.seeds):
                TRUTH[(model, gpus, seed)] = truth(model, gpus, 1000 + seed)
            for sampler in args.samplers:
                start = time.perf_counter()
                results = [run_study(model, gpus, seed, sampler, directory) for seed in range(args.seeds)]
                ratios, ooms, ms, rejected = zip(*results)
                print(f"{case:<15} {sampler:<7} {statistics.median(ratios):>12.3f} {min(ratios):>9.3f} "
                      f"{statistics.median(ooms):>9.1%} {statistics.median(ms):>8.1f} "
                      f"{statistics.median(rejected):>14.0f} {time.perf_counter() - start:>7.1f}", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
