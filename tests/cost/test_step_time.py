"""Step time: structure of the breakdown and the directions a tuner relies on."""

from __future__ import annotations

import pytest

from autotune.config import LayoutConfig
from autotune.cost import TERMS, estimate, estimate_many
from autotune.space import enumerate_legal, load_space, make_workload


def workload(model, **options):
    return make_workload(load_space(model), **options)


def test_breakdown_sums_to_step_time_and_metrics_are_consistent():
    w = workload("qwen3_30b", gpus=16)
    e = estimate(w, LayoutConfig(ep=16, dist_opt=True))
    assert set(e.breakdown) == set(TERMS)
    assert sum(e.breakdown.values()) == pytest.approx(e.step_time_s)
    assert e.tokens_per_s_per_gpu == pytest.approx(1024 * 4096 / (e.step_time_s * 16))
    assert e.tflops_per_gpu == pytest.approx(e.flops_per_token * e.tokens_per_s_per_gpu / 1e12)
    assert e.mfu == pytest.approx(e.tflops_per_gpu / 989.0)
    assert e.to_dict()["mfu_basis"] == "dense BF16 peak"


def test_recipe_default_is_near_the_published_figure():
    """Qwen3-30B-A3B recipe default on 16 H100: published 8826 tokens/s/GPU (megatron-facts.md)."""
    w = workload("qwen3_30b")
    e = estimate(w, LayoutConfig.from_mapping(w.model.defaults.layout))
    assert e.tokens_per_s_per_gpu == pytest.approx(8826, rel=0.2)


def test_pipeline_bubble_shrinks_with_interleaving():
    w = workload("llama3_70b", gpus=32)
    plain = estimate(w, LayoutConfig(tp=4, pp=4, cp=2, sp=True, dist_opt=True))
    interleaved = estimate(w, LayoutConfig(tp=4, pp=4, vpp=5, cp=2, sp=True, dist_opt=True))
    assert interleaved.breakdown["bubble"] == pytest.approx(plain.breakdown["bubble"] / 5, rel=0.1)


def test_tp_across_nodes_is_much_slower():
    w = workload("llama3_70b", gpus=32)
    inside = estimate(w, LayoutConfig(tp=8, pp=4, sp=True, dist_opt=True)).breakdown["tp"]
    across = estimate(w, LayoutConfig(tp=16, pp=2, sp=True, dist_opt=True)).breakdown["tp"]
    assert across > 5 * inside


def test_ep_inside_a_node_beats_ep_across_nodes():
    w = workload("qwen3_30b", gpus=16)
    inside = estimate(w, LayoutConfig(ep=8, dist_opt=True)).breakdown["ep"]
    across = estimate(w, LayoutConfig(ep=16, dist_opt=True)).breakdown["ep"]
    assert across > inside


def test_recompute_costs_time():
    w = workload("llama3_70b", gpus=32)
    base = LayoutConfig(tp=4, pp=4, vpp=5, cp=2, sp=True, dist_opt=True)
    full = base.replace(recompute="full", recompute_method="uniform", recompute_num_layers=1)
    assert estimate(w, full).step_time_s > estimate(w, base).step_time_s * 1.15


def test_many_equals_one_by_one():
    space = load_space("qwen3_30b")
    w = make_workload(space, gpus=16)
    configs = enumerate_legal(space, w).configs[::997]
    many = estimate_many(w, configs)
    for i, config in enumerate(configs):
        assert many.step_time_s[i] == pytest.approx(estimate(w, config).step_time_s)
        assert many.peak_mem_gib[i] == pytest.approx(estimate(w, config).peak_mem_gib)


def test_published_rows_validate_within_target():
    """The shipped constants reproduce Megatron-Bridge's published throughput: MAPE <= 20%."""
    from autotune.cost.published import default_csv_path, load_cases

    try:
        default_csv_path()
    except FileNotFoundError:
        pytest.skip("shared/data/published_bridge_perf_calibration.csv is not beside this checkout")
    cases = load_cases()
    errors = [abs(estimate(c.workload, c.layout).tflops_per_gpu / c.tflops_per_gpu - 1) for c in cases]
    assert len(cases) >= 37
    assert sum(errors) / len(errors) <= 0.20
