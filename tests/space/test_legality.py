"""Each Megatron rule, in both directions, for MoE and dense models (table-driven)."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.config import LayoutConfig
from autotune.space import RULE_NAMES, load_space, make_workload, policy_violations, violations


def workload(model: str, arch: dict | None = None, **options):
    space = load_space(model)
    if arch:  # a catalog model with some architecture numbers changed
        model_spec = dataclasses.replace(space.model, architecture=dataclasses.replace(space.model.architecture, **arch))
        space = dataclasses.replace(space, model=model_spec)
    return make_workload(space, **options)


FULL = {"recompute": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
# the recipe layouts of the two MoE models with performance knobs
Q = {"ep": 16, "dist_opt": True}
D = {"tp": 2, "pp": 16, "ep": 64, "sp": True, "dist_opt": True}
PERF_COMMON = [  # (knobs, rule, broken) cases that read the same on both models (recipe layout: PP1 or with VPP)
    ({"pp": 8, "vpp": 2, "ep": 8, "ep_overlap": True}, "ep_overlap_without_full_recompute", False),
    ({"pp": 8, "vpp": 2, "ep": 8, "ep_overlap": True}, "ep_overlap_without_shared_expert_overlap", False),
    ({"pp": 8, "vpp": 2, "ep": 8, "ep_overlap": True, "cuda_graph": "te_attn_router"},
     "ep_overlap_graph_scope_without_moe_mlp", False),
]

# (model, workload options, config, rule, broken?)
CASES = [
    # 1. world % (TP*PP*CP)
    ("llama3_70b", {"gpus": 32}, {"tp": 4, "pp": 4, "cp": 2, "sp": True}, "world_divisible_by_tp_pp_cp", False),
    ("llama3_70b", {"gpus": 32}, {"tp": 4, "pp": 5, "sp": True}, "world_divisible_by_tp_pp_cp", True),
    # EP is not part of DP: TP*PP*CP = 1 divides 16 even though EP = 16.
    ("qwen3_30b", {"gpus": 16}, {"ep": 16}, "world_divisible_by_tp_pp_cp", False),
    # 2. MoE: world % (ETP*EP*PP)
    ("qwen3_30b", {"gpus": 16}, {"pp": 2, "ep": 8}, "world_divisible_by_etp_ep_pp", False),
    ("qwen3_30b", {"gpus": 16}, {"pp": 2, "ep": 16}, "world_divisible_by_etp_ep_pp", True),
    ("qwen3_30b", {"gpus": 16}, {"tp": 2, "sp": True, "ep": 8, "etp": 4}, "world_divisible_by_etp_ep_pp", True),
    # 3. VPP needs PP
    ("llama3_70b", {"gpus": 32}, {"pp": 2, "vpp": 2}, "vpp_needs_pp", False),
    ("llama3_70b", {"gpus": 32}, {"pp": 1, "vpp": 2}, "vpp_needs_pp", True),
    # 4. heads % TP
    ("qwen3_30b", {"gpus": 16}, {"tp": 8, "sp": True}, "heads_divisible_by_tp", False),
    ("gpt_oss_120b", {"gpus": 64}, {"tp": 8, "sp": True}, "heads_divisible_by_tp", False),
    ("llama3_70b", {"gpus": 48, "gpus_per_node": 8}, {"tp": 3}, "heads_divisible_by_tp", True),
    # 5. kv groups vs TP, including kv-groups smaller than TP (4 groups, TP 8: 8 % 4 == 0 is allowed)
    ("qwen3_30b", {"gpus": 16}, {"tp": 8, "sp": True}, "query_groups_compatible_with_tp", False),
    ("qwen3_30b", {"gpus": 16}, {"tp": 2, "sp": True}, "query_groups_compatible_with_tp", False),
    ("llama3_70b", {"gpus": 48}, {"tp": 6}, "query_groups_compatible_with_tp", True),
    # 6. SP needs TP > 1
    ("llama3_8b", {"gpus": 8}, {"tp": 2, "sp": True}, "sp_needs_tp", False),
    ("llama3_8b", {"gpus": 8}, {"tp": 1, "sp": True}, "sp_needs_tp", True),
    ("qwen3_30b", {"gpus": 16}, {"tp": 1, "sp": True, "ep": 8}, "sp_needs_tp", True),
    # 7. EP > 1 with TP > 1 needs SP
    ("qwen3_30b", {"gpus": 16}, {"tp": 2, "ep": 8, "sp": True}, "ep_with_tp_needs_sp", False),
    ("qwen3_30b", {"gpus": 16}, {"tp": 2, "ep": 8, "sp": False}, "ep_with_tp_needs_sp", True),
    ("qwen3_30b", {"gpus": 16}, {"tp": 1, "ep": 8, "sp": False}, "ep_with_tp_needs_sp", False),
    # 8. EP needs an MoE model; experts % EP
    ("qwen3_30b", {"gpus": 16}, {"ep": 16}, "ep_needs_moe", False),
    ("llama3_8b", {"gpus": 8}, {"ep": 2}, "ep_needs_moe", True),
    ("llama3_8b", {"gpus": 8}, {"etp": 2}, "etp_needs_moe", True),
    ("qwen3_30b", {"gpus": 16}, {"ep": 8}, "experts_divisible_by_ep", False),
    ("deepseek_v3", {"gpus": 1024}, {"ep": 3, "pp": 4}, "experts_divisible_by_ep", True),
    # 9. even layer split over PP, with embedding/loss accounted (qwen3_235b: 94 + 2 = 96 layers)
    ("qwen3_235b", {"gpus": 256}, {"pp": 16}, "layers_divisible_by_pp", False),
    ("qwen3_235b", {"gpus": 256}, {"pp": 8}, "layers_divisible_by_pp", False),
    ("qwen3_235b", {"gpus": 240}, {"pp": 5}, "layers_divisible_by_pp", True),
    ("qwen3_30b", {"gpus": 40}, {"pp": 5}, "layers_divisible_by_pp", True),
    ("llama3_70b", {"gpus": 40}, {"pp": 5}, "layers_divisible_by_pp", False),
    # DeepSeek-V3 uses the recipe's layout table instead of an even split
    ("deepseek_v3", {"gpus": 1024}, {"pp": 16, "ep": 64}, "pipeline_layout_known", False),
    ("deepseek_v3", {"gpus": 1024}, {"pp": 2, "ep": 64}, "pipeline_layout_known", True),
    ("deepseek_v3", {"gpus": 1024}, {"pp": 16, "ep": 64}, "layers_divisible_by_pp", False),
    # 10. (layers / PP) % VPP
    ("llama3_70b", {"gpus": 32}, {"pp": 4, "vpp": 5, "tp": 4, "sp": True}, "stage_layers_divisible_by_vpp", False),
    ("llama3_70b", {"gpus": 32}, {"pp": 4, "vpp": 3, "tp": 4, "sp": True}, "stage_layers_divisible_by_vpp", True),
    ("qwen3_235b", {"gpus": 256}, {"pp": 16, "vpp": 2}, "stage_layers_divisible_by_vpp", False),
    ("qwen3_235b", {"gpus": 256}, {"pp": 16, "vpp": 4}, "stage_layers_divisible_by_vpp", True),
    # 11. CP: seq % (2*CP)
    ("llama3_8b", {"gpus": 8}, {"cp": 4}, "cp_divides_sequence", False),
    ("llama3_8b", {"gpus": 8, "seq_length": 4100}, {"cp": 4}, "cp_divides_sequence", True),
    ("llama3_8b", {"gpus": 8, "seq_length": 4100}, {"cp": 1}, "cp_divides_sequence", False),
    # 12. GBS % (MBS * DP)
    ("qwen3_30b", {"gpus": 16}, {"mbs": 4}, "global_batch_divisible", False),
    ("qwen3_30b", {"gpus": 16, "global_batch_size": 24}, {"mbs": 4}, "global_batch_divisible", True),
    # EP is not part of DP: DP stays 16 at EP=16 (96 % 16 == 0), it is not 1
    ("qwen3_30b", {"gpus": 16, "global_batch_size": 96}, {"ep": 16, "mbs": 2}, "global_batch_divisible", False),
    # 13. interleaved schedule: microbatches % PP
    ("llama3_70b", {"gpus": 32, "global_batch_size": 512}, {"tp": 4, "pp": 4, "vpp": 5, "sp": True},
     "vpp_microbatches_divisible_by_pp", False),
    ("llama3_70b", {"gpus": 32, "global_batch_size": 24}, {"tp": 4, "pp": 4, "vpp": 5, "sp": True},
     "vpp_microbatches_divisible_by_pp", False),  # DP 2, 12 microbatches, a multiple of PP=4
    ("llama3_70b", {"gpus": 32, "global_batch_size": 20}, {"tp": 4, "pp": 4, "vpp": 5, "sp": True},
     "vpp_microbatches_divisible_by_pp", True),  # DP 2, 10 microbatches, not a multiple of 4
    ("llama3_70b", {"gpus": 32, "global_batch_size": 20}, {"tp": 4, "pp": 4, "vpp": 1, "sp": True},
     "vpp_microbatches_divisible_by_pp", False),  # without interleaving the rule does not apply
    # 14. recompute
    ("qwen3_30b", {"gpus": 16}, {"ep": 16, **FULL}, "recompute_method_matches_granularity", False),
    ("qwen3_30b", {"gpus": 16}, {"ep": 16, "recompute": "full"}, "recompute_method_matches_granularity", True),
    ("qwen3_30b", {"gpus": 16}, {"ep": 16, "recompute": "selective", "recompute_num_layers": 2},
     "recompute_method_matches_granularity", True),
    ("qwen3_30b", {"gpus": 16}, {"pp": 16, "recompute": "full", "recompute_method": "block",
                                 "recompute_num_layers": 3}, "recompute_num_layers_within_stage", False),
    ("qwen3_30b", {"gpus": 16}, {"pp": 16, "recompute": "full", "recompute_method": "block",
                                 "recompute_num_layers": 4}, "recompute_num_layers_within_stage", True),
    # dense FFN vs TP, expert FFN vs ETP
    ("llama3_70b", {"gpus": 32}, {"tp": 8, "sp": True}, "ffn_divisible_by_tp", False),
    ("qwen3_30b", {"gpus": 16}, {"tp": 2, "sp": True, "ep": 4, "etp": 2}, "expert_ffn_divisible_by_etp", False),
    ("qwen3_30b", {"gpus": 16}, {"tp": 2, "sp": True, "ep": 4, "etp": 2}, "etp_needs_moe", False),
    # no catalog model breaks the FFN rules, so these use the catalog model with one number changed
    ("llama3_8b", {"gpus": 8, "arch": {"ffn_hidden_size": 14001}}, {"tp": 2, "sp": True}, "ffn_divisible_by_tp", True),
    ("qwen3_30b", {"gpus": 16, "arch": {"moe_ffn_hidden_size": 100}}, {"tp": 8, "sp": True, "ep": 2, "etp": 8},
     "expert_ffn_divisible_by_etp", True),
    # performance knobs (issue 16): the recipe layout of each MoE model with one or two knobs changed
    *[(m, o, {**base, **knobs}, rule, bad) for m, o, base in (("qwen3_30b", {"gpus": 16}, Q), ("deepseek_v3", {}, D))
      for knobs, rule, bad in PERF_COMMON],
    ("llama3_8b", {"gpus": 8}, {"tp": 2, "sp": True, "ep_overlap": True}, "perf_knob_declared", True),
    ("qwen3_30b", {"gpus": 16}, {**Q, "shared_expert_overlap": True}, "perf_knob_declared", True),
    ("deepseek_v3", {}, {**D, "shared_expert_overlap": True}, "perf_knob_declared", False),
    ("qwen3_30b", {"gpus": 16}, {**Q, "ep": 1, "ep_overlap": True}, "perf_knob_needs_its_parent", True),
    ("qwen3_30b", {"gpus": 16}, {**Q, "dispatcher": "alltoall", "dispatcher_sms": 24}, "perf_knob_needs_its_parent", True),
    ("qwen3_30b", {"gpus": 16}, {**Q, "tp_comm_overlap": False}, "perf_knob_needs_its_parent", True),  # TP1: a no-op
    ("qwen3_30b", {"gpus": 16}, {**Q, "tp": 2, "sp": True, "ep": 8, "tp_comm_overlap": False},
     "perf_knob_needs_its_parent", False),
    ("qwen3_30b", {"gpus": 16}, {**Q, "cp_comm_type": "a2a"}, "perf_knob_needs_its_parent", True),  # CP1
    ("qwen3_30b", {"gpus": 16}, {**Q, "recompute_modules": "moe_act"}, "perf_knob_needs_its_parent", True),
    ("qwen3_30b", {"gpus": 16}, {**Q, "pp": 2, "ep": 8, "ep_overlap": True}, "ep_overlap_needs_vpp_with_pp", True),
    ("qwen3_30b", {"gpus": 16}, {**Q, "pp": 2, "vpp": 2, "ep": 8, "ep_overlap": True}, "ep_overlap_needs_vpp_with_pp", False),
    ("qwen3_30b", {"gpus": 16}, {**Q, **FULL, "ep_overlap": True}, "ep_overlap_without_full_recompute", True),
    ("qwen3_30b", {"gpus": 16}, {**Q, "recompute": "selective", "recompute_modules": "moe", "ep_overlap": True,
                                 "cuda_graph": "none"}, "ep_overlap_without_moe_recompute", True),
    ("qwen3_30b", {"gpus": 16}, {**Q, "recompute": "selective", "recompute_modules": "moe_act", "ep_overlap": True},
     "ep_overlap_without_moe_recompute", False),
    ("deepseek_v3", {}, {**D, "ep_overlap": True, "shared_expert_overlap": True},
     "ep_overlap_without_shared_expert_overlap", True),
    ("deepseek_v3", {"arch": {"mtp_num_layers": 2}}, {**D, "pp": 8, "vpp": 2, "ep_overlap": True},
     "ep_overlap_mtp_at_most_one_layer", True),
    ("deepseek_v3", {}, {**D, "pp": 8, "vpp": 2, "ep_overlap": True}, "ep_overlap_mtp_at_most_one_layer", False),
    ("deepseek_v3", {"arch": {"mtp_num_layers": 0}}, {**D, "pp": 8, "vpp": 2, "ep_overlap": True,
                                                     "cuda_graph": "te_attn_mlp"}, "ep_overlap_graph_scope_without_moe_mlp", True),
    ("deepseek_v3", {}, {**D, "recompute": "selective", "recompute_modules": "shared_experts",
                         "shared_expert_overlap": True}, "shared_experts_recompute_without_shared_expert_overlap", True),
    ("deepseek_v3", {}, {**D, "recompute": "selective", "recompute_modules": "shared_experts"},
     "shared_experts_recompute_without_shared_expert_overlap", False),
    ("qwen3_30b", {"gpus": 16}, {**Q, "recompute": "selective", "recompute_modules": "mla_up_proj"},
     "recompute_module_exists_in_model", True),
    ("deepseek_v3", {}, {**D, "recompute": "selective", "recompute_modules": "mla_up_proj+mlp"},
     "recompute_module_exists_in_model", False),
    ("qwen3_30b", {"gpus": 16}, {**Q, **FULL, "cuda_graph": "te_router"}, "full_recompute_needs_full_iteration_graph", True),
    ("qwen3_30b", {"gpus": 16}, {**Q, **FULL, "cuda_graph": "full_iteration"}, "full_recompute_needs_full_iteration_graph", False),
    ("qwen3_30b", {"gpus": 16}, {**Q, **FULL}, "full_recompute_needs_full_iteration_graph", False),  # recipe graphs turned off
    ("qwen3_30b", {"gpus": 16}, {**Q, "recompute": "selective", "recompute_modules": "moe"},
     "moe_recompute_without_router_graph", True),  # the recipe's moe_router graph
    ("qwen3_30b", {"gpus": 16}, {**Q, "recompute": "selective", "recompute_modules": "moe", "cuda_graph": "te_attn"},
     "moe_recompute_without_router_graph", False),
    ("qwen3_30b", {"gpus": 16}, {**Q, "cuda_graph": "te_attn_mlp"}, "mlp_graph_needs_dense_layers", True),
    ("deepseek_v3", {}, {**D, "cuda_graph": "te_attn_mlp"}, "mlp_graph_needs_dense_layers", False),
    ("qwen3_30b", {"gpus": 16}, {**Q, "cpu_offload_layers": 4, "cuda_graph": "none"}, "cpu_offload_needs_pp1", False),
    ("qwen3_30b", {"gpus": 16}, {**Q, "pp": 2, "ep": 8, "cpu_offload_layers": 4, "cuda_graph": "none"},
     "cpu_offload_needs_pp1", True),
    ("qwen3_30b", {"gpus": 16}, {**Q, **FULL, "cpu_offload_layers": 4, "cuda_graph": "none"},
     "cpu_offload_without_recompute", True),
    ("qwen3_30b", {"gpus": 16}, {**Q, "cpu_offload_layers": 4, "cuda_graph": "none"}, "cpu_offload_without_recompute", False),
    ("qwen3_30b", {"gpus": 16}, {**Q, "cpu_offload_layers": 48, "cuda_graph": "none"}, "cpu_offload_layers_below_num_layers", True),
    ("qwen3_30b", {"gpus": 16}, {**Q, "cpu_offload_layers": 47, "cuda_graph": "none"}, "cpu_offload_layers_below_num_layers", False),
    ("qwen3_30b", {"gpus": 16}, {**Q, "cpu_offload_layers": 4}, "cpu_offload_with_graphs_only_full_iteration", True),
    ("qwen3_30b", {"gpus": 16}, {**Q, "cpu_offload_layers": 4, "cuda_graph": "full_iteration"},
     "cpu_offload_with_graphs_only_full_iteration", False),
    ("qwen3_30b", {"gpus": 16}, {**Q, "cp": 2, "ep": 8, "cp_comm_type": "a2a"}, "cp_a2a_heads_divisible_by_cp", False),
    ("qwen3_30b", {"gpus": 16}, {**Q, "tp": 4, "sp": True, "cp": 4, "ep": 4, "cp_comm_type": "a2a"},
     "cp_a2a_heads_divisible_by_cp", True),  # 4 KV heads / TP4 = 1 per rank, not divisible by CP4
    ("qwen3_30b", {"gpus": 16}, {**Q, "dispatcher": "flex_deepep"}, "flex_backend_supports_gpu", False),
    ("qwen3_30b", {"gpus": 16, "gpu": "gb200"}, {**Q, "dispatcher": "flex_deepep"}, "flex_backend_supports_gpu", True),
    ("qwen3_30b", {"gpus": 16}, {**Q, "ep_overlap": True}, "perf_knob_declared", False),
    ("qwen3_30b", {"gpus": 16}, {**Q, "dispatcher": "alltoall", "ep_overlap": True}, "perf_knob_needs_its_parent", False),
]

@pytest.mark.parametrize("model,options,config,rule,broken", CASES,
                         ids=[f"{c[0]}-{c[3]}-{'bad' if c[4] else 'ok'}-{i}" for i, c in enumerate(CASES)])
def test_rule(model, options, config, rule, broken):
    found = {v.rule: v.message for v in violations(LayoutConfig.from_mapping(config), workload(model, **options))}
    assert (rule in found) == broken, found
    if broken:
        assert found[rule]  # a human message


def test_every_rule_is_covered_both_ways():
    broken = {c[3] for c in CASES if c[4]}
    passing = {c[3] for c in CASES if not c[4]}
    assert set(RULE_NAMES) <= broken
    assert set(RULE_NAMES) <= passing


def test_recipe_defaults_are_legal():
    """Each model's recipe default layout is legal on the recipe's own cluster."""
    from autotune.space import available_space_names

    for name in available_space_names():
        space = load_space(name)
        w = make_workload(space)
        layout = LayoutConfig.from_mapping(space.model.defaults.layout)
        assert violations(layout, w) == [], (name, violations(layout, w))


def test_a_layout_off_the_grid_gets_no_batch_message_with_a_fractional_data_parallel_size():
    """Review: TP=3 on 16 GPUs also read "global batch 1024 is not divisible by MBS*DP = 1*5", a DP of 16 // 3."""
    from autotune.space import violations

    space = load_space("qwen3_30b")
    rules = [v.rule for v in violations(LayoutConfig(tp=3, pp=1, cp=1, ep=1, vpp=2), make_workload(space, gpus=16))]
    assert "world_divisible_by_tp_pp_cp" in rules
    assert "global_batch_divisible" not in rules and "vpp_microbatches_divisible_by_pp" not in rules


def test_policy_is_separate_from_legality():
    w = workload("llama3_70b", gpus=32)
    layout = LayoutConfig(tp=16, sp=True)
    assert violations(layout, w) == []
    assert [v.rule for v in policy_violations(layout, w)] == ["tp_within_nvlink_domain"]
    assert policy_violations(layout, w, {"tp_within_nvlink_domain": False}) == []


def test_nvl72_domain_allows_tp_across_trays():
    w = workload("llama3_70b", gpus=32, gpu="gb200")
    assert w.cluster.gpus_per_node == 4
    assert policy_violations(LayoutConfig(tp=8, sp=True), w) == []


@pytest.mark.parametrize("method", ["uniform", "block"])
def test_recompute_num_layers_beyond_a_model_chunk_is_filtered_as_the_same_run(method):
    """Megatron recomputes per model chunk (one TransformerBlock per VPP chunk): with PP4 VPP4 a chunk of
    qwen3_30b holds 48/4/4 = 3 layers, so n = 4 or 12 runs exactly as n = 3. Megatron accepts them (it
    checks n against layers/PP only), so the filter is a policy; the cost model predicts the twins alike."""
    from autotune.cost import estimate_many

    w = workload("qwen3_30b", gpus=16)
    chunk = dict(tp=1, pp=4, vpp=4, ep=4, dist_opt=True, recompute="full", recompute_method=method)
    twins = [LayoutConfig(**chunk, recompute_num_layers=n) for n in (3, 4, 12)]
    assert all(violations(t, w) == [] for t in twins)
    assert policy_violations(twins[0], w) == []
    for twin in twins[1:]:
        (filtered,) = policy_violations(twin, w)
        assert filtered.rule == "recompute_num_layers_within_chunk" and "same run as 3" in filtered.message
    predicted = estimate_many(w, twins)
    assert len(set(predicted.tokens_per_s_per_gpu)) == 1 and len(set(predicted.peak_mem_gib)) == 1
    # without VPP the chunk is the stage, which the Megatron rule bounds already
    assert policy_violations(LayoutConfig(**{**chunk, "vpp": 1}, recompute_num_layers=12), w) == []
