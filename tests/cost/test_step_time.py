"""Step time: structure of the breakdown and the directions a tuner relies on."""

from __future__ import annotations

import pytest

from autotune.config import LayoutConfig
from autotune.cost import TERMS, estimate, estimate_many
from autotune.cost import calibration as cal
from autotune.cost.flops import flops_per_token
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


def test_block_recompute_repeats_its_first_layers_in_every_virtual_pipeline_chunk():
    """Block recompute of n layers with VPP repeats n layers of each chunk (as Megatron applies it, and as
    the memory model counts it): on 70B at PP4 VPP5 (chunks of four layers) n=2 repeats half the stage's
    forwards, n=4 all of them, like uniform; the memory and the time of a layout read it the same way."""
    w = workload("llama3_70b", gpus=32)
    base = LayoutConfig(tp=4, pp=4, vpp=5, cp=2, sp=True, dist_opt=True)
    compute = estimate(w, base).breakdown["compute"]
    for n, share in ((1, 0.25), (2, 0.5), (4, 1.0)):
        block = estimate(w, base.replace(recompute="full", recompute_method="block", recompute_num_layers=n))
        assert block.breakdown["recompute"] == pytest.approx(share * compute / 3, rel=1e-6)
    uniform = estimate(w, base.replace(recompute="full", recompute_method="uniform", recompute_num_layers=1))
    assert uniform.breakdown["recompute"] == pytest.approx(compute / 3, rel=1e-6)


def test_many_equals_one_by_one():
    space = load_space("qwen3_30b")
    w = make_workload(space, gpus=16)
    configs = enumerate_legal(space, w).configs[::997]
    many = estimate_many(w, configs)
    for i, config in enumerate(configs):
        assert many.step_time_s[i] == pytest.approx(estimate(w, config).step_time_s)
        assert many.peak_mem_gib[i] == pytest.approx(estimate(w, config).peak_mem_gib)


def test_gradient_reduction_hides_behind_one_micro_batch_not_the_whole_step():
    """overlap_grad_reduce can only start when the last micro-batch's backward produces gradients:
    more micro-batches (same per-GPU work each) leave the reduction just as exposed."""
    few = workload("llama3_8b", gpus=64, global_batch_size=64)
    many = workload("llama3_8b", gpus=64, global_batch_size=512)
    layout = LayoutConfig(dist_opt=True)
    dp_few = estimate(few, layout).breakdown["dp"]
    dp_many = estimate(many, layout).breakdown["dp"]
    assert dp_many == pytest.approx(dp_few, rel=0.05)
    assert dp_few > 0


def test_a_data_parallel_group_pools_the_nics_of_its_members_in_a_node():
    """TP 1: eight members of a data-parallel group per 8-GPU node share eight NICs; TP 8: one each."""
    from autotune.cost._arrays import LayoutArrays
    from autotune.cost.step_time import _link_bytes_per_s

    w = workload("llama3_70b", gpus=64)
    x = LayoutArrays.from_configs([LayoutConfig()])
    network = w.cluster.gpu.network_gbps * 1e9
    pooled = _link_bytes_per_s(x.tp * 64, w, x.tp)[0]
    alone = _link_bytes_per_s(x.tp * 64, w, x.tp * 8)[0]
    assert pooled == pytest.approx(min(8 * network, w.cluster.gpu.nvlink_gbps * 1e9) * 0.8)
    assert alone == pytest.approx(network * 0.8)


def test_elementwise_work_is_the_same_seconds_for_every_layout_and_repeats_with_recompute(monkeypatch):
    """The HBM-bound elementwise work on the GEMMs' activations: per GPU it is the model's work over the
    world, whatever the split (only the vocabulary padding of TP changes it), it scales with the GPU's
    HBM bandwidth, and full recompute repeats its forward share (a third)."""
    w = workload("llama3_70b", gpus=32)
    layouts = [LayoutConfig(tp=4, pp=4, vpp=5, cp=2, sp=True, dist_opt=True),
               LayoutConfig(tp=8, pp=2, sp=True, dist_opt=True, mbs=2),
               LayoutConfig(tp=4, pp=8, sp=True, dist_opt=True)]
    recomputed = LayoutConfig(tp=4, pp=4, sp=True, dist_opt=True, recompute="full")
    passes = cal.ACTIVATION_HBM_PASSES
    with_term = estimate_many(w, layouts).breakdown_s["compute"]
    recompute_with = estimate(w, recomputed).breakdown["recompute"]
    monkeypatch.setattr(cal, "ACTIVATION_HBM_PASSES", 0.0)
    without = estimate_many(w, layouts).breakdown_s["compute"]
    recompute_without = estimate(w, recomputed).breakdown["recompute"]
    elementwise = with_term - without
    assert elementwise.min() > 0 and elementwise.max() == pytest.approx(elementwise.min(), rel=0.01)
    # (GEMM FLOPs / 6h) elements per token, 2 bytes, PASSES times, over HBM
    f = flops_per_token(w.model.architecture, w.seq_length, 4)
    elements = (f.dense_mlp + f.attention_projections + f.logits) / (6 * w.model.architecture.hidden_size)
    tokens_per_gpu = w.global_batch_size * w.seq_length / w.cluster.gpus
    assert elementwise[0] == pytest.approx(tokens_per_gpu * elements * 2 * passes / (w.cluster.gpu.hbm_tbps * 1e12))
    assert recompute_with - recompute_without == pytest.approx(elementwise.mean() / 3, rel=0.02)


def test_a_cluster_with_fewer_nics_pays_for_what_leaves_the_node_only():
    """A cluster's own scale-out bandwidth (a space's defaults.network_gbps): halving it slows a
    tensor-parallel group that spans two nodes, and leaves a layout that stays inside a node as it was."""
    import dataclasses

    w = workload("vtrain_gpt_3p6b")
    assert w.cluster.scale_out_gbps == 12.5  # the vTrain cluster's 800 Gb/s per eight-GPU node
    dgx = dataclasses.replace(w, cluster=dataclasses.replace(w.cluster, network_gbps=None))
    assert dgx.cluster.scale_out_gbps == dgx.cluster.gpu.network_gbps == 25.0
    across = LayoutConfig(tp=16, mbs=8, recompute="full", recompute_method="uniform", recompute_num_layers=1)
    inside = LayoutConfig(tp=8, pp=2, mbs=8, recompute="full", recompute_method="uniform", recompute_num_layers=1)
    assert estimate(w, across).breakdown["tp"] == pytest.approx(2 * estimate(dgx, across).breakdown["tp"])
    assert estimate(w, inside).breakdown["tp"] == pytest.approx(estimate(dgx, inside).breakdown["tp"])
    assert estimate(w, inside).breakdown["pp"] > estimate(dgx, inside).breakdown["pp"]  # its stages span nodes


def test_gradients_reduced_after_the_backward_are_exposed_in_full():
    """Older Megatron's local DDP all-reduces after the whole backward (overlap_grad_reduce False): the
    whole collective is on the step, where the overlapped reduction leaves part of it."""
    from autotune.cost import TrainingSettings

    w = workload("llama3_8b", gpus=64)
    layout = LayoutConfig(tp=2, mbs=1)
    x = estimate_many(w, [layout], settings=TrainingSettings(overlap_grad_reduce=True)).breakdown_s["dp"][0]
    y = estimate_many(w, [layout], settings=TrainingSettings(overlap_grad_reduce=False)).breakdown_s["dp"][0]
    assert y > x > 0
    fp16 = estimate_many(w, [layout], settings=TrainingSettings(grad_reduce_in_fp32=False,
                                                                  overlap_grad_reduce=False)).breakdown_s["dp"][0]
    assert fp16 == pytest.approx(y / 2)  # an all-reduce of 2-byte instead of 4-byte gradients
