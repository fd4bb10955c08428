"""Property tests (Hypothesis): random launcher results and random search-space YAML through validation.

Results: whatever JSON object a launcher prints, `parse_result` returns an outcome (never raises),
and an outcome that `impossible_result` accepts holds only finite, positive, physically possible
numbers. Spaces: whatever architecture numbers a YAML file holds, loading either fails with one
ConfigError or gives a space whose cost model runs without an arithmetic error.
"""

from __future__ import annotations

import math

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.backends import TrialSpec, TrialStatus
from autotune.backends.validation import METRIC_KEYS, impossible_result, parse_result, peak_tflops
from autotune.catalog import Architecture
from autotune.errors import ConfigError
from autotune.space import load_space, make_workload, space_dir

SPEC = TrialSpec(study="p", trial=1, model="qwen3_30b", gpus=16, gpus_per_node=8, gpu="h100",
                 global_batch_size=1024, seq_length=4096, precision="bf16", config={}, overrides=[], warmup_steps=1)
WORKLOAD = make_workload(load_space("qwen3_30b"), gpus=16)

numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(min_value=-(10**400), max_value=10**400),
                    st.sampled_from([0, -0.0, 1e-300, 1e300, 30.0, 0.4, 70.0]))
json_values = st.recursive(st.one_of(st.none(), st.booleans(), numbers, st.text(max_size=20)),
                           lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                   st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                           max_leaves=8)
results = st.fixed_dictionaries({}, optional={
    "status": st.one_of(st.sampled_from(["completed", "oom", "failed"]), json_values),
    **{key: st.one_of(numbers, json_values) for key in (*METRIC_KEYS, "wall_time_s")},
    "step_times_s": st.one_of(st.lists(numbers, max_size=4), json_values),
    "error": json_values, "artifacts": st.one_of(st.dictionaries(st.text(max_size=5), st.text(max_size=10)), json_values),
})


@settings(max_examples=400, deadline=None)
@given(result=results, times=st.lists(st.floats(min_value=1e-3, max_value=100), max_size=4))
def test_any_launcher_result_is_an_outcome_and_accepted_ones_are_physical(result, times):
    outcome = parse_result(SPEC, result, times, 1.0)
    assert outcome.trial == 1 and isinstance(outcome.status, TrialStatus)
    assert outcome.error is None or isinstance(outcome.error, str)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in outcome.artifacts.items())
    if outcome.status not in (TrialStatus.COMPLETED, TrialStatus.OOM):
        return
    problem = impossible_result(outcome.status.value, outcome.metrics(), outcome.step_times_s, WORKLOAD, 1)
    if problem is not None:
        assert isinstance(problem, str) and problem
        return
    for key, value in outcome.metrics().items():
        assert value is None or (math.isfinite(value) and value > 0), key
    gpu = WORKLOAD.cluster.gpu
    assert outcome.mfu is None or outcome.mfu <= 1.0
    assert outcome.tflops_per_gpu is None or outcome.tflops_per_gpu <= peak_tflops(gpu, "bf16")
    assert outcome.peak_mem_gib is None or outcome.peak_mem_gib <= 4 * gpu.memory_gib
    if outcome.status == TrialStatus.COMPLETED:
        assert outcome.step_time_s is not None
        assert outcome.peak_mem_gib is None or outcome.peak_mem_gib <= 1.1 * gpu.memory_gib


ARCH_KEYS = [f for f in Architecture.__dataclass_fields__ if f not in ("gated_linear_unit", "tie_embeddings")]
arch_values = st.one_of(st.integers(min_value=-5, max_value=300), st.sampled_from([0, 1, 2, 4, 8, 128, 10**30]),
                        st.floats(allow_nan=True), st.text(max_size=4), st.none(), st.lists(st.integers(), max_size=2))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.dictionaries(st.sampled_from(ARCH_KEYS), arch_values, min_size=1, max_size=4),
       layouts=st.one_of(st.none(), st.integers(), st.lists(st.one_of(st.integers(), st.lists(st.integers(), max_size=3)),
                                                             max_size=3)))
def test_any_space_yaml_loads_or_fails_with_one_config_error(tmp_path_factory, changes, layouts):
    from autotune.config import LayoutConfig
    from autotune.cost import estimate

    document = yaml.safe_load((space_dir() / "qwen3_30b.yaml").read_text())
    document["architecture"].update(changes)
    if layouts is not None:
        document["pipeline"]["layouts"] = layouts
    path = tmp_path_factory.mktemp("space") / "random.yaml"
    path.write_text(yaml.safe_dump(document))
    try:
        space = load_space(str(path))
    except ConfigError as exc:
        assert str(exc) and "\n" not in str(exc).strip()
        return
    a = space.model.architecture
    assert a.num_layers >= 1 and a.hidden_size >= 1 and a.num_attention_heads % a.num_query_groups == 0
    assert not a.is_moe or 1 <= a.moe_router_topk <= a.num_moe_experts
    workload = make_workload(space, gpus=16)
    result = estimate(workload, LayoutConfig.from_mapping(space.model.defaults.layout))
    assert math.isfinite(result.step_time_s) and result.step_time_s > 0


knob_scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
                         st.text(max_size=12), st.floats(allow_nan=False, allow_infinity=False),
                         # containers no coercion lets through, but a record of another version might hold
                         st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                              max_size=3))


@settings(max_examples=300, deadline=None)
@given(values=st.fixed_dictionaries({}, optional={name: knob_scalars for name in ("tp", "recompute",
                                                                                   "recompute_method", "sp",
                                                                                   "cuda_graph", "dispatcher_sms",
                                                                                   "ep_overlap", "cp_comm_type")}))
def test_layout_key_is_exactly_the_sorted_compact_json_of_its_dict(values):
    """LayoutConfig.key writes its JSON field by field (speed); stored keys depend on it being exactly what
    json.dumps wrote before, for any value a field may hold (unicode and quotes in text, containers included)."""
    import json

    from autotune.config import LayoutConfig

    config = LayoutConfig(**values)  # no coercion: whatever a record of another version might hold
    assert config.key() == json.dumps(config.to_dict(), sort_keys=True, separators=(",", ":"))
