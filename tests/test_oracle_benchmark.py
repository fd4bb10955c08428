"""benchmarks/oracle_interactions.py tells the search GP the `interact` landscape's truth by naming the GP's
input columns; if the knob columns or the landscape's pairs were renamed, the oracle would silently tell it
nothing. These keep the names in step (the benchmark itself runs for minutes and is not a test)."""

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
    """One column per name, in knob_codes_of's order: TP in the first, micro-batch size in the eighth."""
    from autotune.controller.state import knob_codes_of
    from autotune.cost._arrays import LayoutArrays
    from autotune.space import enumerate_legal, load_space, make_workload

    space = load_space("qwen3_30b")
    legal = enumerate_legal(space, make_workload(space, gpus=16)).configs
    codes = knob_codes_of(LayoutArrays.from_configs(legal))
    assert codes.shape[1] == len(oracle.KNOB_COLUMNS)
    column = {name: k for k, name in enumerate(oracle.KNOB_COLUMNS)}
    for i in np.random.default_rng(0).choice(len(legal), 50, replace=False):
        c = legal[i]
        assert codes[i, column["tp"]] == c.tp and codes[i, column["ep"]] == c.ep
        assert codes[i, column["mbs"]] == c.mbs and codes[i, column["pp"]] == c.pp


def test_physics_pair_ranks_rank_every_true_pair_once():
    ranks, pairs = oracle.physics_pair_ranks("qwen3_30b:16")
    assert pairs == 45 and len(ranks) == len(oracle.TRUE_PAIRS) == len(set(ranks))
    assert all(1 <= r <= pairs for r in ranks)
