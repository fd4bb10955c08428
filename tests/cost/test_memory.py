"""Memory terms against hand-computed cases."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from autotune.config import LayoutConfig
from autotune.cost import LayoutArrays, TrainingSettings, estimate, estimate_many, total_params
from autotune.cost.memory import GIB, _activation_bytes, _layer_activation_bytes, _state_bytes, param_counts
from autotune.space import load_space, make_workload


def workload(model, **options):
    return make_workload(load_space(model), **options)


def test_total_params_match_the_published_sizes():
    assert total_params(load_space("qwen3_30b").model.architecture) / 1e9 == pytest.approx(30.5, abs=0.1)
    assert total_params(load_space("llama3_70b").model.architecture) / 1e9 == pytest.approx(70.6, abs=0.1)
    assert total_params(load_space("deepseek_v3").model.architecture) / 1e9 == pytest.approx(671, abs=1)


def test_dense_state_is_18_bytes_per_param_without_dist_opt():
    w = workload("llama3_8b", gpus=8)
    a = w.model.architecture
    p = param_counts(a)
    x = LayoutArrays.from_configs([LayoutConfig(dist_opt=False)])
    params = a.num_layers * (p.attention_per_layer + p.dense_mlp_per_layer) + 2 * 128256 * 4096
    assert _state_bytes(x, w)[0] == pytest.approx(18 * params)


def test_dist_opt_is_6_plus_12_over_shard():
    w = workload("llama3_8b", gpus=8)
    a = w.model.architecture
    p = param_counts(a)
    # TP 2, CP 2: DP 2, dense shard DP*CP = 4; per GPU params / TP
    x = LayoutArrays.from_configs([LayoutConfig(tp=2, cp=2, sp=True, dist_opt=True)])
    params = (a.num_layers * (p.attention_per_layer + p.dense_mlp_per_layer) + 2 * 128256 * 4096) / 2
    assert _state_bytes(x, w)[0] == pytest.approx(params * (6 + 12 / 4))


def test_all_routed_experts_count_not_only_the_active_ones():
    w = workload("qwen3_30b", gpus=16)
    a = w.model.architecture
    p = param_counts(a)
    x = LayoutArrays.from_configs([LayoutConfig(ep=16, dist_opt=False)])
    experts_per_gpu = a.num_layers * p.experts_per_layer / 16
    assert experts_per_gpu == pytest.approx(a.num_layers * 128 * 3 * 2048 * 768 / 16)
    dense_per_gpu = a.num_layers * (p.attention_per_layer + p.moe_shared_per_layer) + 2 * 151936 * 2048
    assert _state_bytes(x, w)[0] == pytest.approx(18 * (experts_per_gpu + dense_per_gpu))


def test_expert_shard_is_the_expert_data_parallel_size():
    w = workload("qwen3_30b", gpus=16)
    p = param_counts(w.model.architecture)
    x = LayoutArrays.from_configs([LayoutConfig(ep=4, dist_opt=True)])
    experts = 48 * p.experts_per_layer / 4
    dense = 48 * (p.attention_per_layer + p.moe_shared_per_layer) + 2 * 151936 * 2048
    edp = 16 / 4
    assert _state_bytes(x, w)[0] == pytest.approx(experts * (6 + 12 / edp) + dense * (6 + 12 / 16))


def test_activation_per_layer_korthikanti_with_and_without_sp():
    w = workload("llama3_70b", gpus=32)
    s, h, ffn = 8192, 8192, 28672
    ratio = ffn / h
    x = LayoutArrays.from_configs([LayoutConfig(tp=4, sp=True), LayoutConfig(tp=4, sp=False)])
    per_layer = _layer_activation_bytes(x, w)
    assert per_layer[0] == pytest.approx(s * h * (18 + 4 * ratio) / 4)
    assert per_layer[1] == pytest.approx(s * h * (10 + (8 + 4 * ratio) / 4))


def test_full_recompute_keeps_only_layer_inputs():
    w = workload("llama3_70b", gpus=32, global_batch_size=512)
    none = LayoutConfig(tp=4, pp=4, sp=True)
    full = LayoutConfig(tp=4, pp=4, sp=True, recompute="full", recompute_method="uniform", recompute_num_layers=1)
    x = LayoutArrays.from_configs([none, full])
    layers = 80 // 4
    per_layer = _layer_activation_bytes(x, w)[0]
    layer_input = 2 * 8192 * 8192 / 4  # 2*s*b*h bytes, / TP under SP
    acts = _activation_bytes(x, w)
    in_flight = 4  # PP micro-batches on the first stage
    assert acts[0] == pytest.approx(layers * per_layer * in_flight)
    # the inputs of every layer for each micro-batch in flight; one layer's full activations once, for
    # the micro-batch whose backward recomputes them (not once per micro-batch in flight)
    assert acts[1] == pytest.approx(layers * layer_input * in_flight + per_layer)
    assert acts[1] < acts[0] / 5


def test_full_recompute_working_set_counts_once_per_stage():
    """Deep pipelines hold many micro-batches; only their checkpoints grow with them. Block recompute with
    layers stored in full needs no working set on top: the stored layers of the micro-batch being
    recomputed were freed by their own backward first."""
    w = workload("llama3_70b", gpus=64, global_batch_size=512)
    x = LayoutArrays.from_configs([
        LayoutConfig(tp=8, pp=pp, recompute="full", recompute_method=method, recompute_num_layers=n)
        for pp in (2, 8) for method, n in (("uniform", 1), ("uniform", 2), ("block", 2), ("block", 10))])
    per_layer = _layer_activation_bytes(x, w)
    layer_input = 2 * 8192 * 8192  # 2*s*b*h bytes, not split without SP
    in_flight = np.array([2, 2, 2, 2, 8, 8, 8, 8])
    # 40 layers per stage at PP2, 10 at PP8
    kept = (np.array([40, 20, 2, 10, 10, 5, 2, 10]) * layer_input
            + np.array([0, 0, 38, 30, 0, 0, 8, 0]) * per_layer)
    working = np.array([1, 2, 0, 0, 1, 2, 0, 1]) * per_layer  # block at PP8, n=10: the whole stage recomputed
    assert _activation_bytes(x, w) == pytest.approx(kept * in_flight + working)


def test_full_recompute_counts_its_layers_per_virtual_pipeline_chunk():
    """With VPP, recompute_num_layers counts within each model chunk (Megatron's TransformerBlock):
    70B on PP4 VPP5 has 20 layers per stage in five chunks of four."""
    w = workload("llama3_70b", gpus=64, global_batch_size=512)
    x = LayoutArrays.from_configs([
        LayoutConfig(tp=8, pp=4, vpp=5, recompute="full", recompute_method=method, recompute_num_layers=n)
        for method, n in (("uniform", 2), ("uniform", 4), ("block", 2), ("block", 4))])
    per_layer = _layer_activation_bytes(x, w)
    layer_input = 2 * 8192 * 8192
    in_flight = 4 * (1 + 3 / 20)  # PP micro-batches, times the interleaving factor 1 + (PP-1)/(PP*VPP)
    kept = np.array([10, 5, 10, 20]) * layer_input + np.array([0, 0, 10, 0]) * per_layer
    working = np.array([2, 4, 0, 1]) * per_layer
    assert _activation_bytes(x, w) == pytest.approx(kept * in_flight + working)

def test_the_interleaved_last_stage_holds_its_other_chunks_in_flight():
    """Interleaved, the last stage keeps (VPP-1)*PP + 1 chunk-micro-batches: PP - (PP-1)/VPP stages'
    worth, not one; with full recompute and GPT-OSS's 201k vocabulary its logits make it the peak."""
    w = workload("gpt_oss_120b", gpus=64, global_batch_size=512, seq_length=4096)
    config = LayoutConfig(tp=1, pp=4, vpp=3, ep=8, mbs=4, recompute="full", recompute_method="uniform",
                          recompute_num_layers=1, dist_opt=True)
    x = LayoutArrays.from_configs([config])
    per_layer = _layer_activation_bytes(x, w)[0]
    layer_input = 2 * 4096 * 4 * 2880  # 2*s*b*h bytes
    kept = 9 * layer_input  # 36 layers / PP4, a checkpoint per layer
    vocab = 201088 + (-201088) % 128  # padded to a multiple of 128 at TP1
    logits = 4 * 4096 * 4 * vocab  # bytes: bf16 logits and their gradient
    first = kept * 4 * (1 + 3 / 12) + per_layer
    last = kept * (4 - 3 / 3) + per_layer + logits
    assert last > first  # the case this test is about
    assert _activation_bytes(x, w)[0] == pytest.approx(last)


def test_more_memory_for_larger_micro_batch_and_less_with_recompute():
    w = workload("qwen3_30b", gpus=16)
    base = LayoutConfig(ep=16, dist_opt=True)
    e1 = estimate(w, base)
    assert estimate(w, base.replace(mbs=2)).peak_mem_gib > e1.peak_mem_gib
    selective = estimate(w, base.replace(recompute="selective")).peak_mem_gib
    full = estimate(w, base.replace(recompute="full", recompute_method="uniform", recompute_num_layers=1))
    assert full.peak_mem_gib < selective
    assert full.breakdown["recompute"] > 0


def test_fits_compares_with_the_gpu_memory():
    w = workload("llama3_70b", gpus=8)
    big = estimate(w, LayoutConfig(tp=1, pp=1, dist_opt=False))
    assert not big.fits and big.peak_mem_gib > 79.6
    small = estimate(w, LayoutConfig(tp=8, sp=True, dist_opt=True, recompute="full",
                                     recompute_method="uniform", recompute_num_layers=1))
    assert small.peak_mem_gib < big.peak_mem_gib
    total = sum(small.memory.values())
    assert total == pytest.approx(small.peak_mem_gib)
    assert small.memory["overhead_gib"] > 1.5  # CUDA context at least
    assert GIB == 2 ** 30


def test_fp8_shrinks_activations():
    bf16 = workload("llama3_70b", gpus=32)
    fp8 = dataclasses.replace(bf16, precision="fp8")
    layout = LayoutConfig(tp=4, pp=4, vpp=5, cp=2, sp=True, dist_opt=True)
    assert estimate(fp8, layout).memory["activations_gib"] < estimate(bf16, layout).memory["activations_gib"]


PUBLIC_SWEEPS = Path(__file__).resolve().parents[2] / "benchmarks" / "public_sweeps"


@pytest.mark.parametrize("name", ["vtrain_gpt_3p6b", "vtrain_gpt_18p4b", "vtrain_gpt_39p1b", "vtrain_gpt_175b"])
def test_every_layout_of_the_public_a100_sweeps_is_predicted_to_fit(name):
    """The vTrain sweeps list only layouts that ran on their 80 GB A100s (full recompute, FP16 gradients,
    no distributed optimizer: the sweeps' stated or assumed settings), so the model must say each fits.
    Deep pipelines at large micro-batches failed this while the recomputed layer's activations were
    counted once per micro-batch in flight (175B TP8 PP32 MBS6: 106 GiB predicted)."""
    w = make_workload(load_space(name))
    table = pd.read_csv(PUBLIC_SWEEPS / f"{name}.csv")
    layouts = [LayoutConfig(tp=r.tp, pp=r.pp, mbs=r.mbs, recompute=r.recompute, recompute_method=r.recompute_method,
                            recompute_num_layers=r.recompute_num_layers, dist_opt=bool(r.dist_opt))
               for r in table.itertuples()]
    settings = TrainingSettings(grad_reduce_in_fp32=False, overlap_grad_reduce=False)
    e = estimate_many(w, layouts, settings=settings)
    too_big = [f"{c.short()} {p:.1f} GiB" for c, p, f in zip(layouts, e.peak_mem_gib, e.fits) if not f]
    assert not too_big, f"predicted not to fit a {w.cluster.gpu.memory_gib:.0f} GiB A100 although they ran: {too_big}"
    # and not by predicting too little: at least the mixed-precision Adam state of the rank's share of the
    # parameters the sweep states (16 bytes each: fp16 weights and gradients, fp32 master and two moments)
    # plus one micro-batch's checkpointed layer inputs on the stage (2*s*b*h bytes per layer)
    a = w.model.architecture
    billions = {"vtrain_gpt_3p6b": 3.6, "vtrain_gpt_18p4b": 18.4, "vtrain_gpt_39p1b": 39.1, "vtrain_gpt_175b": 175.0}
    for c, peak in zip(layouts, e.peak_mem_gib):
        state = 16 * billions[name] * 1e9 / (c.tp * c.pp)
        checkpoints = 2 * w.seq_length * c.mbs * a.hidden_size * a.num_layers / c.pp / c.tp
        assert peak * 2**30 >= state + checkpoints, (c.short(), peak)
