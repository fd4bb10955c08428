"""The cost model's performance-knob effects (issue 16 item 4) against Bridge's published measurements.

Tolerances, stated here and in README:
- EP overlap, Qwen3-30B-A3B on 16 H100 BF16, recipe layout TP1 EP16 (skill card
  nemo-mbridge-perf-moe-comm-overlap: step 24.714 -> 20.992 s, -15.06%; TFLOP/s 244.0 -> 287.3, +17.73%):
  within 2 points on the step and 3 points on TFLOP/s. EP_OVERLAP_HIDDEN is fitted to this one A/B, so this
  test pins the fit; it is not an independent validation (none is published).
- Dispatcher, same model and cluster: no matched A/B is published; the loose figures are ~41.4 s/step with
  NCCL all-to-all (docs/training/cuda-graphs.md) and 30.3 s with HybridEP (verification card), different
  commits and data: HybridEP's predicted advantage must be within 10 points of that 26.8%. Not fitted: it
  follows from the per-node deduplication of flex dispatch and NCCL's all-to-all efficiency.
"""

from __future__ import annotations

import pytest

from autotune.config import LayoutConfig
from autotune.cost import estimate
from autotune.space import load_space, make_workload

QWEN = make_workload(load_space("qwen3_30b"), gpus=16)
RECIPE = LayoutConfig(ep=16, dist_opt=True)


def change(workload, layout, **knobs) -> float:
    """Relative change of the predicted step time when `knobs` are set on `layout`."""
    return estimate(workload, layout.replace(**knobs)).step_time_s / estimate(workload, layout).step_time_s - 1


def test_ep_overlap_reproduces_the_skill_cards_ab_within_the_stated_tolerance():
    base, overlapped = estimate(QWEN, RECIPE), estimate(QWEN, RECIPE.replace(ep_overlap=True))
    assert overlapped.step_time_s / base.step_time_s - 1 == pytest.approx(-0.1506, abs=0.02)
    assert overlapped.tflops_per_gpu / base.tflops_per_gpu - 1 == pytest.approx(0.1773, abs=0.03)


def test_hybridep_over_alltoall_is_within_the_loose_published_gap():
    alltoall = estimate(QWEN, RECIPE.replace(dispatcher="alltoall")).step_time_s
    hybridep = estimate(QWEN, RECIPE).step_time_s
    assert 1 - hybridep / alltoall == pytest.approx(1 - 30.29 / 41.36, abs=0.10)
    assert abs(change(QWEN, RECIPE, dispatcher="flex_deepep")) < 0.03  # no published gap: close to HybridEP


@pytest.mark.parametrize("model,gpus", [("qwen3_30b", 16), ("deepseek_v3", 1024)])
def test_the_recipes_own_values_change_nothing(model, gpus):
    space = load_space(model)
    workload = make_workload(space, gpus=gpus)
    layout = LayoutConfig.from_mapping(space.model.defaults.layout)
    explicit = layout.replace(**{k: v for k, v in space.model.perf_defaults.items()
                                 if k not in ("recompute_modules", "cp_comm_type", "cpu_offload_layers")
                                 and not (k == "tp_comm_overlap" and layout.tp < 2)})
    assert explicit.perf()
    assert estimate(workload, explicit).step_time_s == pytest.approx(estimate(workload, layout).step_time_s)


def test_each_knob_moves_the_prediction_the_way_its_physics_says():
    assert change(QWEN, RECIPE, cuda_graph="none") > 0 > change(QWEN, RECIPE, cuda_graph="te_attn_router") \
        > change(QWEN, RECIPE, cuda_graph="full_iteration")
    assert change(QWEN, RECIPE, dispatcher_sms=16) > 0  # fewer SMs than the recipe's 32: slower dispatch
    selective = RECIPE.replace(recompute="selective", cuda_graph="te_attn")
    more = selective.replace(recompute_modules="core_attn+moe_act+layernorm")
    assert estimate(QWEN, more).step_time_s > estimate(QWEN, selective).step_time_s
    assert estimate(QWEN, more).peak_mem_gib < estimate(QWEN, selective).peak_mem_gib
    offload = estimate(QWEN, RECIPE.replace(cpu_offload_layers=8, cuda_graph="none"))
    assert offload.peak_mem_gib < estimate(QWEN, RECIPE).peak_mem_gib
    tp2 = LayoutConfig(tp=2, sp=True, ep=8, dist_opt=True)
    assert change(QWEN, tp2, tp_comm_overlap=False) > 0
    assert change(QWEN, tp2, overlap_grad_reduce=False) > 0 and change(QWEN, tp2, overlap_param_gather=False) > 0
    cp2 = LayoutConfig(cp=2, ep=8, dist_opt=True)
    assert change(QWEN, cp2, cp_comm_type="a2a") < 0 < change(QWEN, cp2, cp_comm_type="all_gather")
