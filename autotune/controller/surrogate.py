"""What the search learns from measurements: a throughput surrogate and a memory feasibility model.

Throughput: a Gaussian process (scikit-learn) on the residual log(measured / predicted), with a
constant mean, over the layouts' knob values (one integer code per knob: TP, PP, VPP, CP, EP, ETP,
SP, MBS, recompute, distributed optimizer). Its kernel (KnobCellKernel) makes two layouts covary by
how many knob values, and how many pairs of knob values, they share: a second-order additive model
in the knobs (Duvenaud et al. 2011, "Additive Gaussian processes"). What a cluster does that the
calibrated physics misses is mostly a knob value, or a combination of two (TP with EP, PP with VPP,
MBS with recompute), being better or worse than predicted; one measurement then moves every layout
that shares a value or a pair of values with it, and a layout that shares none keeps the prior's
mean and uncertainty (only the knobs that vary over the legal set are inputs: SearchState.gp_codes).
The cost model (calibrated: controller/physics.py) is the GP's prior mean, so the physics (NVLink
spans, GEMM shapes, bubbles) reaches every layout through it. A white-noise term absorbs run-to-run
noise.

The search's GP gives each pair of knobs its own variance (PER_PAIR in controller/state.py; the pooling
GP of the recommendation keeps one shared by all pairs). With one shared variance, a cluster on which
TP interacts with EP and PP with VPP spreads that variance evenly over all D (D - 1) / 2 pairs of
knobs (45 with ten knobs): the few pairs that interact get too little of it and the others some they
do not need, so a run teaches little about its interacting pairs' other layouts. With one each,
fitted by marginal likelihood with a normal prior on each pair's log variance around the pairs' mean
(sd PAIR_SHRINK_LOG_STD: 40 runs cannot pin 45 variances alone), the runs pick out the pairs that
matter. Chosen on the tuning seeds 5-24 of benchmarks/search_quality.py
(240 studies, budget 40, search_quality.last.txt): mean ratio 0.9777 -> 0.9799 (paired difference
+0.0022, standard error 0.0020), studies >= 0.95 206 -> 213 of 240, the worst row (qwen3_30b@64
interact) 0.944 -> 0.964; the `regime` rows, whose effects are not pairs (a threshold on TP x CP, on
the tokens of an expert GEMM), lost up to 0.5 points. A prior sd of 0.75 instead of 1.5 did not gain
(0.9784 against 0.9806 on the 193 studies both ran).

Why not a smooth kernel on physics features (GEMM width, tokens per expert, NVLink spans, bubble
share...): an ARD Matern over 17 such features was this module's first surrogate; with <= 40 runs
its length scales overfit (features declared irrelevant on a handful of points, posteriors 1-2% wide
at layouts four knobs away). On the tuning seeds of benchmarks/search_quality.py (seeds 5-14,
qwen3_30b on 16 GPUs; figures in search_quality.last.txt) it ended 2-8 points below the knob-cell
kernel by median on three of the four landscape families and 0.7 points above it on `regime`; the
two kernels summed did not do better than the knob cells alone.

The search's GP keeps a floor under the per-value part (KNOB_VALUE_MIN_LOG_STD: one knob value's own
effect has at least that sd, log). Fitted by marginal likelihood on runs that all sit in the region the
prior likes, the per-value variance shrinks to a few percent, and a knob value no run has tried (a
recompute mode, a micro-batch size) gets too little doubt for expected improvement ever to try it,
although the prior can be wrong about one value alone by 25% and more. The pooling GP of the
recommendation (recommend.py) has no floor: it judges layouts that ran, it does not explore.
Chosen on the tuning seeds 5-14 of benchmarks/search_quality.py (mean ratio over the 12 rows at
budget 40; the table in search_quality.last.txt): no floor 0.9717, 0.05 0.9748 (with the pooling GP
floored too), 0.07 0.9757, 0.10 0.9764; 0.07 is kept because 0.10 costs the `interact` landscape on
qwen3_30b@16 five points (0.970 -> 0.921) against 2.3 for 0.07 (more exploration of single values
leaves fewer runs for pairs of values). With the floor, the kernel's variance at a layout sharing no
knob value with any run is D * floor**2 + the pair part, above PRIOR_LOG_STD**2 (the sd `predict`
gives before the first fit, when no run exists and the search does not consult the GP).

Memory: log(measured peak / predicted peak) = global error + structural-family error + noise, a
linear-Gaussian model with the memory model's stated error as its prior. A measured OOM is a
censored observation (the peak was at least the GPU's memory). The probability that a layout fits
is then P(log peak < log limit), used as a constraint by the search: a promising layout predicted
just above the limit is worth a run, one predicted safely below it still carries a risk.
"""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from autotune._numbers import is_positive_finite
from autotune.cost import calibration as cost_calibration
# the run noise and the straggler rule live below the controller, where the replay backend reads them too
from autotune._run_noise import (NOISE_LOG_STD, STRAGGLER_MAX, STRAGGLER_RATE,  # noqa: F401  (re-exported)
                                 pooled_noise_log_std, run_noise_and_stragglers, run_noise_log_std, straggler_runs)

# Prior error of the (uncalibrated) throughput model between layouts of one study, log scale:
# ~+-15% (1 sd), the GP's amplitude (split between knob values and pairs of knob values).
PRIOR_LOG_STD = 0.15
# Prior of the study-wide offset (the GP's constant mean): the cost model's error on a model or
# system it was not fitted on, the sd of its 80% prediction interval (leave-one-model-out residuals).
OFFSET_PRIOR_LOG_STD = cost_calibration.interval_log_std(cost_calibration.THROUGHPUT_LOG_RATIO_P10,
                                                         cost_calibration.THROUGHPUT_LOG_RATIO_P90)
# Memory model: global error prior (1 sd, log: the sd of the memory model's 80% prediction interval,
# cost.calibration.MEMORY_LOG_RATIO_*), extra per structural family, and within a family.
MEMORY_GLOBAL_STD = cost_calibration.interval_log_std(cost_calibration.MEMORY_LOG_RATIO_P10,
                                                      cost_calibration.MEMORY_LOG_RATIO_P90)
MEMORY_FAMILY_STD = 0.06
MEMORY_WITHIN_STD = 0.02
FAMILY = ("tp", "pp", "cp", "ep", "etp")
VARIANCE_BOUNDS = (1e-4, 0.25)  # of each part of the kernel: 1% to 50% (1 sd, log)
PAIR_BOUNDS = (1e-7, 0.1)  # of one pair of knobs' variance when each pair has its own
PAIR_SHRINK_LOG_STD = 1.5  # prior sd of a pair's log variance around the pairs' mean (_shrunk_lbfgs)
# up to this many knobs, a prediction looks the kernel up by which knobs two layouts share (2**D patterns)
PATTERN_TABLE_MAX_KNOBS = 14
# the search GP's floor on one knob value's own effect (1 sd, log; module doc)
KNOB_VALUE_MIN_LOG_STD = 0.07


def knob_cell_kernel(main: float, pair, main_min: float = VARIANCE_BOUNDS[0]):
    """A scikit-learn kernel over integer knob codes (one column per knob):

        k(x, y) = main * (knobs equal) / D + sum over pairs of knobs p of pair_p * (both knobs of p equal)

    `main` is the variance of the per-value effects (no lower than `main_min`); `pair` that of the
    per-pair-of-values effects: one number shared by the D (D - 1) / 2 pairs of knobs (pair_p = pair /
    (D choose 2)), or an array with one variance per pair of knobs (in the order of `knob_pairs`), so
    that the few pairs of knobs that interact on a cluster can carry the interactions and the others
    none (PAIR_SHRINK_LOG_STD). Hyperparameters are fitted by the GP's marginal likelihood. k(x, x) =
    main + total pair variance. scikit-learn is imported here, late: the read side builds one only to
    pool a study's runs (recommend.py).
    """
    from sklearn.gaussian_process.kernels import Hyperparameter, Kernel

    per_pair = np.ndim(pair) > 0

    class KnobCellKernel(Kernel):
        def __init__(self, main: float = 0.01, pair=0.01) -> None:
            self.main, self.pair = main, pair

        @property
        def hyperparameter_main(self):
            return Hyperparameter("main", "numeric", (main_min, VARIANCE_BOUNDS[1]))

        @property
        def hyperparameter_pair(self):
            if per_pair:  # np.size: scikit-learn's theta setter turns a one-element array into a float
                return Hyperparameter("pair", "numeric", PAIR_BOUNDS, int(np.size(self.pair)))
            return Hyperparameter("pair", "numeric", VARIANCE_BOUNDS)

        def pair_variances(self, d: int) -> np.ndarray:
            """The variance of each pair of knobs (order of knob_pairs(d))."""
            n = pair_count(d)
            return np.asarray(self.pair, dtype=np.float64) if per_pair else np.full(n, self.pair / max(1, n))

        def __call__(self, X, Y=None, eval_gradient=False):
            if eval_gradient and Y is not None:
                raise ValueError("the gradient is only defined for Y=None")
            Y = X if Y is None else Y
            d = X.shape[1]
            if per_pair and np.size(self.pair) != pair_count(d):
                raise ValueError(f"{np.size(self.pair)} pair variances for {d} knobs ({pair_count(d)} pairs)")
            if not eval_gradient and d <= PATTERN_TABLE_MAX_KNOBS:
                return self._by_pattern(X, Y, d)
            equal = X[:, None, :] == Y[None, :, :]
            main_share = equal.sum(axis=2) / d
            if per_pair:
                if not eval_gradient:
                    # sum over pairs a < b of pair_ab e_a e_b = e'Ve / 2: one (N M, D) x (D, D) product instead
                    # of an N x M x pairs array (predictions over thousands of layouts)
                    e = equal.astype(np.float64)
                    return self.main * main_share + 0.5 * np.einsum("ijk,ijk->ij", e @ self._pair_matrix(d), e)
                a, b = knob_pairs(d)
                both = (equal[:, :, a] & equal[:, :, b]).astype(np.float64)
                K = self.main * main_share + both @ self.pair
                return K, np.concatenate([(self.main * main_share)[:, :, None], both * self.pair], axis=2)
            same = equal.sum(axis=2).astype(np.float64)
            pair_share = same * (same - 1) / max(1, d * (d - 1))
            K = self.main * main_share + self.pair * pair_share
            if not eval_gradient:
                return K
            # d K / d log(variance), the parametrisation scikit-learn optimises
            return K, np.stack([self.main * main_share, self.pair * pair_share], axis=2)

        def _pair_matrix(self, d: int) -> np.ndarray:
            """V with V[a, b] = V[b, a] = the variance of the pair of knobs (a, b), zero diagonal: the pair
            part of k(x, y) is e'Ve / 2 with e the 0/1 vector of the knobs x and y share."""
            a, b = knob_pairs(d)
            V = np.zeros((d, d))
            V[a, b] = V[b, a] = self.pair_variances(d)
            return V

        def _by_pattern(self, X, Y, d: int) -> np.ndarray:
            """k(x, y) depends only on which knobs x and y share: one value per pattern of shared knobs
            (a D-bit number), looked up. Predictions over thousands of layouts compare D columns instead
            of building a layouts x runs x knobs array (4-5x faster at D = 10)."""
            V = self._pair_matrix(d)
            bits = ((np.arange(2 ** d)[:, None] >> np.arange(d)) & 1).astype(np.float64)
            # per pattern: main x share of knobs equal + sum over pairs a < b of pair_ab e_a e_b (= e'Ve / 2)
            table = self.main * bits.sum(axis=1) / d + 0.5 * np.einsum("pk,pk->p", bits @ V, bits)
            pattern = np.zeros((len(X), len(Y)), dtype=np.int32)
            for j in range(d):
                pattern |= (X[:, j][:, None] == Y[:, j][None, :]).astype(np.int32) << j
            return table[pattern]

        def diag(self, X):
            # one knob has no pair: the pair part is 0 there, as in __call__
            return np.full(X.shape[0], self.main + (float(np.sum(self.pair)) if X.shape[1] > 1 else 0.0))

        def is_stationary(self) -> bool:
            return False

        def __repr__(self) -> str:
            total = float(np.sum(self.pair))
            return f"KnobCellKernel(main={math.sqrt(self.main):.3g}**2, pair={math.sqrt(total):.3g}**2" \
                   + (f" over {np.size(self.pair)} pairs, largest {math.sqrt(float(np.max(self.pair))):.3g}**2)" if per_pair else ")")

    return KnobCellKernel(main, pair)


def pair_count(d: int) -> int:
    """How many pairs of knobs `d` knobs make (d choose 2)."""
    return d * (d - 1) // 2


def knob_pairs(d: int) -> tuple[np.ndarray, np.ndarray]:
    """The pairs of knob columns (a < b), in the order of the kernel's per-pair variances."""
    a, b = np.triu_indices(d, k=1)
    return a, b


HYPER_MAX_ITERATIONS = 25  # warm-started from the last fit, a few iterations settle the hyperparameters


def _bounded_lbfgs(obj_func, initial_theta, bounds):
    """sklearn's default optimiser with an iteration cap (the default runs to convergence, ~10x slower)."""
    from scipy.optimize import minimize

    result = minimize(obj_func, initial_theta, method="L-BFGS-B", jac=True, bounds=bounds,
                      options={"maxiter": HYPER_MAX_ITERATIONS})
    return result.x, result.fun


def _shrunk_lbfgs(pairs: slice):
    """_bounded_lbfgs on the marginal likelihood plus a normal prior of sd PAIR_SHRINK_LOG_STD on each
    pair's log variance around their mean (a random effect): with 40 runs and 45 pairs of knobs, the
    likelihood alone would give a pair all the variance on two runs; the prior lets a pair that the runs
    say interacts stand out, and keeps the others near the common level until they say otherwise."""
    def optimiser(obj_func, initial_theta, bounds):
        def penalised(theta):
            value, grad = obj_func(theta)
            deviation = theta[pairs] - theta[pairs].mean()
            grad = grad.copy()
            grad[pairs] += deviation / PAIR_SHRINK_LOG_STD ** 2  # the deviations sum to 0: no mean term
            return value + 0.5 * float(deviation @ deviation) / PAIR_SHRINK_LOG_STD ** 2, grad

        return _bounded_lbfgs(penalised, initial_theta, bounds)

    return optimiser


class ResidualGP:
    """GP regression of log(measured / prior) on integer knob codes (one column per knob), with a
    constant mean and the knob-cell kernel (see the module docstring)."""

    def __init__(self, prior_std: float = PRIOR_LOG_STD, noise_std: float = NOISE_LOG_STD,
                 value_min_std: float = 0.0, per_pair: bool = False) -> None:
        import sklearn.gaussian_process  # noqa: F401  (late, but at construction: not in the first proposal)

        self.per_pair = per_pair
        self.model = None
        self.prior_std = prior_std
        self.noise_std = noise_std
        self.value_min_std = value_min_std
        self.kernel = None  # built at the first fit, when the number of knobs is known
        self.offset = 0.0
        self.n = 0

    def _initial_kernel(self, n_knobs: int):
        """The prior's error split evenly between knob values and pairs of values until the data say
        otherwise; with `value_min_std`, the per-value part starts at (and keeps) at least D *
        value_min_std**2 (the kernel's main part is shared by the D knobs), so the total starts above the
        prior's error then (module doc)."""
        from sklearn.gaussian_process.kernels import WhiteKernel

        half = self.prior_std ** 2 / 2
        main_min = max(VARIANCE_BOUNDS[0], n_knobs * self.value_min_std ** 2)
        n_pairs = pair_count(n_knobs)
        pair = np.full(n_pairs, half / n_pairs) if self.per_pair and n_pairs > 1 else half
        return knob_cell_kernel(max(half, main_min), pair, main_min) + \
            WhiteKernel(self.noise_std ** 2, (1e-5, 0.01))

    def fit(self, codes: np.ndarray, residual: np.ndarray, optimize: bool = True) -> None:
        from sklearn.gaussian_process import GaussianProcessRegressor

        self.n = len(residual)
        # The constant mean: shrink the average residual toward 0 (the prior) while data are few.
        self.offset = float(residual.sum() / (len(residual) + (NOISE_LOG_STD / OFFSET_PRIOR_LOG_STD) ** 2))
        if self.kernel is None:
            self.kernel = self._initial_kernel(codes.shape[1])
        kernel = self.model.kernel_ if self.model is not None else self.kernel
        pairs = np.size(kernel.k1.pair)
        optimiser = _shrunk_lbfgs(slice(1, 1 + pairs)) if pairs > 1 else _bounded_lbfgs
        gp = GaussianProcessRegressor(kernel, optimizer=optimiser if optimize and self.n >= 4 else None,
                                      normalize_y=False, copy_X_train=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convergence warnings at the variance bounds are expected
            gp.fit(codes, residual - self.offset)
        self.model = gp

    @property
    def noise_var(self) -> float:
        if self.model is None:
            return NOISE_LOG_STD ** 2
        return float(self.model.kernel_.k2.noise_level)

    def predict(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of the latent residual (noise excluded) at `codes`."""
        if self.model is None:
            return np.full(len(codes), self.offset), np.full(len(codes), self.prior_std)
        mean, std = self.model.predict(codes, return_std=True)
        latent = np.sqrt(np.maximum(std ** 2 - self.noise_var, 1e-8))
        return mean + self.offset, latent

    def sample(self, codes: np.ndarray, values: list[np.ndarray], rng: np.random.Generator) -> np.ndarray:
        """One joint draw of the latent residual at `codes` from the GP's posterior (Thompson sampling).

        The knob-cell kernel is finite-dimensional: a weight per knob value (variance main / D) and one per
        pair of knob values (variance pair_p of its pair of knobs: KnobCellKernel.pair_variances) give
        exactly its covariance. A prior draw is
        then one weight vector, and the posterior draw follows by Matheron's rule (Wilson et al. 2020,
        "Efficiently sampling functions from Gaussian process posteriors"): f_post(x) = f(x) + k(x, X) c
        with c = (K + s2 I)^-1 (y - f(X) - e), e ~ N(0, s2 I). k(x, X) c is a sum over the same cells
        (each cell's weight plus its variance times the sum of c over the runs in that cell), so a draw
        over N layouts costs one lookup per knob and per pair of knobs: O(N D^2), no N x runs matrix.
        `values`: per knob column, the sorted distinct codes of the legal set (every code in `codes` and in
        the runs among them). Before the first fit it is a draw from the prior (the starting kernel)."""
        from scipy.linalg import cho_solve

        d = codes.shape[1]
        cells = (self.model.kernel_ if self.model is not None else self._initial_kernel(d)).k1
        X = self.model.X_train_ if self.model is not None else codes[:0]
        sizes = [len(v) for v in values]
        at = [np.searchsorted(v, codes[:, k]) for k, v in enumerate(values)]
        at_train = [np.searchsorted(v, X[:, k]) for k, v in enumerate(values)]
        # (variance of one weight, cell index of every layout, of every run, number of cells) per cell family
        groups = [(cells.main / d, at[k], at_train[k], sizes[k]) for k in range(d)]
        if d > 1:
            pair_var = cells.pair_variances(d)
            groups += [(v, at[k] * sizes[m] + at[m], at_train[k] * sizes[m] + at_train[m], sizes[k] * sizes[m])
                       for v, k, m in zip(pair_var, *knob_pairs(d))]
        weights = [rng.normal(0.0, math.sqrt(var), n) for var, _, _, n in groups]
        c = np.zeros(0)  # before the first fit: no run to condition on
        if self.model is not None:
            prior_at_train = sum(w[train] for w, (_, _, train, _) in zip(weights, groups))
            eps = rng.normal(0.0, math.sqrt(self.noise_var), len(X))
            c = cho_solve((self.model.L_, True), self.model.y_train_ - prior_at_train - eps)
        draw = np.zeros(len(codes))
        for w, (var, cell, train, n) in zip(weights, groups):
            draw += (w + var * np.bincount(train, weights=c, minlength=n))[cell]
        return self.offset + draw

    def believing(self, pending: np.ndarray) -> "ResidualGP":
        """This GP as if the runs in flight at `pending` (knob codes) had measured what it expects of
        them (the kriging believer, Ginsbourger, Le Riche and Carraro 2010): the mean stays, the
        uncertainty at those layouts and at the layouts sharing knob values with them shrinks, so a
        proposal made while runs are in flight is not their near copy. Same hyperparameters, no
        optimisation; the GP itself is unchanged (its next fit replaces the beliefs by the runs)."""
        from sklearn.gaussian_process import GaussianProcessRegressor

        if self.model is None or not len(pending):
            return self
        believed = self.model.predict(pending)  # the mean, offset excluded (what the fit saw)
        gp = GaussianProcessRegressor(self.model.kernel_, optimizer=None, normalize_y=False, copy_X_train=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gp.fit(np.vstack([self.model.X_train_, pending]), np.concatenate([self.model.y_train_, believed]))
        clone = copy.copy(self)
        clone.model = gp
        return clone


@dataclass
class MemoryFeasibility:
    """P(layout fits) from predicted peaks, measured peaks and OOMs (see the module docstring)."""

    predicted_gib: np.ndarray
    family: np.ndarray
    limit_gib: float
    global_std: float = MEMORY_GLOBAL_STD
    observations: list[tuple[int, float]] = field(default_factory=list)  # (layout, log ratio)
    peaks_gib: dict[int, float] = field(default_factory=dict)  # layout -> largest measured peak of its runs
    _mean: np.ndarray | None = None
    _std: np.ndarray | None = None
    _p_fit: dict[float, np.ndarray] = field(default_factory=dict)  # by headroom, until the next observation
    _z_fit: dict[float, np.ndarray] = field(default_factory=dict)  # likewise
    _log_predicted: np.ndarray | None = None  # log predicted_gib, once: p_fit runs over every legal layout

    def observe(self, i: int, peak_gib: float | None, oom: bool) -> None:
        predicted = float(self.predicted_gib[i])
        if oom:  # censored: it needed at least the GPU's memory; placed a little above the bound
            ratio = max(self.limit_gib, peak_gib or 0.0) / predicted * 1.03
        elif is_positive_finite(peak_gib):
            ratio = peak_gib / predicted
            self.peaks_gib[i] = max(peak_gib, self.peaks_gib.get(i, 0.0))
        else:
            return
        self.observations.append((i, math.log(ratio)))
        self._mean = None
        self._p_fit, self._z_fit = {}, {}

    def _solve(self) -> None:
        n_layouts = len(self.predicted_gib)
        if not self.observations:
            self._mean = np.zeros(n_layouts)
            self._std = np.full(n_layouts, math.hypot(self.global_std, MEMORY_FAMILY_STD, MEMORY_WITHIN_STD))
            return
        rows = np.array([i for i, _ in self.observations])
        y = np.array([r for _, r in self.observations])
        families, column = np.unique(self.family[rows], return_inverse=True)
        k = len(families)
        design = np.zeros((len(rows), 1 + k))
        design[:, 0] = 1.0
        design[np.arange(len(rows)), 1 + column] = 1.0
        prior_precision = np.diag([1 / self.global_std ** 2] + [1 / MEMORY_FAMILY_STD ** 2] * k)
        noise = MEMORY_WITHIN_STD ** 2
        cov = np.linalg.inv(prior_precision + design.T @ design / noise)
        coef = cov @ design.T @ y / noise
        lookup = np.full(int(self.family.max()) + 1, -1)
        lookup[families] = np.arange(k)
        col = lookup[self.family]
        known = col >= 0
        mean = np.full(n_layouts, coef[0])
        var = np.full(n_layouts, cov[0, 0] + MEMORY_FAMILY_STD ** 2)
        c = col[known] + 1
        mean[known] += coef[c]
        var[known] = cov[0, 0] + cov[c, c] + 2 * cov[0, c]
        self._mean, self._std = mean, np.sqrt(var + noise)

    def log_ratio(self) -> tuple[np.ndarray, np.ndarray]:
        if self._mean is None:
            self._solve()
        return self._mean, self._std

    def expected_peak_gib(self) -> np.ndarray:
        mean, _ = self.log_ratio()
        return self.predicted_gib * np.exp(mean)

    def z_fit(self, headroom_gib: float = 0.0) -> np.ndarray:
        """Per layout, how many sd its log peak lies below the limit less `headroom_gib` (P(fit) = Phi(z))."""
        if headroom_gib not in self._z_fit:
            mean, std = self.log_ratio()
            if self._log_predicted is None:
                self._log_predicted = np.log(self.predicted_gib)
            margin = math.log(max(self.limit_gib - headroom_gib, 1e-9)) - self._log_predicted - mean
            self._z_fit[headroom_gib] = margin / std
        return self._z_fit[headroom_gib]

    def p_fit(self, headroom_gib: float = 0.0) -> np.ndarray:
        """P(fit) of every layout; `fits` and `p_fit_at` answer the search's questions without it."""
        from scipy.special import ndtr

        if headroom_gib not in self._p_fit:
            self._p_fit[headroom_gib] = ndtr(self.z_fit(headroom_gib))
        return self._p_fit[headroom_gib]

    def p_fit_at(self, rows: np.ndarray, headroom_gib: float = 0.0) -> np.ndarray:
        """P(fit) of layouts `rows` only: the normal CDF costs ~4 ms over 180,000 layouts (64 GPUs),
        and the search weighs a few thousand after each measurement."""
        from scipy.special import ndtr

        if headroom_gib in self._p_fit:
            return self._p_fit[headroom_gib][rows]
        return ndtr(self.z_fit(headroom_gib)[rows])

    def fits(self, p_min: float, headroom_gib: float = 0.0) -> np.ndarray:
        """Mask of the layouts with P(fit) >= p_min (0 <= p_min < 1), compared as z >= Phi^-1(p_min): no
        CDF evaluated (at p_min = 1 it is empty, where rounding makes p_fit() 1.0 beyond z = 8.3)."""
        from scipy.special import ndtri

        return self.z_fit(headroom_gib) >= ndtri(p_min)
