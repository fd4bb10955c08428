"""Joint tuning of layout and performance knobs against layout-only tuning, same budget (issue 16).

On `knobs` landscapes (backends/_landscapes.py): a layout's truth is the `mixed` landscape over the cost
model with the recipe's knob values, and each performance knob's true effect is drawn from the seed, not
from the cost model (the simulate backend never applies cost/knobs.py there). `auto` runs twice per seed:
with the knob phase (--knob-share 0.1, the default) and layout only (0). Printed: the true throughput of
each study's recommendation over the true optimum (the best of the 150 truly fastest layouts, each with
every legal setting of one or two knobs), median and worst over seeds, and the joint/layout-only gain.

    python benchmarks/knob_tuning.py [--seeds 5] [--budget 40] [--plot benchmarks/knob_tuning.png]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from autotune.backends._landscapes import Landscape  # noqa: E402
from autotune.controller.recommend import default_headroom_gib  # noqa: E402
from autotune.controller.session import build_controller, create_study  # noqa: E402
from autotune.cost import estimate, estimate_many  # noqa: E402
from autotune.space import enumerate_legal, load_space, make_workload  # noqa: E402
from autotune.space.perf import variants  # noqa: E402
from autotune.storage import Repository  # noqa: E402

TOP_LAYOUTS = 150


class KnobTruth:
    def __init__(self, model: str, gpus: int, seed: int) -> None:
        self.space = load_space(model)
        self.workload = make_workload(self.space, gpus=gpus)
        self.land = Landscape(seed, "knobs")
        self.limit = self.workload.cluster.gpu.memory_gib
        self.headroom = default_headroom_gib(self.workload)
        legal = enumerate_legal(self.space, self.workload).configs
        predicted = estimate_many(self.workload, legal)
        speed = predicted.tokens_per_s_per_gpu * self.land.speed_factors(legal, self.workload)
        memory = np.array([self.land.memory_factor(c) for c in legal]) * predicted.peak_mem_gib
        speed[memory > self.limit - self.headroom] = 0.0
        self.layout_best = float(speed.max())
        top = [legal[i] for i in np.argsort(-speed)[:TOP_LAYOUTS]]
        self.best = max(self.speed(c) for layout in top for c in [layout, *variants(layout, self.space, self.workload)])

    def speed(self, config) -> float:
        """True tokens/s/GPU of `config` (0 when it does not keep the headroom)."""
        memory = estimate(self.workload, config).peak_mem_gib * self.land.memory_factor(config)
        if memory > self.limit - self.headroom:
            return 0.0
        base = estimate(self.workload, config.layout_only()).tokens_per_s_per_gpu
        return base * self.land.speed_factor(config, self.workload)


def run(truth: KnobTruth, seed: int, budget: int, knob_share: float, directory: str) -> tuple[float, int]:
    repo = Repository.open(f"sqlite:///{directory}/knobs-{seed}-{knob_share}.db")
    study = create_study(repo, name="bench", space=truth.space, workload=truth.workload, budget=budget,
                         sampler="auto", backend="simulate", seed=seed,
                         backend_options={"landscape_seed": 1000 + seed, "landscape": "knobs",
                                          "seconds_per_trial": 0.0, "noise": 0.01, "run_noise": 0.05},
                         options={"knob_share": knob_share})
    summary = build_controller(repo, study, dispatcher="inprocess").run()
    trials = repo.trials(study.id, dispatched_only=True)
    knob_trials = sum(t.strategy_note == "knobs" for t in trials)
    config = next(t for t in trials if t.config_key == summary.best.config_key)
    from autotune.config import LayoutConfig

    value = truth.speed(LayoutConfig.from_mapping(config.config))
    repo.close()
    return value / truth.best, knob_trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen3_30b")
    parser.add_argument("--gpus", type=int, default=16)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=40)
    parser.add_argument("--knob-share", type=float, default=0.1, help="the joint run's knob share (default 0.1, the study default)")
    parser.add_argument("--plot", help="write a PNG of the ratios per seed")
    args = parser.parse_args()
    from rich.console import Console
    from rich.progress import Progress

    rows = []
    with tempfile.TemporaryDirectory() as directory, Progress(console=Console(stderr=True)) as progress:
        task = progress.add_task("studies", total=2 * args.seeds)
        for seed in range(args.seeds):
            start = time.perf_counter()
            truth = KnobTruth(args.model, args.gpus, 1000 + seed)
            joint, knob_trials = run(truth, seed, args.budget, args.knob_share, directory)
            progress.advance(task)
            layout_only, _ = run(truth, seed, args.budget, 0.0, directory)
            progress.advance(task)
            rows.append((seed, joint, layout_only, knob_trials, truth.layout_best / truth.best,
                         time.perf_counter() - start))
    print(f"{args.model}@{args.gpus}, budget {args.budget}, auto (knob share {args.knob_share:g}), knobs landscape (true knob effects drawn "
          f"independently of the cost model); ratio = true throughput of the recommendation / true optimum")
    print(f"{'seed':>4} {'joint':>7} {'layout-only':>12} {'knob trials':>12} {'best layout, recipe knobs':>26}")
    for seed, joint, layout_only, knob_trials, ceiling, _ in rows:
        print(f"{seed:>4} {joint:>7.3f} {layout_only:>12.3f} {knob_trials:>12} {ceiling:>26.3f}")
    joint = np.array([r[1] for r in rows])
    layout_only = np.array([r[2] for r in rows])
    print(f"median   joint {np.median(joint):.3f}  layout-only {np.median(layout_only):.3f}")
    print(f"worst    joint {joint.min():.3f}  layout-only {layout_only.min():.3f}")
    print(f"joint / layout-only: median {np.median(joint / layout_only):.3f}, "
          f"joint ahead on {int((joint > layout_only).sum())} of {len(rows)} seeds")
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        x = np.arange(len(rows))
        ax.bar(x - 0.2, layout_only, 0.4, label="layout only")
        ax.bar(x + 0.2, joint, 0.4, label=f"layout + knobs (knob phase {args.knob_share:.0%})")
        ax.set_xticks(x, [f"seed {r[0]}" for r in rows])
        ax.set_ylim(min(0.8, float(min(joint.min(), layout_only.min())) - 0.02), 1.0)
        ax.set_ylabel("true throughput / true optimum")
        ax.set_title(f"{args.model}@{args.gpus}, budget {args.budget}: joint vs layout-only")
        # below the axes: inside, it hides the tops of the bars near 1.0
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
