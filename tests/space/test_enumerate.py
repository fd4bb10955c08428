"""Enumeration of the legal set: agreement with the per-config checks, counts, fixes."""

from __future__ import annotations

import itertools

import pytest

from autotune.config import LayoutConfig
from autotune.space import enumerate_legal, is_legal, load_space, make_workload, policy_violations


def test_enumeration_matches_brute_force_on_a_small_space():
    """The staged walk finds exactly the layouts that a brute-force check of the product accepts."""
    space = load_space("qwen3_30b").fixed({"mbs": 1, "dist_opt": True})
    workload = make_workload(space, gpus=16)
    legal = enumerate_legal(space, workload)
    d = space.domains
    recompute = [("none", None, None), ("selective", None, None)] + [
        ("full", m, n) for m in d["recompute_method"] for n in d["recompute_num_layers"]]
    expected = set()
    total = 0
    for tp, pp, vpp, cp, ep, etp, sp, rc in itertools.product(
            d["tp"], d["pp"], d["vpp"], d["cp"], d["ep"], d["etp"], d["sp"], recompute):
        total += 1
        config = LayoutConfig(tp, pp, vpp, cp, ep, etp, sp, 1, rc[0], rc[1], rc[2], True)
        if is_legal(config, workload) and not policy_violations(config, workload, space.policy):
            expected.add(config)
    assert legal.candidates == total
    assert set(legal.configs) == expected
    assert len(legal.configs) == len(expected)  # no duplicates
    assert sum(legal.rejected_by_rule.values()) + legal.megatron_legal == total


def test_every_enumerated_layout_passes_every_rule():
    space = load_space("llama3_70b")
    workload = make_workload(space, gpus=64)
    legal = enumerate_legal(space, workload)
    assert len(legal.configs) > 1000
    assert all(is_legal(c, workload) for c in legal.configs[::37])


def test_fix_pins_knobs():
    space = load_space("qwen3_30b").fixed({"tp": 2, "recompute": "none"})
    legal = enumerate_legal(space, make_workload(space, gpus=16))
    assert legal.configs
    assert {c.tp for c in legal.configs} == {2}
    assert {c.recompute for c in legal.configs} == {"none"}
    assert all(c.sp for c in legal.configs if c.ep > 1)  # EP with TP needs SP


def test_a_boolean_knob_reads_the_usual_spellings_and_only_those():
    from autotune.cli._options import parse_fixes
    from autotune.errors import ConfigError

    for on in ("true", "yes", "on", "1", " ON "):
        assert parse_fixes([f"sp={on}"]) == {"sp": True}
    for off in ("false", "no", "off", "0"):  # review: sp=yes worked, sp=off did not
        assert parse_fixes([f"dist-opt={off}"]) == {"dist_opt": False}
    with pytest.raises(ConfigError, match="must be true or false"):
        parse_fixes(["sp=maybe"])


def test_policy_filtered_layouts_are_counted_not_listed():
    space = load_space("llama3_70b").fixed({"tp": 16})
    workload = make_workload(space, gpus=64)
    legal = enumerate_legal(space, workload)
    assert legal.configs == []
    assert legal.filtered_by_policy["tp_within_nvlink_domain"] > 0
    assert legal.emptiest_rule() is not None


def test_expert_parallel_is_not_part_of_data_parallel():
    space = load_space("qwen3_30b")
    legal = enumerate_legal(space, make_workload(space, gpus=16))
    assert any(c.ep == 16 and c.tp == 1 and c.pp == 1 for c in legal.configs)
    # EP=16 with PP=2 needs 32 GPUs in the expert grid: never legal on 16
    assert not any(c.ep == 16 and c.pp == 2 for c in legal.configs)


def test_enumerating_again_gives_an_equal_result_the_caller_owns():
    """The last enumeration is kept (a study's creation and its controller ask for the same set): asked
    again, the same layouts and counts, in a list the caller may change without changing the next answer;
    another workload or space is enumerated afresh."""
    space = load_space("qwen3_30b").fixed({"mbs": 1})
    workload = make_workload(space, gpus=16)
    first = enumerate_legal(space, workload)
    expected = list(first.configs)
    first.configs.clear()
    first.rejected_by_rule.clear()
    second = enumerate_legal(space, workload)
    assert second.configs == expected and sum(second.rejected_by_rule.values()) > 0
    other = enumerate_legal(space, make_workload(space, gpus=8))
    assert len(other.configs) < len(expected) and other.candidates == second.candidates
    pinned = enumerate_legal(space.fixed({"tp": 2}), workload)
    assert {c.tp for c in pinned.configs} == {2}
