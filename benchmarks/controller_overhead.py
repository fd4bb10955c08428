"""The controller's own time per dispatched trial, on a quiet machine (issue 15: <= 50 ms at 64 GPUs).

One `auto` study of 40 trials per case on a hidden `mixed` landscape, through the real controller
(SQLite file, Optuna storage, the in-process reference dispatcher, so no Ray and no trial time is
counted): proposals, surrogate and calibration fits, screening, bookkeeping. search_quality.py prints
the same figure, but it runs many studies at once and its numbers carry that load.

    python benchmarks/controller_overhead.py
    python benchmarks/controller_overhead.py --concurrency 4    # four runs in flight (the search believes them)
    python benchmarks/controller_overhead.py --repeats 5        # each case five times (default three)

Each case runs `--repeats` times (the same seeded study, so the same trials) and prints the median and
the range: on a shared machine one run can be 30% off, and the median is the figure to compare.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from search_quality import RUN_NOISE, Truth  # noqa: E402

from autotune.cli._checks import positive  # noqa: E402
from autotune.controller.session import build_controller, create_study  # noqa: E402
from autotune.space import _enumerate  # noqa: E402
from autotune.storage import Repository  # noqa: E402

CASES = [("qwen3_30b", 16), ("qwen3_30b", 64), ("llama3_70b", 64)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=positive("--concurrency"), default=1,
                        help="runs in flight at once (in-process dispatcher)")
    parser.add_argument("--repeats", type=positive("--repeats"), default=3,
                        help="studies per case; the median is printed, with the range")
    args = parser.parse_args()
    print(f"{'case':<16} {'setup s':>8} {'ms/trial':>9}   (median of {args.repeats}, range; "
          f"{args.concurrency} run(s) in flight)")
    for model, gpus in CASES:
        truth = Truth(model, gpus, "mixed", 1000)
        setups, per_trial = [], []
        for _ in range(args.repeats):
            setup_s, ms = _study(truth, args.concurrency)
            setups.append(setup_s)
            per_trial.append(ms)
        print(f"{model}@{gpus:<6} {statistics.median(setups):>8.1f} {statistics.median(per_trial):>9.1f}   "
              f"({min(per_trial):.1f}-{max(per_trial):.1f})", flush=True)


def _study(truth: Truth, concurrency: int) -> tuple[float, float]:
    """One 40-trial study: its set-up seconds and the controller's ms per trial."""
    with tempfile.TemporaryDirectory() as directory:
        repo = Repository.open(f"sqlite:///{directory}/overhead.db")
        # the landscape enumerated the legal set already, and enumerate_legal keeps its last result: forget
        # it, so the set-up time includes the one enumeration a real study's start pays
        _enumerate._LAST = None
        started = time.perf_counter()
        study = create_study(repo, name="overhead", space=truth.space, workload=truth.workload, budget=40,
                             sampler="auto", backend="simulate", seed=0,
                             backend_options={"landscape_seed": 1000, "landscape": "mixed",
                                              "seconds_per_trial": 0.0, "run_noise": RUN_NOISE})
        controller = build_controller(repo, study, dispatcher="inprocess", max_concurrent=concurrency)
        setup_s = time.perf_counter() - started
        summary = controller.run()
        repo.close()
    return setup_s, 1000 * summary.controller_s_per_trial


if __name__ == "__main__":
    main()
