"""The one knob -> Megatron-Bridge field mapping, knob by knob (field names of Bridge 0.6 / MCore 0.19)."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.config import LayoutConfig
from autotune.megatron.overrides import config_from_overrides, layout_fields, layout_overrides, parse_overrides
from autotune.space import load_space, make_workload
from tests.test_export import BRIDGE_FIELDS

MOE = make_workload(load_space("qwen3_30b"), gpus=16)
DENSE = make_workload(load_space("llama3_70b"), gpus=32)


@pytest.mark.parametrize("knob,value,field,expected", [
    ("tp", 4, "model.tensor_model_parallel_size", 4),
    ("pp", 2, "model.pipeline_model_parallel_size", 2),
    ("vpp", 3, "model.virtual_pipeline_model_parallel_size", 3),
    ("vpp", 1, "model.virtual_pipeline_model_parallel_size", None),  # 1 means no interleaving: None in Bridge
    ("cp", 2, "model.context_parallel_size", 2),
    ("ep", 8, "model.expert_model_parallel_size", 8),
    ("etp", 2, "model.expert_tensor_parallel_size", 2),
    ("sp", True, "model.sequence_parallel", True),
    ("mbs", 4, "train.micro_batch_size", 4),
    ("dist_opt", True, "ddp.use_distributed_optimizer", True),
    ("dist_opt", True, "optimizer.use_distributed_optimizer", True),
    ("dist_opt", False, "optimizer.use_precision_aware_optimizer", False),
    ("recompute", "selective", "model.recompute_granularity", "selective"),
    ("recompute", "none", "model.recompute_granularity", None),
])
def test_each_knob_maps_to_its_field(knob, value, field, expected):
    fields = layout_fields(LayoutConfig.from_mapping({knob: value}), MOE)
    assert fields[field] == expected
    assert set(fields) <= BRIDGE_FIELDS


def test_full_recompute_sets_method_layers_and_turns_cuda_graphs_off():
    layout = LayoutConfig(recompute="full", recompute_method="block", recompute_num_layers=2)
    fields = layout_fields(layout, MOE)
    assert (fields["model.recompute_granularity"], fields["model.recompute_method"],
            fields["model.recompute_num_layers"], fields["model.cuda_graph_impl"]) == ("full", "block", 2, "none")


def test_workload_fields_and_dense_models():
    fields = layout_fields(LayoutConfig(tp=8, sp=True), DENSE)
    assert fields["train.global_batch_size"] == 512
    assert fields["model.seq_length"] == fields["dataset.seq_length"] == 8192
    # the recipe's own precision keeps the recipe's MixedPrecisionConfig (bf16_mixed would replace it, and with it
    # the recipe's grad_reduce_in_fp32); another precision names Bridge's recipe for it
    assert "mixed_precision" not in fields
    assert layout_fields(LayoutConfig(tp=8, sp=True), dataclasses.replace(DENSE, precision="fp8"))[
        "mixed_precision"] == "bf16_with_fp8_current_scaling_mixed"
    assert "model.expert_model_parallel_size" not in fields  # dense models get no expert fields


@pytest.mark.parametrize("config", [
    {"tp": 2, "pp": 4, "vpp": 3, "cp": 2, "ep": 8, "etp": 2, "sp": True, "mbs": 2, "dist_opt": True},
    {"recompute": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
    {"recompute": "selective", "ep": 16},
])
def test_overrides_round_trip(config):
    layout = LayoutConfig.from_mapping(config)
    lines = layout_overrides(layout, MOE)
    assert config_from_overrides(lines) == layout
    assert all("=" in line for line in lines)
    with pytest.raises(ValueError):
        parse_overrides(["not-an-override"])
