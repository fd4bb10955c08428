"""benchmarks/oracle_interactions.py tells the search GP the `interact` landscape's truth by naming the GP's
input columns; if the knob columns or the landscape's pairs were renamed, the oracle would silently tell it
nothing. These keep the names in step and check the oracle's kernel (the benchmark itself runs for minutes
and is not a test)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import oracle_interactions as oracle  # noqa: E402  (a script beside search_quality.py, not a package)


def test_every_interacting_pair_names_two_knob_columns():
    from autotune.backends._landscapes import INTERACTING_PAIRS

    for a, b in INTERACTING_PAIRS:
        assert a in oracle.KNOB_COLUMNS and b in oracle.KNOB_COLUMNS and a != b
    assert len(oracle.TRUE_PAIRS) == len(INTERACTING_PAIRS)


def test_knob_columns_follow_the_search_codes():
    """Every named column holds that knob's value (recompute: one code per kind, method and depth)."""
    from autotune.controller.state import knob_codes_of
    from autotune.cost._arrays import LayoutArrays
    from autotune.space import enumerate_legal, load_space, make_workload

    space = load_space("qwen3_30b")
    legal = enumerate_legal(space, make_workload(space, gpus=16)).configs
    codes = knob_codes_of(LayoutArrays.from_configs(legal))
    assert codes.shape[1] == len(oracle.KNOB_COLUMNS)
    column = {name: k for k, name in enumerate(oracle.KNOB_COLUMNS)}
    plain = [n for n in oracle.KNOB_COLUMNS if n != "recompute"]
    recompute = {}
    for i in np.random.default_rng(0).choice(len(legal), 300, replace=False):
        c = legal[i]
        for name in plain:
            assert codes[i, column[name]] == int(getattr(c, name)), name
        key = (c.recompute, c.recompute_method, c.recompute_num_layers)
        assert recompute.setdefault(codes[i, column["recompute"]], key) == key
    assert len(recompute) > 1


def test_the_oracle_kernel_gives_variance_to_the_true_pairs_only(monkeypatch):
    from autotune.controller import surrogate

    oracle._install(True, patch=monkeypatch.setattr)
    monkeypatch.setattr(oracle, "_columns", [np.array(oracle.KNOB_COLUMNS)])
    d = len(oracle.KNOB_COLUMNS)
    pair = np.asarray(surrogate.ResidualGP(per_pair=True)._initial_kernel(d).k1.pair)
    a, b = surrogate.knob_pairs(d)
    # named independently of oracle.true_pair_mask, which the kernel uses
    told = {frozenset((oracle.KNOB_COLUMNS[a[k]], oracle.KNOB_COLUMNS[b[k]])) for k in np.flatnonzero(
        pair == oracle.PAIR_LOG_VAR)}
    assert told == oracle.TRUE_PAIRS
    assert np.all(pair[pair != oracle.PAIR_LOG_VAR] == surrogate.PAIR_BOUNDS[0])
    # the recommendation's pooling GP keeps the shipped kernel (one shared pair variance)
    assert np.ndim(surrogate.ResidualGP()._initial_kernel(d).k1.pair) == 0


def test_precision_counts_ties_as_a_random_order_would():
    true = np.array([True, True, False, False])
    assert oracle.precision_at_true_count(np.array([4.0, 3.0, 2.0, 1.0]), true) == 1.0
    assert oracle.precision_at_true_count(np.array([1.0, 2.0, 3.0, 4.0]), true) == 0.0
    assert oracle.precision_at_true_count(np.ones(4), true) == 0.5  # all collapsed: chance, not index order


def test_physics_pair_ranks_rank_every_true_pair_once():
    ranks, pairs = oracle.physics_pair_ranks("qwen3_30b:16")
    assert pairs == 45 and len(ranks) == len(oracle.TRUE_PAIRS)
    assert all(1 <= r <= pairs for r in ranks)
