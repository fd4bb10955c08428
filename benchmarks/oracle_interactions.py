"""How much the search loses by not knowing which pairs of knobs interact (a diagnostic, issue 15).

The `interact` landscapes of search_quality.py give eight pairs of knobs (backends/_landscapes.py
INTERACTING_PAIRS: TP x EP, PP x VPP, MBS x recompute, ...) a seeded effect per combination of their values
(+-12%), out of the 45 pairs the ten knobs make (six of 28 on a dense model, where EP and ETP do not
vary). The search's GP (controller/surrogate.py) has to find those pairs from its own runs: one variance
per pair of knobs, fitted by marginal likelihood. This script runs the same studies twice, auto @40
through the real controller:

  shipped   the search as it is;
  oracle    the GP told the truth, which no study on a real cluster can know: the eight pairs carry the
            landscape's variance (0.12**2 / 3, log), the others and the per-value part none (their lower
            bounds), the landscape's layout and run noise are the white noise, no hyperparameter is fitted.

The recommendation is judged alike in both (the pooling GP of controller/recommend.py is left as shipped).
The oracle is one idealised variant, not every perfect model: it also drops the search's floor under a knob
value's own effect (an exploration device), counts the per-layout deviation (+-2%, shared by a layout's
repeated runs) as white noise, and on a dense model a pair with a knob that does not vary (TP x EP with
EP 1) is a per-value effect of the other knob, which its kernel leaves out.

The gap between them is what this model of the interactions would be worth; the shipped GP's own
pair variances at its last fit show how far 40 runs go towards finding the pairs ("true pairs found": of
the k largest fitted variances, k the true pairs among the GP's inputs, the share that are true; "by
chance": k / all pairs, what a random ranking would give). The oracle is put in by replacing the GP's
initial kernel and fit in this process's worker processes only; the product has no such option.

    python benchmarks/oracle_interactions.py --first-seed 5 --seeds 40 --procs 2     # ~20 min on 2 cores
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from search_quality import CASES, RUN_NOISE, Truth, run_study  # noqa: E402

from autotune.backends._landscapes import INTERACTING_PAIRS  # noqa: E402
from autotune.cli._checks import int_in, positive  # noqa: E402

# the columns of controller/state.knob_codes_of, in its order (recompute's kind, method and depth as one)
KNOB_COLUMNS = ("tp", "pp", "vpp", "cp", "ep", "etp", "sp", "mbs", "recompute", "dist_opt")
PAIR_LOG_VAR = 0.12 ** 2 / 3  # one interacting pair: uniform within +-12% (the landscape's bias)
NOISE_LOG_VAR = RUN_NOISE ** 2 / 3 + 0.02 ** 2 / 3  # run noise and the per-layout deviation, both uniform
TRUE_PAIRS = {frozenset(p) for p in INTERACTING_PAIRS}

_columns: list[np.ndarray] = []  # names of the GP's input columns in this worker's current study
_last_pairs: list[np.ndarray] = []  # the shipped GP's fitted pair variances at its last fit


def _install(oracle: bool, patch=setattr) -> None:
    """Pool initializer: watch (shipped) or replace (oracle) the search's GP in this worker process. Only the
    search's GP (one variance per pair of knobs) is touched: the recommendation's pooling GP
    (controller/recommend.py, one shared pair variance) stays as shipped in both runs, so both judge their
    runs alike. `patch` is setattr in a worker (a test passes pytest's monkeypatch.setattr)."""
    from autotune.controller import state, surrogate

    gp_codes = state.SearchState.gp_codes

    def named_gp_codes(self):
        if self._gp_codes is None:
            codes = self.knob_codes()
            assert codes.shape[1] == len(KNOB_COLUMNS), "knob_codes_of changed: update KNOB_COLUMNS"
            _columns[:] = [np.array(KNOB_COLUMNS)[state.varying_mask(codes)]]
        return gp_codes(self)

    patch(state.SearchState, "gp_codes", named_gp_codes)
    fit = surrogate.ResidualGP.fit
    if not oracle:
        def watched_fit(self, codes, residual, optimize=True):
            fit(self, codes, residual, optimize)
            if self.per_pair:
                _last_pairs[:] = [np.asarray(self.model.kernel_.k1.pair, dtype=np.float64)]

        patch(surrogate.ResidualGP, "fit", watched_fit)
        return

    from sklearn.gaussian_process.kernels import WhiteKernel

    shipped_kernel = surrogate.ResidualGP._initial_kernel

    def true_kernel(self, n_knobs):
        if not self.per_pair:  # the pooling GP
            return shipped_kernel(self, n_knobs)
        assert len(_columns[0]) == n_knobs, "the GP's inputs are not the search state's varying knobs"
        # a pair that does not interact: its variance's lower bound
        pair = np.where(true_pair_mask(_columns[0]), PAIR_LOG_VAR, surrogate.PAIR_BOUNDS[0])
        lowest = surrogate.VARIANCE_BOUNDS[0]  # no per-value part of its own: the pairs' cells carry every effect
        return surrogate.knob_cell_kernel(lowest, pair, lowest) + WhiteKernel(NOISE_LOG_VAR, (1e-5, 0.01))

    def fixed_fit(self, codes, residual, optimize=True):
        fit(self, codes, residual, optimize and not self.per_pair)

    patch(surrogate.ResidualGP, "_initial_kernel", true_kernel)
    patch(surrogate.ResidualGP, "fit", fixed_fit)


def _true_pairs_found() -> tuple[float, float]:
    """Of the k largest fitted pair variances (k: the true pairs among the GP's inputs; EP and ETP do not
    vary on a dense model), the share that are true pairs, and that share by chance (k / pairs); nan
    without a fit. Ties at the k-th value (variances collapsed to their bound) share the places left
    among them evenly, as a random order would."""
    if not _last_pairs or not _columns:
        return float("nan"), float("nan")
    true = true_pair_mask(_columns[0])
    return precision_at_true_count(_last_pairs[0], true), float(true.mean())


def true_pair_mask(names: np.ndarray) -> np.ndarray:
    """For each pair of the GP's input columns (`names`, in the order of surrogate.knob_pairs, the order of
    its per-pair variances): does the landscape make that pair interact."""
    from autotune.controller.surrogate import knob_pairs

    a, b = knob_pairs(len(names))
    return np.array([frozenset((names[i], names[j])) in TRUE_PAIRS for i, j in zip(a, b)])


def precision_at_true_count(score: np.ndarray, true: np.ndarray) -> float:
    """Share of true items among the k highest scores (k = true items), ties at the threshold split evenly."""
    k = int(true.sum())
    threshold = np.sort(score)[::-1][k - 1]
    above, tied = score > threshold, score == threshold
    places = k - int(above.sum())  # places left for the tied items
    return float((true[above].sum() + places * true[tied].mean()) / k)


def physics_pair_ranks(case: str) -> tuple[list[int], int]:
    """Where the landscape's interacting pairs rank among the cost model's own pairs of knobs (1 = the pair
    whose combinations of values the model's prediction depends on most beyond each value's own effect):
    over the legal layouts predicted to fit, the per-value effects of log throughput are removed by
    backfitting, and each pair is scored by the spread of the remainder's means per combination of its
    values. A prior on pair variances taken from the physics would help only if these ranks were high."""
    from autotune.controller.state import knob_codes_of, varying_mask
    from autotune.cost import estimate_many
    from autotune.cost._arrays import LayoutArrays
    from autotune.space import enumerate_legal, load_space, make_workload

    model, gpus = case.split(":")[0], int(case.split(":")[1])
    space = load_space(model)
    workload = make_workload(space, gpus=gpus)
    legal = enumerate_legal(space, workload).configs
    predicted = estimate_many(workload, legal)
    codes = knob_codes_of(LayoutArrays.from_configs(legal))[predicted.fits]
    varying = varying_mask(codes)
    codes, names = codes[:, varying], np.array(KNOB_COLUMNS)[varying]
    rest = np.log(predicted.tokens_per_s_per_gpu[predicted.fits])
    rest = rest - rest.mean()
    for _ in range(20):  # backfitting: each knob's per-value means taken out in turn until they settle
        for column in codes.T:
            _, cell = np.unique(column, return_inverse=True)
            rest = rest - (np.bincount(cell, rest) / np.bincount(cell))[cell]
    spread = {}
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            _, cell = np.unique(codes[:, [i, j]], axis=0, return_inverse=True)
            cell = cell.ravel()
            spread[frozenset((names[i], names[j]))] = float((np.bincount(cell, rest) / np.bincount(cell))[cell].std())
    ranked = sorted(spread, key=lambda p: -spread[p])
    return sorted(ranked.index(p) + 1 for p in TRUE_PAIRS if p in spread), len(ranked)


def _study(job: tuple) -> tuple:
    case, seed = job
    model, gpus = case.split(":")[0], int(case.split(":")[1])
    _last_pairs.clear()
    with tempfile.TemporaryDirectory() as directory:
        curve, _ooms, _ms, found, _wall = run_study(Truth(model, gpus, "interact", 1000 + seed), "interact", seed,
                                                    "auto", 40, directory)
    return case, seed, curve[-1], found, *_true_pairs_found()


def _run(oracle: bool, jobs: list, procs: int) -> dict:
    context = multiprocessing.get_context("spawn")  # a fork would carry this process's state into the workers
    with context.Pool(procs, initializer=_install, initargs=(oracle,)) as pool:
        return {(r[0], r[1]): r[2:] for r in pool.imap_unordered(_study, jobs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first-seed", type=int_in(0, 10 ** 9, "--first-seed"), default=5)
    parser.add_argument("--seeds", type=positive("--seeds"), default=40)
    parser.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    parser.add_argument("--procs", type=int_in(1, 64, "--procs"), default=2)
    args = parser.parse_args()
    jobs = [(c, s) for c in args.cases for s in range(args.first_seed, args.first_seed + args.seeds)]
    jobs.sort(key=lambda j: -int(j[0].split(":")[1]))  # the large cases first, so the two processes end together
    shipped = _run(False, jobs, args.procs)
    oracle = _run(True, jobs, args.procs)
    print(f"interact landscapes, auto @40, seeds {args.first_seed}-{args.first_seed + args.seeds - 1}: ratio = true "
          f"throughput of the recommendation / optimum; found = best layout measured / optimum")
    print(f"{'case':<14} {'shipped ratio':>13} {'worst':>6} {'found':>6} {'true pairs found':>16} {'by chance':>9}   "
          f"{'oracle ratio':>12} {'worst':>6} {'found':>6}")
    for case in args.cases:
        keys = [k for k in shipped if k[0] == case]
        s, o = [shipped[k] for k in keys], [oracle[k] for k in keys]
        print(f"{case:<14} {statistics.mean(r[0] for r in s):>13.4f} {min(r[0] for r in s):>6.3f} "
              f"{statistics.mean(r[1] for r in s):>6.4f} {np.nanmean([r[2] for r in s]):>16.2f} "
              f"{np.nanmean([r[3] for r in s]):>9.2f}   "
              f"{statistics.mean(r[0] for r in o):>12.4f} {min(r[0] for r in o):>6.3f} "
              f"{statistics.mean(r[1] for r in o):>6.4f}")
    for case in args.cases:
        ranks, pairs = physics_pair_ranks(case)
        print(f"{case}: the landscape's interacting pairs rank {', '.join(map(str, ranks))} of {pairs} among the "
              f"cost model's own pairs (physics_pair_ranks)")
    diff = [oracle[k][0] - shipped[k][0] for k in shipped]
    print(f"all {len(diff)} studies: oracle - shipped {statistics.mean(diff):+.4f} (standard error "
          f"{statistics.stdev(diff) / math.sqrt(len(diff)) if len(diff) > 1 else float('nan'):.4f}); below 0.95: "
          f"{sum(r[0] < 0.95 for r in shipped.values())} -> {sum(r[0] < 0.95 for r in oracle.values())}")


if __name__ == "__main__":
    main()
