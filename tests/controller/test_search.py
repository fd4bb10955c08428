"""The search's parts without Ray: surrogate, memory feasibility, re-measurement, strategies on the
in-process dispatcher, and the sampler inside a plain Optuna study."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import optuna
import pytest

from autotune.backends._landscapes import Landscape
from autotune.config import LayoutConfig
import autotune.controller.loop as loop
from autotune.controller.recommend import default_headroom_gib, recommend
from autotune.controller.notes import REMEASURE
from autotune.controller.sampler import AutotuneSampler
from autotune.controller.session import build_controller, create_study, replay_coverage
from autotune.controller.state import SearchState
from autotune.controller.strategies import (AutoStrategy, Proposal, expected_improvement,
                                            remeasure_choice, remeasure_value)
from autotune.controller.surrogate import MemoryFeasibility, ResidualGP
from autotune.cost import estimate, estimate_many
from autotune.space import enumerate_legal, load_space, make_workload
from autotune.storage import Repository, Trial
from tests.conftest import allow_runs


@pytest.fixture(scope="module")
def qwen16():
    space = load_space("qwen3_30b")
    workload = make_workload(space, gpus=16)
    return space, workload, enumerate_legal(space, workload).configs


def _codes(rng, n, values=(1, 2, 4), knobs=6):
    return rng.choice(values, size=(n, knobs)).astype(np.float64)


def test_residual_gp_learns_a_pair_of_knob_values_at_layouts_it_never_measured():
    rng = np.random.default_rng(0)
    x = _codes(rng, 40)

    def truth(codes):  # what the prior misses: a combination of two knobs' values, plus one value alone
        return 0.2 * ((codes[:, 0] == 2) & (codes[:, 1] == 4)) - 0.1 * (codes[:, 2] == 4)

    y = truth(x) + rng.normal(0, 0.01, len(x))
    gp = ResidualGP()
    gp.fit(x, y)
    test = _codes(np.random.default_rng(1), 300)
    test = test[~(test[:, None, :] == x[None, :, :]).all(axis=2).any(axis=1)]  # unmeasured layouts only
    mean, std = gp.predict(test)
    cell = (test[:, 0] == 2) & (test[:, 1] == 4)
    assert cell.any() and (~cell).any()
    # the pair's +0.2, learnt (shrunk toward the prior) where it was never measured
    assert mean[cell].mean() - mean[~cell].mean() > 0.08
    truth_test = truth(test)
    assert np.abs(mean - truth_test).mean() < 0.75 * np.abs(truth_test - truth_test.mean()).mean()


def test_residual_gp_keeps_the_prior_at_a_layout_sharing_no_knob_value():
    rng = np.random.default_rng(0)
    x = _codes(rng, 20)
    gp = ResidualGP()
    gp.fit(x, 0.1 * (x[:, 0] == 4) + rng.normal(0, 0.01, len(x)))
    near_mean, near_std = gp.predict(x[:3])
    far_mean, far_std = gp.predict(np.full((1, x.shape[1]), 16.0))  # a value no run had, on every knob
    assert abs(far_mean[0] - gp.offset) < 1e-6
    assert far_std[0] > 3 * near_std.max()


def test_believing_runs_in_flight_shrinks_doubt_around_them_and_keeps_the_fit():
    """The kriging believer: a layout in flight is scored as if it had measured the GP's mean there, so
    the doubt at it and at layouts sharing its knob values shrinks, the means stay, the GP is untouched."""
    rng = np.random.default_rng(3)
    x = _codes(rng, 12)
    gp = ResidualGP()
    gp.fit(x, 0.1 * (x[:, 0] == 4) + rng.normal(0, 0.01, len(x)))
    pending = np.array([[8.0, 8.0, 8.0, 1.0, 2.0, 4.0]])  # three values no run had
    near = np.array([[8.0, 8.0, 8.0, 2.0, 2.0, 4.0]])  # one knob away from it
    far = np.array([[16.0, 16.0, 16.0, 16.0, 16.0, 16.0]])  # shares nothing with it
    before = [gp.predict(c) for c in (pending, near, far)]
    believed = gp.believing(pending)
    after = [believed.predict(c) for c in (pending, near, far)]
    assert after[0][1][0] < 0.5 * before[0][1][0]  # about what a run there would tell
    assert after[1][1][0] < 0.8 * before[1][1][0]
    assert after[2][1][0] == pytest.approx(before[2][1][0], rel=1e-6)
    for (m0, _), (m1, _) in zip(before, after):
        assert m1[0] == pytest.approx(m0[0], abs=1e-6)
    assert gp.predict(pending)[1][0] == before[0][1][0] and gp.believing(pending[:0]) is gp


@pytest.mark.parametrize("per_pair", [False, True])
def test_a_posterior_draw_has_the_gps_posterior_mean_and_covariance(per_pair):
    """Thompson sampling's draw (weight-space prior + Matheron's rule) is a draw from the GP's own
    posterior: over many draws, the mean and covariance at unmeasured and measured layouts match
    scikit-learn's predict (noise excluded), and the draw is reproducible from the generator. With a
    variance per pair of knobs too."""
    rng = np.random.default_rng(0)
    values = [np.array([1, 2, 4, 8]), np.array([1, 2]), np.array([0, 1, 2]), np.array([5, 7])]
    every = np.array(np.meshgrid(*values, indexing="ij")).reshape(len(values), -1).T.astype(np.float64)
    x = every[rng.choice(len(every), 12, replace=False)]
    gp = ResidualGP(per_pair=per_pair)
    gp.fit(x, 0.1 * (x[:, 0] == 4) * (x[:, 1] == 2) + rng.normal(0, 0.02, len(x)))
    at = every[:20]
    mean, cov = gp.model.predict(at, return_cov=True)
    cov -= gp.noise_var * np.eye(len(at))  # predict's covariance holds the white noise on its diagonal
    draws = np.array([gp.sample(at, values, rng) for _ in range(5000)]) - gp.offset
    scale = np.abs(cov).max()
    assert np.abs(draws.mean(axis=0) - mean).max() < 0.1 * math.sqrt(scale)
    assert np.abs(np.cov(draws.T) - cov).max() < 0.1 * scale
    # before the first fit, a draw from the prior: the starting kernel's variance, shared cells covarying
    fresh = np.array([ResidualGP(per_pair=per_pair).sample(every[[0, 0, -1]], values, rng) for _ in range(4000)])
    assert np.var(fresh[:, 0]) == pytest.approx(0.15 ** 2, rel=0.1)
    assert np.array_equal(fresh[:, 0], fresh[:, 1]) and abs(np.corrcoef(fresh[:, 0], fresh[:, 2])[0, 1]) < 0.1
    one = gp.sample(at, values, np.random.default_rng(5))
    assert np.array_equal(one, gp.sample(at, values, np.random.default_rng(5)))
    assert not np.array_equal(one, gp.sample(at, values, np.random.default_rng(6)))


def test_proposals_made_while_runs_are_in_flight_spread_out(qwen16):
    """Four proposals in a row with no result between them (four slots): believing the runs in flight,
    the four differ in more knobs from one another than the plain top four of expected improvement."""
    _, workload, legal = qwen16
    import autotune.controller.strategies as strategies

    closest = {True: [], False: []}  # per study: the fewest knobs in which two of its four proposals differ
    for seed in range(5, 9):
        for believe in (True, False):
            state = SearchState.build(workload, legal)
            strategy = AutoStrategy(40, seed=0)
            rng = np.random.default_rng(seed)
            for i in rng.choice(len(legal), 12, replace=False):  # twelve runs, 0.9-1.1x the prior
                state.mark_tried(legal[i].key())
                state.record_speed(legal[i], float(state.predicted.tokens_per_s_per_gpu[i] * rng.uniform(0.9, 1.1)))
            state.dispatched = 12
            old, strategies.BELIEVE_PENDING = strategies.BELIEVE_PENDING, believe
            try:
                batch = []
                for _ in range(4):
                    proposal = strategy.propose(state)
                    state.mark_tried(proposal.config.key())
                    batch.append(state.index[proposal.config.key()])
                    state.set_pending(legal[j].key() for j in batch)
            finally:
                strategies.BELIEVE_PENDING = old
            assert state.pending == set(batch)
            codes = state.knob_codes()[batch]
            closest[believe].append(min(int((codes[a] != codes[b]).sum()) for a in range(4) for b in range(a)))
    assert all(b >= p for b, p in zip(closest[True], closest[False]))
    assert sum(closest[True]) >= 1.5 * sum(closest[False])


def test_search_gp_keeps_doubt_about_a_knob_value_no_run_has_tried():
    """Thirty runs that agree with the prior make the fitted GP sure of every layout; the search's GP
    still gives a knob value no run had at least KNOB_VALUE_MIN_LOG_STD of doubt (the prior may be
    wrong about one value alone: a recompute mode, a micro-batch size), the pooling GP does not."""
    from autotune.controller.surrogate import KNOB_VALUE_MIN_LOG_STD

    rng = np.random.default_rng(3)
    x = _codes(rng, 30)
    y = rng.normal(0, 0.005, len(x))
    new_value = x[:1].copy()
    new_value[0, 0] = 8.0  # one knob at a value no run had; every other knob as a measured layout
    search, pooling = ResidualGP(value_min_std=KNOB_VALUE_MIN_LOG_STD), ResidualGP()
    search.fit(x, y)
    pooling.fit(x, y)
    assert search.predict(new_value)[1][0] >= 0.95 * KNOB_VALUE_MIN_LOG_STD
    assert pooling.predict(new_value)[1][0] < 0.5 * KNOB_VALUE_MIN_LOG_STD
    # a measured layout stays known: the floor is on what an unseen value may do, not on the noise
    assert search.predict(x[:1])[1][0] < 0.5 * KNOB_VALUE_MIN_LOG_STD


@pytest.mark.parametrize("pair", [0.03, np.linspace(0.001, 0.01, 15)], ids=["shared", "per-pair"])
def test_knob_cell_kernel_gradient_matches_finite_differences(pair):
    from autotune.controller.surrogate import knob_cell_kernel

    x = _codes(np.random.default_rng(2), 7)
    kernel = knob_cell_kernel(0.02, pair)
    _, grad = kernel(x, eval_gradient=True)
    assert grad.shape[2] == len(kernel.theta) == 1 + np.size(pair)
    for j in range(len(kernel.theta)):
        theta = kernel.theta.copy()
        theta[j] += 1e-6
        numeric = (kernel.clone_with_theta(theta)(x) - kernel(x)) / 1e-6
        assert np.allclose(numeric, grad[:, :, j], atol=1e-6)
    assert np.allclose(np.diag(kernel(x)), kernel.diag(x))
    # the kernel between two sets (the prediction's path) is the same function as the fit's (with gradient)
    y = _codes(np.random.default_rng(3), 5)
    assert np.allclose(kernel(np.vstack([x, y]), eval_gradient=True)[0][:7, 7:], kernel(x, y))
    one = kernel.clone_with_theta(kernel.theta)  # scikit-learn's round trip through theta keeps the kernel
    assert np.allclose(one(x, y), kernel(x, y))


@pytest.mark.parametrize("knobs", [1, 3, 16], ids=["one-knob", "pattern-table", "above-the-table"])
def test_the_kernels_prediction_paths_agree_with_its_definition(knobs):
    """k(x, y) = main x share of knobs equal + sum over pairs of knobs equal in both of their variance:
    the pattern table (up to PATTERN_TABLE_MAX_KNOBS knobs) and the direct path above it, against a loop."""
    from autotune.controller.surrogate import PATTERN_TABLE_MAX_KNOBS, knob_cell_kernel, knob_pairs

    assert (knobs <= PATTERN_TABLE_MAX_KNOBS) == (knobs < 16)
    rng = np.random.default_rng(knobs)
    x, y = rng.integers(0, 3, (9, knobs)), rng.integers(0, 3, (6, knobs)).astype(np.float64)  # codes of either type
    pairs = rng.uniform(0.001, 0.01, knobs * (knobs - 1) // 2)
    for pair in (pairs, 0.03):
        kernel = knob_cell_kernel(0.02, pair)
        variances = kernel.pair_variances(knobs)
        expected = np.array([[0.02 * np.mean(u == v) + sum(w for w, a, b in zip(variances, *knob_pairs(knobs))
                                                          if u[a] == v[a] and u[b] == v[b]) for v in y] for u in x])
        assert np.allclose(kernel(x, y), expected, rtol=1e-12, atol=1e-15)


def test_knob_cell_kernel_with_equal_pair_variances_is_the_shared_one():
    from autotune.controller.surrogate import knob_cell_kernel

    x = _codes(np.random.default_rng(4), 9)
    assert np.allclose(knob_cell_kernel(0.02, 0.03)(x), knob_cell_kernel(0.02, np.full(15, 0.002))(x))


def test_a_variance_per_pair_of_knobs_finds_the_pair_that_interacts():
    """What a cluster does beyond the knob values is a few pairs of knobs interacting, not all 15 (here:
    knobs 0 and 1, by their values together). With a variance per pair, the fit gives that pair the
    largest, and at layouts no run had the prediction is closer to the truth than with one variance
    shared by every pair (which spreads the interaction's variance over pairs that do not interact)."""
    from autotune.controller.surrogate import knob_pairs

    rng = np.random.default_rng(7)
    x = _codes(rng, 40)
    effect = {(a, b): rng.normal(0, 0.12) for a in (1, 2, 4) for b in (1, 2, 4)}

    def truth(codes):
        return np.array([effect[(a, b)] for a, b in codes[:, :2]])

    y = truth(x) + rng.normal(0, 0.02, len(x))
    shared, per_pair = ResidualGP(), ResidualGP(per_pair=True)
    shared.fit(x, y)
    per_pair.fit(x, y)
    variances = per_pair.model.kernel_.k1.pair_variances(6)
    a, b = knob_pairs(6)
    assert (a[np.argmax(variances)], b[np.argmax(variances)]) == (0, 1)
    test = _codes(np.random.default_rng(8), 400)
    test = test[~(test[:, None, :] == x[None, :, :]).all(axis=2).any(axis=1)]

    def error(gp):
        return np.abs(gp.predict(test)[0] - truth(test)).mean()

    assert error(per_pair) < 0.8 * error(shared)


def test_memory_feasibility_learns_a_family_error_and_treats_oom_as_censored():
    predicted = np.array([70.0, 75.0, 78.0, 70.0, 82.0])
    family = np.array([0, 0, 0, 1, 1])
    model = MemoryFeasibility(predicted, family, limit_gib=80.0)
    before = model.p_fit().copy()
    assert 0.5 < before[2] < 0.9 and 0.05 < before[4] < 0.5  # uncertain both ways before any run
    model.observe(0, 70.0 * 1.07, oom=False)  # family 0 needs 7% more than predicted
    after = model.p_fit()
    assert after[2] < 0.2 < before[2]  # 78 x 1.07 > 80: now it surely does not fit
    assert 0.3 < after[1] < 0.5  # 75 x 1.07 = 80.25: just over, a coin flip weighted by the family's error
    model.observe(3, None, oom=True)  # family 1 ran out of memory at 70 predicted
    assert model.p_fit()[4] < 0.05 and model.expected_peak_gib()[3] > 80.0
    # the search's questions, answered without the CDF over every layout, agree with P(fit)
    rows = np.array([4, 1, 2])
    for headroom in (0.0, 3.2):
        p = model.p_fit(headroom)
        assert np.allclose(model.p_fit_at(rows, headroom), p[rows])
        for p_min in (0.02, 0.3, 0.5, 0.9):
            assert np.array_equal(model.fits(p_min, headroom), p >= p_min)
    fresh = MemoryFeasibility(predicted, family, limit_gib=80.0)  # nothing cached yet: the same answers
    assert np.allclose(fresh.p_fit_at(rows, 2.0), MemoryFeasibility(predicted, family, 80.0).p_fit(2.0)[rows])


def test_expected_improvement_prefers_a_better_mean_and_more_uncertainty():
    ei = expected_improvement(np.array([0.0, 0.1, 0.0]), np.array([0.05, 0.05, 0.2]), incumbent=0.05)
    assert ei[1] > ei[0] and ei[2] > ei[0] and np.all(ei >= 0)


@pytest.mark.parametrize("means, expected", [
    ({1: (math.log(100), 1), 2: (math.log(99), 1), 3: (math.log(80), 1)}, 1),  # close: the best again
    ({1: (math.log(100), 2), 2: (math.log(99), 1)}, 2),  # the one with fewer runs
    ({1: (math.log(100), 1), 2: (math.log(80), 1)}, None),  # a clear winner: nothing to re-measure
    ({1: (math.log(100), 3), 2: (math.log(99.5), 3)}, None),  # both measured enough
])
def test_remeasure_rule(means, expected):
    assert remeasure_choice(means, noise_std=0.03) == expected


def test_remeasure_value_is_the_knowledge_gradient_of_one_more_run():
    close = {1: (math.log(100), 1), 2: (math.log(99), 1)}
    far = {1: (math.log(100), 1), 2: (math.log(90), 1)}
    twice = {1: (math.log(100), 1), 2: (math.log(99), 2)}
    value = remeasure_value(close, 2, noise_std=0.05)
    # one run moves layout 2's mean by sd 0.05 / sqrt(2): EI(-gap, that sd) by the closed form
    move, gap = 0.05 / math.sqrt(2), math.log(100 / 99)
    assert value == pytest.approx(float(expected_improvement(np.array([-gap]), np.array([move]), 0.0)[0]))
    assert 0 < remeasure_value(far, 2, 0.05) < value  # a larger gap is less likely to be crossed
    assert remeasure_value(twice, 2, 0.05) < value  # a third run moves a mean of two runs less
    assert remeasure_value(close, 2, 0.10) > value  # noisier runs: more to learn
    # the leader measured again is judged against the runner-up, symmetric in the gap
    assert remeasure_value(close, 1, 0.05) == pytest.approx(value)
    assert remeasure_value({1: (0.0, 1)}, 1, 0.05) == 0.0


@pytest.mark.parametrize("new_layout_gain, noise_known, expected", [
    (1.0, True, "refine"),  # a new layout is worth more: keep searching
    (0.0, True, REMEASURE),  # the search has settled: make sure of the winner
    (1.0, False, REMEASURE),  # no layout ran twice yet: the run noise is a guess until one does
])
def test_a_contender_runs_again_only_when_that_is_worth_more_than_a_new_layout(qwen16, new_layout_gain, noise_known,
                                                                               expected, monkeypatch):
    """In the budget's last share, a close contender is measured again when its knowledge gradient beats
    that of the best new layout (a search far from the optimum keeps searching), or to learn the run noise."""
    import autotune.controller.strategies as strategies

    monkeypatch.setattr(strategies, "THOMPSON_EVERY", 0)  # the new layout is EI's (stubbed below), not a draw
    _, workload, legal = qwen16
    state = SearchState.build(workload, legal[:200])
    runs = [(0, 1000.0), (1, 995.0), (2, 700.0)] + ([(2, 707.0)] if noise_known else [])
    for i, tokens in runs:
        state.mark_tried(legal[i].key())
        state.record_speed(legal[i], tokens)
    strategy = AutoStrategy(budget=10, seed=0)
    state.dispatched = 9  # the last run of the budget: inside the re-measurement share
    assert strategy._remeasure(state) is not None and strategy._remeasure(state)[1] > 0
    strategy._expected_improvement = lambda *args, **kwargs: (5, new_layout_gain)
    proposal = strategy.propose(state)
    assert proposal.note == expected
    assert proposal.config == legal[5] if expected == "refine" else proposal.config in (legal[0], legal[1])


def test_a_contender_that_peaked_inside_the_headroom_is_not_measured_again(qwen16):
    """The study never recommends a layout whose measured peak is inside the headroom, so a run spent on
    ranking it better is wasted: the re-measurement goes to the close contenders that can win."""
    _, workload, legal = qwen16
    state = SearchState.build(workload, legal[:200])
    state.headroom_gib = 4.0
    limit = workload.cluster.gpu.memory_gib
    for i, tokens, peak in ((0, 1000.0, limit - 1.0), (1, 996.0, limit - 20.0), (2, 994.0, limit - 20.0),
                            (3, 700.0, limit - 20.0)):
        state.mark_tried(legal[i].key())
        state.record_speed(legal[i], tokens)
        state.record_memory(legal[i], peak, oom=False)
    assert not state.recommendable(0) and state.recommendable(1)
    strategy = AutoStrategy(budget=10, seed=0)
    state.dispatched = 9
    assert strategy._remeasure(state)[0] == 1  # without the margin, layout 0 (fastest, fewest runs) would be
    state.headroom_gib = 0.0
    assert strategy._remeasure(state)[0] == 0


def test_with_no_open_layout_left_a_close_contender_still_runs_again(qwen16):
    _, workload, legal = qwen16
    state = SearchState.build(workload, legal[:3])
    for i, tokens in ((0, 1000.0), (1, 995.0), (2, 700.0)):
        state.mark_tried(legal[i].key())
        state.record_speed(legal[i], tokens)
    strategy = AutoStrategy(budget=10, seed=0)
    state.dispatched = 9
    proposal = strategy.propose(state)
    assert proposal.note == REMEASURE and proposal.config in (legal[0], legal[1])
    state.dispatched = 5  # outside the budget's last share: nothing left to propose
    assert strategy.propose(state) is None


def _trial(number, key, tokens, peak, status="completed"):
    return Trial(study_id=1, number=number, optuna_trial_number=None, config={}, config_key=key, dispatched=True,
                 status=status, tokens_per_s_per_gpu=tokens, peak_mem_gib=peak)


def test_recommendation_is_the_best_mean_over_runs_and_keeps_the_headroom():
    trials = [_trial(1, "a", 110.0, 70.0), _trial(2, "b", 104.0, 70.0), _trial(3, "a", 90.0, 70.0),
              _trial(4, "c", 130.0, 79.0), _trial(5, "d", 500.0, None, status="oom")]
    pick = recommend(trials, memory_limit_gib=80.0, headroom_gib=3.0)
    assert pick.best.trial.config_key == "b"  # a's mean is 100 over two runs; c is inside the headroom
    assert [r.trial.config_key for r in pick.risky] == ["c"]
    assert recommend(trials, 80.0, 0.0).best.trial.config_key == "c"


def test_run_noise_is_pooled_from_the_layouts_run_more_than_once_and_shrunk_toward_the_assumption():
    import math

    from autotune.controller.recommend import layout_results, run_noise
    from autotune.controller.surrogate import NOISE_LOG_STD

    once = [_trial(1, "a", 100.0, 60.0), _trial(2, "b", 90.0, 60.0)]
    assumed = run_noise(layout_results(once))
    assert assumed.repeated_layouts == 0 and assumed.log_std == pytest.approx(NOISE_LOG_STD)  # nothing measured it
    assert assumed.run_sd(100.0) == pytest.approx(100.0 * NOISE_LOG_STD)
    # two layouts, each run twice 10% apart: log sd of a pair = |log ratio| / sqrt(2); two degrees of freedom
    # pooled with the assumption's three
    twice = once + [_trial(3, "a", 110.0, 60.0), _trial(4, "b", 99.0, 60.0)]
    measured = run_noise(layout_results(twice))
    squares = 2 * math.log(1.1) ** 2 / 2
    assert measured.repeated_layouts == 2
    assert measured.log_std == pytest.approx(math.sqrt((squares + 3 * NOISE_LOG_STD ** 2) / (2 + 3)))
    assert measured.mean_se(105.0, 2) == pytest.approx(105.0 * measured.log_std / math.sqrt(2))


def _plain_noise(groups):
    """The pooled estimate before stragglers were left out: every run of every repeated layout."""
    import math

    from autotune.controller.surrogate import NOISE_LOG_STD

    squares = sum(float(np.sum((np.asarray(g) - np.mean(g)) ** 2)) for g in groups if len(g) > 1)
    dof = sum(len(g) - 1 for g in groups if len(g) > 1)
    return math.sqrt((squares + 3 * NOISE_LOG_STD ** 2) / (dof + 3))


def test_a_straggler_is_left_out_of_the_run_noise_and_a_wide_spread_is_not():
    """One run on a slow node among close repeats was pooled as noise (runs of 100, 100.5 and 65: 13%), widening
    every layout's uncertainty; a cluster whose runs really spread by 20% must still be measured at ~20%."""
    import math

    from autotune.controller.surrogate import run_noise_and_stragglers, run_noise_log_std, straggler_runs

    log = np.log
    close = [[log(90.0), log(91.0)], [log(50.0), log(50.5)]]
    with_straggler = close + [[log(65.0), log(100.0), log(100.5)]]  # the straggler first: positions are kept
    assert _plain_noise(with_straggler) > 0.1
    assert straggler_runs([[log(80.0)]] + with_straggler) == [[], [], [], [0]]
    assert run_noise_log_std(with_straggler) == pytest.approx(_plain_noise(close + [[log(100.0), log(100.5)]]))
    # five runs, two of them stragglers (one slow, one fast): a minority, found both
    assert straggler_runs(close + [[log(100.0), log(60.0), log(101.0), log(99.0), log(140.0)]])[-1] == [1, 4]
    # a pair that disagrees beside close pairs: one of its runs strayed, two cannot say which, both left out
    disputed = close + [[log(100.0), log(70.0)]]
    assert straggler_runs(disputed) == [[], [], [0, 1]]
    assert run_noise_log_std(disputed) == pytest.approx(_plain_noise(close))
    # the only repeat, 30% apart: nothing says it strayed rather than that the noise is large
    assert run_noise_and_stragglers([[log(100.0), log(70.0)]]) == (_plain_noise([[log(100.0), log(70.0)]]), [[]])
    # stragglers stay a minority of their layout, and a wide spread of many runs is noise
    rng = np.random.default_rng(7)
    wide = [list(rng.normal(0.0, 0.2, 3)) for _ in range(10)]
    assert not any(straggler_runs(wide)) and 0.12 < run_noise_log_std(wide) < 0.3
    assert run_noise_log_std(wide) == _plain_noise(wide)
    assert math.isclose(run_noise_log_std([]), _plain_noise([]))  # nothing repeated: the assumption


def test_without_stragglers_the_run_noise_is_the_plain_pooled_estimate():
    """The benchmark's landscapes draw run noise uniformly within +-5%: no run is ever far enough to be left
    out, so the search measured there is the search as before, to the bit; normal noise rarely loses a run."""
    from autotune.controller.surrogate import run_noise_and_stragglers, straggler_runs

    rng = np.random.default_rng(3)
    left_out = runs = 0
    for _ in range(300):
        uniform = [list(np.log1p(rng.uniform(-0.05, 0.05, rng.integers(2, 4)))) for _ in range(rng.integers(1, 12))]
        assert run_noise_and_stragglers(uniform) == (_plain_noise(uniform), [[] for _ in uniform])
        normal = [list(rng.normal(0.0, 0.03, rng.integers(2, 4))) for _ in range(rng.integers(1, 12))]
        left_out += sum(map(len, straggler_runs(normal)))
        runs += sum(map(len, normal))
    assert left_out <= 0.005 * runs


def test_a_layouts_mean_leaves_its_stragglers_out_on_both_sides_of_the_study():
    """The run noise left a straggler out while the layout's mean kept it: a slow node then pinned the best
    layout below its rivals (the pooling keeps an estimate within one standard error of that mean). The
    recommendation's LayoutResult and the search's measured_means count the same runs."""
    from autotune.controller.recommend import layout_results, run_noise

    trials = [_trial(1, "a", 100.0, 60.0), _trial(2, "a", 60.0, 60.0), _trial(3, "a", 101.0, 60.0),
              _trial(4, "b", 95.0, 60.0), _trial(5, "b", 96.0, 60.0), _trial(6, "c", 90.0, 60.0),
              _trial(7, "c", 55.0, 60.0)]
    by_key = {r.trial.config_key: r for r in layout_results(trials)}
    a, b, c = by_key["a"], by_key["b"], by_key["c"]
    assert a.stragglers == (2,) and a.mean_tokens_per_s_per_gpu == pytest.approx(100.5) and a.counted_runs == 2
    assert b.stragglers == () and b.counted_runs == 2
    # a disputed pair: both runs out of the noise, its mean the two runs' average, as sure as one run
    assert c.stragglers == (6, 7) and c.mean_tokens_per_s_per_gpu == pytest.approx(72.5) and c.counted_runs == 1
    noise = run_noise(layout_results(trials))
    assert noise.stragglers == (2, 6, 7) and noise.repeated_layouts == 2  # a and b give the figure, c does not
    assert [r.trial.config_key for r in layout_results(trials)][:2] == ["a", "b"]


def test_the_search_counts_a_layouts_runs_as_the_recommendation_does(qwen16):
    space, workload, legal = qwen16
    state = SearchState.build(workload, legal[:10])
    first, second = legal[0], legal[1]
    for speed in (100.0, 60.0, 101.0):
        state.record_speed(first, speed)
    for speed in (95.0, 96.0):
        state.record_speed(second, speed)
    means = state.measured_means()
    i, j = state.index[first.key()], state.index[second.key()]
    assert means[i] == (pytest.approx(float(np.mean(np.log([100.0, 101.0])))), 2)
    assert means[j] == (pytest.approx(float(np.mean(np.log([95.0, 96.0])))), 2)
    state.record_speed(second, 96.5)  # a new run: counted again
    assert state.measured_means()[j][1] == 3


def _layout_run(number, tokens, predicted=100.0, **knobs):
    config = LayoutConfig(**knobs)
    return Trial(study_id=1, number=number, optuna_trial_number=None, config=config.to_dict(), config_key=config.key(),
                 dispatched=True, status="completed", tokens_per_s_per_gpu=tokens, peak_mem_gib=60.0,
                 predicted=None if predicted is None else {"tokens_per_s_per_gpu": predicted})


def _lucky_and_confirmed(predicted="model"):
    """Every layout of a TP x MBS x PP grid ran once; throughput adds up from its knob values (TP4, MBS2,
    PP2 best: 107), and the cost model predicted just that ("model"), except one lucky run: TP2 MBS1 PP1
    ran at 108 where its knobs add up to 96 and everything sharing its values ran slow. `predicted`
    other than "model": the value stored as every run's prediction."""
    tp, mbs, pp = {1: 0.0, 2: -2.0, 4: 3.0}, {1: -1.0, 2: 2.0}, {1: -1.0, 2: 2.0}
    runs = []
    for a in tp:
        for b in mbs:
            for c in pp:
                additive = 100.0 + tp[a] + mbs[b] + pp[c]
                tokens = 108.0 if (a, b, c) == (2, 1, 1) else additive
                runs.append(_layout_run(len(runs), tokens, additive if predicted == "model" else predicted,
                                        tp=a, mbs=b, pp=c))
    return runs


def test_recommendation_pools_a_lucky_run_with_the_layouts_that_share_its_knobs():
    from autotune.controller.recommend import backend_repeats_exactly, layout_results, pooled

    lucky, confirmed = LayoutConfig(tp=2, mbs=1).key(), LayoutConfig(tp=4, mbs=2, pp=2).key()
    trials = _lucky_and_confirmed()
    pick = recommend(trials, 80.0, 3.0)
    assert pick.best.trial.config_key == confirmed
    estimates = {r.trial.config_key: r.estimate_tokens_per_s_per_gpu for r in pooled(layout_results(trials))}
    assert estimates[lucky] < 108.0 and estimates[lucky] < estimates[confirmed]
    assert pick.best.mean_tokens_per_s_per_gpu == 107.0  # what is shown as measured stays the measurement
    # no noise to pool (replay), or a run without a stored prediction: each layout by its own runs
    assert recommend(trials, 80.0, 3.0, pooled_estimate=False).best.trial.config_key == lucky
    assert recommend(_lucky_and_confirmed(None), 80.0, 3.0).best.trial.config_key == lucky
    for hostile in (float("nan"), float("inf"), -1.0, "100", True, 1e300, 10 ** 400):  # a prediction no model made: no pooling
        assert recommend(_lucky_and_confirmed(hostile), 80.0, 3.0).best.trial.config_key == lucky
    for odd in ([100.0], "100", 7):  # `predicted` not even a mapping (another version, a tampered row)
        trials = [dataclasses.replace(t, predicted=odd) for t in _lucky_and_confirmed()]
        assert recommend(trials, 80.0, 3.0).best.trial.config_key == lucky
    # a layout whose record is unreadable, or whose run stored no prediction (an imported log), keeps its
    # plain mean; the others are still pooled
    for broken in ({"config": {"tp": "many"}}, {"predicted": None}):
        trials = _lucky_and_confirmed()
        trials[0] = dataclasses.replace(trials[0], **broken)  # tp1 mbs1 pp1, not a contender
        assert recommend(trials, 80.0, 3.0).best.trial.config_key == confirmed
    assert backend_repeats_exactly("replay") and not backend_repeats_exactly("simulate")
    assert backend_repeats_exactly("a-backend-of-a-newer-autotune")


def test_a_stored_pooling_of_the_same_runs_is_used_and_any_other_is_not(monkeypatch):
    """The controller stores its pooled estimates with a digest of the runs (readers of a finished study
    then need no GP fit); a cache of other runs, of another pooling version, or with values no pooling
    writes is ignored and the estimates are computed."""
    from autotune.controller import recommend as rec

    trials = _lucky_and_confirmed()
    rec._POOLED.clear()
    entry = rec.pooled_cache_entry(trials)
    computed = {r.trial.config_key: r.estimate_tokens_per_s_per_gpu for r in rec.pooled(rec.layout_results(trials))}
    assert entry["estimates"] == computed and len(entry["key"]) == 64
    json.loads(json.dumps(entry))  # storable as JSON

    def no_fit(results):
        raise AssertionError("fitted although the stored pooling was of these runs")

    monkeypatch.setattr(rec, "_pooled_estimates", no_fit)
    rec._POOLED.clear()
    pick = recommend(trials, 80.0, 3.0, pooled_cache=entry)
    assert pick.best.estimate_tokens_per_s_per_gpu == computed[pick.best.trial.config_key]
    monkeypatch.undo()
    lucky = LayoutConfig(tp=2, mbs=1).key()
    one_more = trials + [_layout_run(99, 101.0, 100.0, tp=8)]
    staleish = [dict(entry, key=rec._pool_digest(rec.layout_results(one_more))), dict(entry, key="0" * 64)]
    with monkeypatch.context() as m:
        m.setattr(rec, "POOL_VERSION", rec.POOL_VERSION + 1)  # a cache written by another pooling
        rec._POOLED.clear()
        assert rec._stored_estimates(entry, rec.layout_results(trials)) is None
    worst = min(entry["estimates"], key=entry["estimates"].get)
    dropped = dict(entry["estimates"])
    dropped.pop(worst)
    for hostile in (dict(entry, estimates={**entry["estimates"], lucky: 1e9}),  # no pooling moves a mean 10^7x
                    # within 1.5x but beyond the pooling's own bound (review: it made the worst layout the winner)
                    dict(entry, estimates={**entry["estimates"], worst: 1.45 * entry["estimates"][worst]}),
                    dict(entry, estimates=dropped),  # a layout the pooling pools is missing
                    dict(entry, estimates={**entry["estimates"], lucky: float("nan")}),
                    dict(entry, estimates={**entry["estimates"], "not-a-layout": 100.0}),
                    dict(entry, estimates=[1, 2]), {"key": entry["key"]}, "x", None, *staleish):
        assert rec._stored_estimates(hostile, rec.layout_results(trials)) is None, hostile
        rec._POOLED.clear()
        assert recommend(trials, 80.0, 3.0, pooled_cache=hostile).best.trial.config_key != lucky


def test_pooling_never_lets_a_prediction_outvote_the_measurements():
    """A layout predicted 40% faster than it ran stays below one that measured 8% faster; every
    estimate stays within one standard error of the run noise around its layout's measured mean."""
    from autotune.controller.recommend import layout_results, pooled
    from autotune.controller.surrogate import NOISE_LOG_STD

    trials = [_layout_run(1, 105.0, 100.0, tp=1), _layout_run(2, 100.0, 100.0, tp=2, mbs=2),
              _layout_run(3, 97.0, 140.0, tp=4, pp=2), _layout_run(4, 100.0, 100.0, tp=1, pp=2)]
    assert recommend(trials, 80.0, 3.0).best.trial.number == 1
    for trials in (trials, _lucky_and_confirmed()):
        for r in pooled(layout_results(trials)):
            # no layout ran twice here: the noise is the stated prior's
            assert abs(math.log(r.estimate_tokens_per_s_per_gpu / r.mean_tokens_per_s_per_gpu)) <= NOISE_LOG_STD + 1e-9


def test_validation_and_risk_follow_the_estimates():
    from autotune.controller.recommend import validation_choices

    trials = _lucky_and_confirmed()
    confirmed = LayoutConfig(tp=4, mbs=2, pp=2).key()
    pick = recommend(trials, 80.0, 3.0)
    # the runner-up is the next estimate, and the gap that decides its validation run is >= 0
    assert pick.runner_up.estimate_tokens_per_s_per_gpu <= pick.best.estimate_tokens_per_s_per_gpu
    assert [r.trial.config_key for r in validation_choices(pick, 0.03)][0] == confirmed
    # the confirmed layout inside the memory margin: it is the risky one, the next estimate is recommended
    trials = [dataclasses.replace(t, peak_mem_gib=79.0) if t.config_key == confirmed else t for t in trials]
    pick = recommend(trials, 80.0, 3.0)
    assert [r.trial.config_key for r in pick.risky] == [confirmed] and pick.best.trial.config_key != confirmed
    # a layout that completed at a safe peak but ran out of memory in another run (a re-measurement, a longer
    # validation run) does not fit reliably: risky, not recommended (review: its OOM was not looked at)
    trials = _lucky_and_confirmed()
    oom = dataclasses.replace(next(t for t in trials if t.config_key == confirmed), number=99, status="oom",
                              tokens_per_s_per_gpu=None, peak_mem_gib=81.0)
    pick = recommend(trials + [oom], 80.0, 3.0)
    assert [r.trial.config_key for r in pick.risky] == [confirmed] and pick.best.trial.config_key != confirmed
    assert pick.safe and pick.risk(pick.risky[0]) == "ran out of memory in one of its runs"
    # every layout ran out of memory once (review: the slower ones were called "faster but at risk"): the best
    # is recommended, flagged, and nothing slower is listed as passed over
    ooms = [dataclasses.replace(t, number=100 + t.number, status="oom", tokens_per_s_per_gpu=None) for t in trials]
    pick = recommend(trials + ooms, 80.0, 3.0)
    assert not pick.safe and pick.risky == () and pick.risk(pick.best) == "ran out of memory in one of its runs"


def test_search_state_trust_region_neighbours(qwen16):
    _, workload, legal = qwen16
    state = SearchState.build(workload, legal)
    centre = state.index[LayoutConfig(ep=16, dist_opt=True).key()]
    near = state.neighbours([centre], 1)
    codes = state.knob_codes()
    assert near[centre] and np.all((codes[near] != codes[centre]).sum(axis=1) <= 1) and 1 < near.sum() < 200


def test_gp_reads_only_the_knobs_that_vary_and_recompute_depths_stay_distinct():
    space = load_space("llama3_70b")  # dense: EP and ETP have one value
    workload = make_workload(space, gpus=64)
    state = SearchState.build(workload, enumerate_legal(space, workload).configs)
    codes, gp = state.knob_codes(), state.gp_codes()
    assert gp.shape[1] == codes.shape[1] - 2
    assert all(len(np.unique(gp[:, j])) > 1 for j in range(gp.shape[1]))
    # full recompute, uniform over 12 layers vs block with 2: two codes (the old 100/10 code gave 212 to both)
    deep = LayoutConfig(tp=8, pp=4, recompute="full", recompute_method="uniform", recompute_num_layers=12)
    block = LayoutConfig(tp=8, pp=4, recompute="full", recompute_method="block", recompute_num_layers=2)
    two = SearchState.build(workload, [deep, block])
    assert two.gp_codes().shape[1] == 1 and two.gp_codes()[0, 0] != two.gp_codes()[1, 0]


def _study(tmp_path, sampler, budget, family="mixed", seed=0, model="qwen3_30b", gpus=16, knob_share=0.0):
    repo = Repository.open(f"sqlite:///{tmp_path / (sampler + str(seed) + '.db')}")
    space = load_space(model)
    workload = make_workload(space, gpus=gpus)
    study = create_study(repo, name="s", space=space, workload=workload, budget=budget, sampler=sampler,
                         backend="simulate", seed=seed,
                         backend_options={"landscape_seed": 7 + seed, "landscape": family, "seconds_per_trial": 0.0,
                                          "run_noise": 0.05},
                         options={"knob_share": knob_share})
    controller = build_controller(repo, study, dispatcher="inprocess")
    return repo, study, controller, controller.run()


def test_auto_beats_random_on_a_hidden_landscape_without_ray(tmp_path):
    """The whole controller on the in-process dispatcher, at the product's budget of 40 runs: auto's
    recommendation is within 5% of the hidden optimum and better than random's."""
    space = load_space("qwen3_30b")
    workload = make_workload(space, gpus=16)
    legal = enumerate_legal(space, workload).configs
    land = Landscape(7, "mixed")
    predicted = estimate_many(workload, legal)
    true = predicted.tokens_per_s_per_gpu * land.speed_factors(legal, workload)
    true[np.array([land.memory_factor(c) for c in legal]) * predicted.peak_mem_gib > 79.0] = 0
    truth = {c.key(): v for c, v in zip(legal, true)}
    ratios = {}
    for sampler in ("auto", "random"):
        repo, study, controller, summary = _study(tmp_path, sampler, 40)
        assert summary.counts["dispatched"] == 40
        ratios[sampler] = truth[summary.best.config_key] / true.max()
        repo.close()
    assert ratios["auto"] > ratios["random"] and ratios["auto"] > 0.95


def test_a_study_with_several_runs_in_flight_believes_them_and_ends_right(tmp_path):
    """Three slots on the in-process dispatcher (results held back as on a cluster): every proposal sees
    the runs in flight as pending, the budget is spent exactly, no layout runs twice unless re-measured."""
    repo = Repository.open(f"sqlite:///{tmp_path / 'slots.db'}")
    space = load_space("qwen3_30b")
    workload = make_workload(space, gpus=16)
    study = create_study(repo, name="slots", space=space, workload=workload, budget=20, sampler="auto",
                         backend="simulate", seed=2,
                         backend_options={"landscape_seed": 9, "landscape": "mixed", "seconds_per_trial": 0.0,
                                          "run_noise": 0.05}, options={"knob_share": 0.0})
    controller = build_controller(repo, study, dispatcher="inprocess", max_concurrent=3)
    seen_pending = []
    propose = controller.strategy.propose

    def spy(state):
        running = {state.index[r.trial.config_key] for r in controller.running.values()}
        assert state.pending == running
        seen_pending.append(len(state.pending))
        return propose(state)

    controller.strategy.propose = spy
    summary = controller.run()
    trials = repo.trials(study.id, dispatched_only=True)
    assert summary.counts["dispatched"] == 20 and len(trials) == 20
    assert max(seen_pending) == 2  # each proposal while two others were still in flight
    keys = [t.config_key for t in trials if t.strategy_note != "remeasure"]
    assert len(keys) == len(set(keys))
    assert summary.recommendation is not None
    repo.close()


def test_a_controller_learns_what_another_controller_of_its_study_measured_and_runs(storage_url, monkeypatch):
    """Two controllers on one study (SQLite and PostgreSQL): the second, built before the first ran,
    learns at its heartbeat every outcome the first recorded since (runs, OOMs, tried layouts, the
    budget used), and believes another controller's runs in flight."""
    repo = Repository.open(storage_url)
    space = load_space("qwen3_30b")
    workload = make_workload(space, gpus=16)
    study = create_study(repo, name="two", space=space, workload=workload, budget=8, sampler="auto",
                         backend="simulate", seed=4,
                         backend_options={"landscape_seed": 11, "landscape": "mixed", "seconds_per_trial": 0.0},
                         options={"knob_share": 0.0})
    second = build_controller(repo, study, dispatcher="inprocess")
    assert second.state.n_runs == 0 and second.state.dispatched == 0
    build_controller(repo, study, dispatcher="inprocess").run()
    trials = repo.trials(study.id, dispatched_only=True)
    completed = [t for t in trials if t.status == "completed"]
    assert len(trials) == 8 and completed
    second._sync_others()
    assert second.state.dispatched == 8 and second.state.n_runs == len(completed)
    assert all(second.state.tried[second.state.index[t.config_key]] for t in trials)
    second._sync_others()  # learnt once, not twice
    assert second.state.n_runs == len(completed)
    # a run another controller has in flight: tried, believed (pending) at the next proposal
    untried = next(c for c in second.state.legal if not second.state.tried[second.state.index[c.key()]])
    allow_runs(repo, study.id, 100)  # the other controller's run, past the 8 this study was made with
    repo.claim_dispatch(study.id, untried.to_dict(), untried.key(), None, "elsewhere:1:x", 100, {}, "refine")
    monkeypatch.setattr(loop, "HEARTBEAT_S", 0.0)  # the sync runs at every heartbeat, not only when called
    second._heartbeat()
    assert second._others_in_flight == [untried.key()] and second.state.tried[second.state.index[untried.key()]]
    seen = []
    second.strategy.propose = lambda state: seen.append(set(state.pending))  # what the next proposal is told
    second._dispatch_one()
    assert seen and seen[0] == {second.state.index[untried.key()]}
    # once the other controller records the run, it is learnt (once) and no longer in flight
    other = next(t for t in repo.trials(study.id) if t.config_key == untried.key())
    repo.finish_trial(study.id, other.number, "completed", metrics={
        "tokens_per_s_per_gpu": 9000.0, "step_time_s": 29.0, "peak_mem_gib": 60.0, "tflops_per_gpu": 200.0,
        "mfu": 0.2}, step_times_s=[29.0, 29.0])
    runs = second.state.n_runs
    second._heartbeat()
    second._heartbeat()
    assert second.state.n_runs == runs + 1 and second._others_in_flight == []
    # a re-run of a layout another controller is running again: wait for a result, do not record the
    # same re-run as a rejected duplicate until the controller gives up proposing
    measured = next(t for t in trials if t.status == "completed")
    second._others_in_flight = [measured.config_key]
    second.strategy.propose = lambda state: Proposal(LayoutConfig.from_mapping(measured.config), REMEASURE)
    rows = len(repo.trials(study.id))
    second._exhausted = False  # the spy above proposed nothing
    assert second._dispatch_one() is False and not second._exhausted and len(repo.trials(study.id)) == rows
    second.dispatcher.shutdown()
    repo.close()


def test_auto_draws_every_third_refinement_from_the_posterior(tmp_path):
    """After the initial design, every THOMPSON_EVERY-th proposal is a Thompson sample: an untried
    layout like every other proposal, in its place in the schedule unless a contender runs again."""
    from autotune.controller import strategies

    repo, study, _, _ = _study(tmp_path, "auto", 40, seed=2)
    trials = sorted(repo.trials(study.id, dispatched_only=True), key=lambda t: t.number)
    start = AutoStrategy(40, 0)._initial_design_size()
    drawn = [i for i, t in enumerate(trials) if t.strategy_note == strategies.THOMPSON]
    assert len(drawn) >= 8 and min(drawn) >= start
    assert all((i - start) % strategies.THOMPSON_EVERY == 0 for i in drawn)
    for i in drawn:  # a new layout each time
        assert trials[i].config_key not in {t.config_key for t in trials[:i]}
    repo.close()


def test_auto_re_measures_only_measured_layouts_at_the_end(tmp_path):
    repo, study, _, summary = _study(tmp_path, "auto", 20, seed=1)
    trials = sorted(repo.trials(study.id, dispatched_only=True), key=lambda t: t.number)
    again = [i for i, t in enumerate(trials) if t.strategy_note == "remeasure"]
    assert all(i >= 20 - 3 for i in again)  # only in the budget's last 15%
    seen = set()
    for t in trials:
        assert (t.config_key in seen) == (t.strategy_note == "remeasure")
        seen.add(t.config_key)
    assert summary.recommendation.best.runs >= 1


def test_the_sampler_drives_a_plain_optuna_study():
    sampler = AutotuneSampler("qwen3_30b", gpus=16, budget=12, seed=0)
    workload = sampler.workload
    land = Landscape(3, "interact")
    chosen = []

    def objective(trial):
        layout = sampler.suggest_layout(trial)
        chosen.append(layout)
        e = estimate(workload, layout)
        peak = e.peak_mem_gib * land.memory_factor(layout)
        trial.set_user_attr("peak_mem_gib", peak)
        if peak > workload.cluster.gpu.memory_gib:
            trial.set_user_attr("oom", True)
            raise optuna.TrialPruned()
        return e.tokens_per_s_per_gpu * land.speed_factor(layout, workload)

    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(objective, n_trials=12)
    assert chosen[0] == LayoutConfig.from_mapping(load_space("qwen3_30b").model.defaults.layout)  # recipe first
    assert all(c.key() in sampler.state.index for c in chosen)  # every proposal legal
    first = chosen[:10]
    assert len({c.key() for c in first}) == len(first)  # no repeats before the re-measurement window
    legal = list(sampler.state.legal)
    predicted = sampler.state.predicted
    true = predicted.tokens_per_s_per_gpu * land.speed_factors(legal, workload)
    # the target is the best layout that keeps the default memory headroom (what the study can
    # recommend), not one at 79.5 of 79.6 GiB
    safe_gib = workload.cluster.gpu.memory_gib - default_headroom_gib(workload)
    true[np.array([land.memory_factor(c) for c in legal]) * predicted.peak_mem_gib > safe_gib] = 0
    assert study.best_value >= 0.85 * true.max()  # it learned: 12 runs of 65,696 legal layouts
    learned = sampler.state.n_runs + len(sampler.state.memory.observations) - sampler.state.n_runs
    assert sampler.state.n_runs >= 1 and learned >= sampler.state.n_runs
    assert AutoStrategy.name == "auto"


def test_the_sampler_counts_running_trials_of_its_study_as_in_flight():
    """With trials asked but not told (n_jobs > 1, or workers sharing a storage), the next proposal knows
    them as in flight and is none of them."""
    sampler = AutotuneSampler("qwen3_30b", gpus=16, budget=12, seed=0)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    asked = []
    for _ in range(3):
        trial = study.ask()
        asked.append(sampler.suggest_layout(trial).key())
    assert len(set(asked)) == 3
    assert sampler.state.pending == {sampler.state.index[k] for k in asked[:2]}  # as the third was proposed
    assert sampler.state.dispatched == 2


def test_two_workers_sharing_a_study_do_not_propose_each_others_running_trials(tmp_path):
    """Two processes' samplers on one storage: the second asks while the first's trial runs (the
    recipe's layout, which both would propose first) and proposes another layout."""
    url = f"sqlite:///{tmp_path / 'workers.db'}"
    first, second = (AutotuneSampler("qwen3_30b", gpus=16, budget=12, seed=s) for s in (0, 1))
    a = optuna.create_study(study_name="w", storage=url, direction="maximize", sampler=first)
    b = optuna.load_study(study_name="w", storage=url, sampler=second)
    running = first.suggest_layout(a.ask())
    assert running == LayoutConfig.from_mapping(load_space("qwen3_30b").model.defaults.layout)
    other = second.suggest_layout(b.ask())
    assert other != running and second.state.tried[second.state.index[running.key()]]


def test_the_sampler_never_runs_one_layout_twice_at_once_across_n_jobs_threads():
    """Found by a new-user pass: with study.optimize(n_jobs=2) both threads ran the same layout at once (the
    sampler was called from both threads, and a proposal's params reach the storage only when the objective
    suggests them). Runs overlap in time here; no two overlapping runs share a layout."""
    import threading
    import time

    sampler = AutotuneSampler("qwen3_30b", gpus=16, budget=40, seed=0)
    lock, runs = threading.Lock(), []

    def objective(trial):
        layout = sampler.suggest_layout(trial)
        start = time.monotonic()
        time.sleep(0.05)
        e = estimate(sampler.workload, layout)
        with lock:
            runs.append((start, time.monotonic(), layout.key()))
        return e.tokens_per_s_per_gpu

    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(objective, n_trials=16, n_jobs=2)
    assert len(runs) == 16
    overlapping = [(a[2], b[2]) for i, a in enumerate(runs) for b in runs[i + 1:] if a[0] < b[1] and b[0] < a[1]]
    assert overlapping and all(x != y for x, y in overlapping)
    assert len({key for _, _, key in runs}) == 16  # and none repeated before the re-measurement window


def test_the_sampler_proposes_only_legal_layouts_past_the_legal_set_and_refuses_what_it_cannot_serve():
    """Found by a new-user pass: once every legal layout that may fit had run (n_trials above the legal set), Optuna's
    random fallback drew each knob alone (14 of 40 trials of llama3_8b on 2 GPUs broke the legality rules, one
    reported as the best); on 1 GPU (nothing fits) every trial did. A minimize or multi-objective study was
    silently maximised, or failed inside Optuna."""
    import warnings

    from autotune.errors import ConfigError

    sampler = AutotuneSampler("llama3_8b", gpus=2, budget=40, seed=0)
    workload, chosen = sampler.workload, []

    def objective(trial):
        layout = sampler.suggest_layout(trial)
        chosen.append(layout)
        e = estimate(workload, layout)
        if e.peak_mem_gib > workload.cluster.gpu.memory_gib:
            trial.set_user_attr("oom", True)
            raise optuna.TrialPruned()
        return e.tokens_per_s_per_gpu

    study = optuna.create_study(direction="maximize", sampler=sampler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study.optimize(objective, n_trials=len(sampler.state.legal) + 10)
    assert all(c.key() in sampler.state.index for c in chosen)  # every proposal legal
    assert any("every legal layout that may fit has run" in str(w.message) for w in caught)
    assert config_of_best(study) in sampler.state.index
    with pytest.raises(ConfigError, match="predicted to fit"):
        AutotuneSampler("llama3_8b", gpus=1)
    # an enqueued part of a layout over the sampler's proposal may break a rule (review: tp=8 with its pp=4 on 8
    # GPUs): refused, not run
    enqueued = optuna.create_study(direction="maximize", sampler=AutotuneSampler("llama3_8b", gpus=8, seed=0))
    enqueued.enqueue_trial({"tp": 8})
    with pytest.raises(ValueError, match="is not legal for llama3_8b on 8 GPUs"):
        for _ in range(3):
            enqueued.sampler.suggest_layout(enqueued.ask())
    for kwargs in ({"direction": "minimize"}, {"directions": ["maximize", "minimize"]}):
        refusing = AutotuneSampler("qwen3_30b", gpus=16)
        other = optuna.create_study(sampler=refusing, **kwargs)
        with pytest.raises(ValueError, match="maximises one objective"):
            refusing.suggest_layout(other.ask())


def config_of_best(study) -> str:
    from autotune.controller._optuna import config_of

    return config_of(study.best_params).key()


def test_physics_calibration_recovers_known_term_scales(qwen16):
    """A cluster whose compute is 20% slower and whose expert all-to-all is 80% slower than the model
    says: the fitted scales find both from 16 step times, and the calibrated model ranks the layouts
    the way that cluster does."""
    from scipy.stats import spearmanr

    from autotune.controller.physics import PhysicsCalibration

    state, breakdown, true_scale = _cluster_scales(qwen16, compute=1.2, ep=1.8)
    true_step = breakdown @ true_scale
    rng = np.random.default_rng(0)
    sample = rng.choice(np.flatnonzero(state.predicted.fits), 16, replace=False)
    physics = PhysicsCalibration()
    physics.fit(breakdown[sample], true_step[sample] * np.exp(rng.normal(0, 0.01, 16)))
    assert physics.scales["compute"] == pytest.approx(1.2, rel=0.08)
    assert physics.scales["ep"] == pytest.approx(1.8, rel=0.25)
    fitting = np.flatnonzero(state.predicted.fits)
    before = spearmanr(breakdown[fitting].sum(axis=1), true_step[fitting]).statistic
    after = spearmanr(physics.step_time_s(breakdown[fitting]), true_step[fitting]).statistic
    assert after > 0.99 and after > before


def _cluster_scales(qwen16, **scales: float):
    """qwen3_30b@16's search state, its layouts' term seconds, and a cluster's true scale per term."""
    _, workload, legal = qwen16
    state = SearchState.build(workload, legal)
    terms = list(state.physics.terms)
    true_scale = np.ones(len(terms))
    for term, scale in scales.items():
        true_scale[terms.index(term)] = scale
    return state, state.breakdown_matrix(), true_scale


def test_a_warm_started_physics_fit_ends_where_a_cold_one_does(qwen16):
    """Each fit starts every noise level where the last fit (one run fewer) ended: on runs the terms
    explain, refitting run by run ends at the scales and noise level of one fit of all the runs at once."""
    from autotune.controller.physics import PhysicsCalibration

    state, breakdown, true_scale = _cluster_scales(qwen16, compute=0.8, tp=1.6)
    rng = np.random.default_rng(5)
    sample = rng.choice(np.flatnonzero(state.predicted.fits), 20, replace=False)
    step = (breakdown[sample] @ true_scale) * np.exp(rng.normal(0, 0.02, len(sample)))
    warm = PhysicsCalibration()
    for n in range(2, len(sample) + 1):
        warm.fit(breakdown[sample[:n]], step[:n])
    cold = PhysicsCalibration()
    cold.fit(breakdown[sample], step)
    assert warm.noise_log_std == cold.noise_log_std
    assert np.allclose(warm.log_scale, cold.log_scale, atol=2e-3)


def test_physics_calibration_uses_measured_trace_breakdowns(qwen16):
    """With an nsys breakdown (compute vs exposed communication), fewer step times pin the scales."""
    from autotune.controller.physics import PhysicsCalibration

    _, workload, legal = qwen16
    state = SearchState.build(workload, legal)
    breakdown = state.breakdown_matrix()
    terms = list(state.physics.terms)
    true_scale = np.ones(len(terms))
    true_scale[terms.index("ep")] = 2.0
    sample = np.flatnonzero(state.predicted.fits & (breakdown[:, terms.index("ep")] > 0))[:3]
    comm = ("tp", "cp", "ep", "pp", "dp")
    mask = np.array([t in comm for t in terms])
    traces = [(j, {comm: float(breakdown[i, mask] @ true_scale[mask])}) for j, i in enumerate(sample)]
    with_traces, without = PhysicsCalibration(), PhysicsCalibration()
    with_traces.fit(breakdown[sample], breakdown[sample] @ true_scale, traces)
    without.fit(breakdown[sample], breakdown[sample] @ true_scale)
    assert abs(with_traces.scales["ep"] - 2.0) < abs(without.scales["ep"] - 2.0)


def test_physics_calibration_does_not_stretch_terms_to_chase_what_no_term_explains(qwen16, monkeypatch):
    """Runs whose deviations from the model belong to no term (an independent +-15% per layout, like knob
    interactions) make the fit choose a large step-time noise and keep every scale within 1.5 prior sd;
    with the run-to-run noise assumed instead (the fit before the noise was chosen), the same runs push
    terms to their 3-sd bound (a traced study: TP, CP and PP at 6x, TP-8 layouts ranked 8,000th while the
    optimum had TP 8). Runs that one term explains keep the run-to-run noise and recover the term."""
    from autotune.controller import physics
    from autotune.controller.physics import PRIOR_LOG_STD, STEP_NOISE_LOG_STD, PhysicsCalibration

    _, workload, legal = qwen16
    state = SearchState.build(workload, legal)
    breakdown = state.breakdown_matrix()
    rng = np.random.default_rng(0)
    sample = rng.choice(np.flatnonzero(state.predicted.fits), 32, replace=False)
    step = breakdown[sample].sum(axis=1) * np.exp(rng.normal(0, 0.15, 32))

    def stretch(fit: PhysicsCalibration) -> float:  # the largest move of a scale, in prior sds
        return max(abs(np.log(s)) / PRIOR_LOG_STD[t] for t, s in fit.scales.items())

    unexplained = PhysicsCalibration()
    unexplained.fit(breakdown[sample], step)
    assert unexplained.noise_log_std >= 0.08 and stretch(unexplained) <= 1.5
    monkeypatch.setattr(physics, "STEP_NOISE_GRID_LOG_STD", (STEP_NOISE_LOG_STD,))
    assumed = PhysicsCalibration()
    assumed.fit(breakdown[sample], step)
    assert stretch(assumed) >= 2.5
    monkeypatch.undo()
    terms = list(unexplained.terms)
    true_scale = np.ones(len(terms))
    true_scale[terms.index("tp")] = 2.5
    explained = PhysicsCalibration()
    explained.fit(breakdown[sample], (breakdown[sample] @ true_scale) * np.exp(rng.normal(0, 0.01, 32)))
    assert explained.noise_log_std == STEP_NOISE_LOG_STD
    assert explained.scales["tp"] == pytest.approx(2.5, rel=0.2)


PUBLIC_SWEEPS = Path(__file__).resolve().parents[2] / "benchmarks" / "public_sweeps"


@pytest.mark.parametrize("model", ["vtrain_gpt_3p6b", "vtrain_gpt_18p4b", "vtrain_gpt_39p1b", "vtrain_gpt_175b"])
def test_public_sweep_tables_are_legal_in_their_spaces(model):
    """Every measured layout of a public sweep is legal in its search space (else replay could never reach it)."""
    space = load_space(model)
    covered, lacking, foreign, variants = replay_coverage(space, make_workload(space),
                                                         str(PUBLIC_SWEEPS / f"{model}.csv"))
    assert covered >= 15 and foreign == variants == 0 and lacking > 0
    assert not space.model.exportable


def test_a_replay_tables_knob_variant_of_a_legal_layout_is_not_counted_foreign(tmp_path):
    """Review: a row of a legal layout with a CUDA graph was counted "not legal here", then run and recommended."""
    space = load_space("qwen3_30b")
    workload = make_workload(space)
    table = tmp_path / "t.csv"
    knobs = "vpp,cp,etp,mbs,sp,recompute,recompute_method,recompute_num_layers", "1,1,1,1,False,none,,"
    table.write_text(f"tp,pp,ep,dist_opt,cuda_graph,status,step_time_s,{knobs[0]}\n1,1,16,True,,completed,30,{knobs[1]}\n"
                     f"1,1,16,True,full_iteration,completed,29,{knobs[1]}\n3,1,16,True,,completed,30,{knobs[1]}\n")
    legal = len(enumerate_legal(space, workload).configs)
    assert replay_coverage(space, workload, str(table)) == (1, legal - 1, 1, 1)
    # second review: a variant row without its plain layout's row is no layout the search runs
    table.write_text(f"tp,pp,ep,dist_opt,cuda_graph,status,step_time_s,{knobs[0]}\n"
                     f"1,1,16,True,full_iteration,completed,29,{knobs[1]}\n")
    assert replay_coverage(space, workload, str(table)) == (0, legal, 0, 1)


def test_replay_of_a_public_sweep_measures_only_its_layouts_once_each(tmp_path):
    """A replay study spends its budget on the table's layouts only and never re-measures (replay repeats)."""
    space = load_space("vtrain_gpt_39p1b")
    workload = make_workload(space)
    table = str(PUBLIC_SWEEPS / "vtrain_gpt_39p1b.csv")
    repo = Repository.open(f"sqlite:///{tmp_path / 'replay.db'}")
    study = create_study(repo, name="pub", space=space, workload=workload, budget=12, sampler="auto",
                         backend="replay", seed=0, backend_options={"replay": table})
    summary = build_controller(repo, study, dispatcher="inprocess").run()
    trials = repo.trials(study.id, dispatched_only=True)
    assert len(trials) == 12 and summary.counts["dispatched"] == 12
    assert {t.status for t in trials} == {"completed"}  # never a layout missing from the table
    assert len({t.config_key for t in trials}) == 12 and not any(t.strategy_note == "remeasure" for t in trials)
    # a replayed run repeats exactly: the leaderboard shows no run-to-run uncertainty it does not have
    from autotune import leaderboard

    board = leaderboard.build(repo, repo.get_study("pub"))
    assert board.summary["run_noise_rel_sd"] is None and board.summary["best_tokens_per_s_per_gpu_se"] is None
    assert all(r["tokens_per_s_per_gpu_sd"] is None for r in board.rows)
    assert "±" not in leaderboard.legend(board)
    repo.close()


def test_a_public_sweep_model_is_not_exported_nor_run_on_megatron(tmp_path):
    from autotune.catalog import require_exportable
    from autotune.errors import ConfigError

    with pytest.raises(ConfigError, match="no recipe of this model"):
        require_exportable(load_space("vtrain_gpt_175b").model, "export")
    space = load_space("vtrain_gpt_175b")
    repo = Repository.open(f"sqlite:///{tmp_path / 'm.db'}")
    with pytest.raises(ConfigError, match="cannot run the megatron backend"):
        create_study(repo, name="m", space=space, workload=make_workload(space), budget=4, sampler="auto",
                     backend="megatron", seed=0, backend_options={})
    assert repo.list_studies() == []
    repo.close()
    # a note written as a YAML block scalar spans lines; the error stays one line
    model = dataclasses.replace(space.model, recipe_note="line one\nline two\n\nline three\n")
    with pytest.raises(ConfigError) as info:
        require_exportable(model, "export")
    assert str(info.value).endswith("line one line two line three")


def test_physics_calibration_analytic_fit_matches_finite_differences_and_ignores_runs_without_a_breakdown(
        qwen16, monkeypatch):
    """The fit's analytic Jacobian reaches the optimum a finite-difference fit of the same objective reaches
    (traces included), and a run whose record holds no breakdown (all zeros) changes neither the scales
    nor the chosen noise (left in, its misfit against 1e-12 s chose the largest noise by itself)."""
    from scipy.optimize import least_squares

    from autotune.controller import physics
    from autotune.controller.physics import PRIOR_LOG_STD, TRACE_NOISE_LOG_STD, PhysicsCalibration

    _, workload, legal = qwen16
    state = SearchState.build(workload, legal)
    breakdown = state.breakdown_matrix()
    terms = list(state.physics.terms)
    rng = np.random.default_rng(3)
    sample = rng.choice(np.flatnonzero(state.predicted.fits), 12, replace=False)
    true_scale = np.exp(rng.normal(0, 0.3, len(terms)))
    step = (breakdown[sample] @ true_scale) * np.exp(rng.normal(0, 0.02, 12))
    comm = ("tp", "cp", "ep", "pp", "dp")
    mask = np.array([t in comm for t in terms])
    traces = [(0, {comm: float(breakdown[sample[0], mask] @ true_scale[mask])})]

    monkeypatch.setattr(physics, "STEP_NOISE_GRID_LOG_STD", (0.05,))
    analytic = PhysicsCalibration()
    analytic.fit(breakdown[sample], step, traces)
    prior = np.array([PRIOR_LOG_STD[t] for t in terms])

    def residuals(theta):
        scale = np.exp(theta)
        return np.concatenate([(np.log(breakdown[sample] @ scale) - np.log(step)) / 0.05, theta / prior,
                               [(np.log(breakdown[sample[0], mask] @ scale[mask]) - np.log(traces[0][1][comm]))
                                / TRACE_NOISE_LOG_STD]])

    numeric = least_squares(residuals, np.zeros(len(terms)), method="trf", x_scale=1.0)
    assert np.allclose(analytic.log_scale, np.clip(numeric.x, -3 * prior, 3 * prior), atol=2e-3)
    monkeypatch.undo()

    clean, with_empty = PhysicsCalibration(), PhysicsCalibration()
    clean.fit(breakdown[sample], step)
    with_empty.fit(np.vstack([np.zeros(len(terms)), breakdown[sample]]), np.concatenate([[30.0], step]))
    assert with_empty.noise_log_std == clean.noise_log_std and with_empty.n_runs == 12
    assert np.allclose(with_empty.log_scale, clean.log_scale, atol=1e-6)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"gpus": 12}, "ConfigError", "gpus 12 is not a multiple of gpus_per_node 8"),  # was "--gpus 12 ... --gpus-per-node"
    ({"gpus": 16, "seq_length": 0}, "ConfigError", "seq_length must be >= 1, got 0"),
    ({"gpus": 16, "budget": 0}, "ConfigError", "budget must be a positive number of trials"),  # was taken
    ({"gpus": 16, "seed": 2**40}, "ConfigError", "seed must be None or an integer in [0, 4294967295]"),  # numpy's
    ({"gpus": "16"}, "ConfigError", "gpus must be an integer, got '16'"),
    ({"gpus": 16, "seq_len": 4096}, "TypeError", "AutotuneSampler() got unexpected keyword argument(s) 'seq_len'"),
    ({"gpus": 10**10}, "ConfigError", "gpus must be at most 1,000,000,000"),  # the CLI's bound
    ({"gpus": 16, "budget": 4.0}, "ConfigError", "budget must be an integer, got 4.0"),
])
def test_the_python_api_names_its_own_arguments_not_cli_flags(kwargs, error, words):
    """Found by the storage pass's notes: AutotuneSampler's errors named the CLI's flags, an unknown keyword was
    make_workload's TypeError, budget=0 was taken and seed=2**40 failed inside numpy at the first proposal."""
    with pytest.raises(Exception) as caught:
        AutotuneSampler("qwen3_30b", **kwargs)
    assert type(caught.value).__name__ == error and words in str(caught.value) and "--" not in str(caught.value)


def test_the_python_api_takes_numpy_integers():
    """Review: the first type checks refused numpy's integers (gpus=np.int64(16)), which worked before."""
    import numpy as np

    sampler = AutotuneSampler("qwen3_30b", gpus=np.int64(16), budget=np.int32(5), seed=np.uint32(3),
                              seq_length=np.int64(4096))
    assert sampler.workload.cluster.gpus == 16 and type(sampler.workload.cluster.gpus) is int
    assert sampler.workload.seq_length == 4096
