"""The overrides autotune emits, checked by Megatron-Bridge's own code (shared/tools/megatron-probe).

For qwen3_30b and llama3_70b: a set of legal layouts in which every knob value of the search space
appears (full recompute included) plus the recipe default and a random sample, all of which the real
override parser, runtime_config_update / validate() and the parallel-grid checks must accept; and
layouts our rules call illegal that those same checks must refuse.
Needs a Python 3.12 (the probe's side environment, about 3 GB on first use); skips, saying why, elsewhere.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import random
import shutil

import pytest

from autotune.config import KNOBS, LayoutConfig
from autotune.megatron.probe_client import probe_dir, request, run_probe, setup_probe
from autotune.space import enumerate_legal, load_space, make_workload, violations

pytestmark = pytest.mark.slow


def _python312() -> str | None:
    candidates = [os.environ.get("PYTHON312")] + glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12"))
    candidates += [shutil.which("python3.12"), "/usr/bin/python3.12"]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


class Probed:
    """Megatron-Bridge's answers, one probe process for the whole module: each probe start imports
    Megatron-Bridge and its dependencies (~15 s), so every request of every test is sent in one batch up
    front and the tests look theirs up (the probe answers each request line on its own)."""

    def __init__(self, python: str, directory):
        self.python, self.directory, self.answers = python, directory, {}

    def prefetch(self, requests: list[dict]) -> None:
        missing = list({_key(r): r for r in requests if _key(r) not in self.answers}.values())
        if missing:
            results = run_probe(self.python, self.directory, missing)
            assert len(results) == len(missing), "the probe answered fewer requests than it was sent"
            self.answers.update({_key(r): result for r, result in zip(missing, results)})

    def __call__(self, requests: list[dict]) -> list[dict]:
        self.prefetch(requests)
        return [self.answers[_key(r)] for r in requests]


def _key(req: dict) -> str:
    return json.dumps(req, sort_keys=True)


@pytest.fixture(scope="module")
def probe():
    directory = probe_dir()
    if directory is None:
        pytest.skip("shared/tools/megatron-probe is not beside this checkout")
    if _python312() is None:
        pytest.skip("no Python 3.12 on this machine: megatron-bridge needs one, so the probe cannot run")
    try:
        python = setup_probe(directory)
    except Exception as exc:  # the probe downloads its packages on first use
        pytest.skip(f"megatron-probe could not be set up here: {exc}")
    probed = Probed(python, directory)
    probed.prefetch(_every_request())
    return probed


def covering_layouts(space, workload, extra: int, seed: int = 0) -> list[LayoutConfig]:
    """Legal layouts in which every knob value (and every recompute variant) appears at least once."""
    legal = enumerate_legal(space, workload).configs
    chosen: dict[str, LayoutConfig] = {}
    default = LayoutConfig.from_mapping(space.model.defaults.layout)
    if default in set(legal):
        chosen[default.key()] = default
    for knob in KNOBS:
        for value in sorted({getattr(c, knob) for c in legal}, key=repr):
            layout = next(c for c in legal if getattr(c, knob) == value)
            chosen.setdefault(layout.key(), layout)
    for layout in random.Random(seed).sample(legal, min(extra, len(legal))):
        chosen.setdefault(layout.key(), layout)
    return list(chosen.values())


MODELS = [("qwen3_30b", 16), ("llama3_70b", 32)]


@functools.lru_cache(maxsize=None)
def knob_layouts(model: str, gpus: int):
    space = load_space(model)
    workload = make_workload(space, gpus=gpus)
    return workload, covering_layouts(space, workload, extra=12)


@pytest.mark.parametrize("model,gpus", MODELS)
def test_every_knob_value_is_accepted_by_megatron_bridge(probe, model, gpus):
    workload, layouts = knob_layouts(model, gpus)
    values = {(k, getattr(c, k)) for c in layouts for k in KNOBS}
    assert ("recompute", "full") in values and ("dist_opt", False) in values
    results = probe([request(workload, c) for c in layouts])
    assert len(results) == len(layouts)
    rejected = [(c.short(), r["stage"], r["error"]) for c, r in zip(layouts, results) if not r["ok"]]
    assert rejected == []
    for layout, result in zip(layouts, results):
        expected_dp = gpus // (layout.tp * layout.pp * layout.cp)
        assert result["data_parallel_size"] in (None, expected_dp)


RULE_CASES = [
    ("llama3_70b", 32, {"tp": 3}, "heads_divisible_by_tp"),
    ("llama3_70b", 32, {"tp": 4, "pp": 3, "sp": True}, "world_divisible_by_tp_pp_cp"),
    ("llama3_70b", 32, {"tp": 4, "cp": 8, "sp": True, "pp": 1}, None),  # legal control case
    ("qwen3_30b", 16, {"pp": 2, "ep": 16}, "world_divisible_by_etp_ep_pp"),
    ("llama3_70b", 32, {"vpp": 2}, "vpp_needs_pp"),
]


def rule_case(model: str, gpus: int, config: dict):
    workload = make_workload(load_space(model), gpus=gpus)
    layout = LayoutConfig.from_mapping({"dist_opt": True, **config})
    return workload, layout, request(workload, layout)


@pytest.mark.parametrize("model,gpus,config,rule", RULE_CASES)
def test_layouts_our_rules_reject_are_rejected_by_megatron_too(probe, model, gpus, config, rule):
    workload, layout, req = rule_case(model, gpus, config)
    ours = {v.rule for v in violations(layout, workload)}
    [result] = probe([req])
    if rule is None:
        assert ours == set() and result["ok"], result
    else:
        assert rule in ours
        assert not result["ok"], f"Megatron accepted a layout our rule {rule} rejects"


def short_run_request(model: str, gpus: int) -> dict:
    from workers.launcher import short_run_overrides

    workload = make_workload(load_space(model), gpus=gpus)
    layout = LayoutConfig.from_mapping(workload.model.defaults.layout)
    req = request(workload, layout)
    spec = {"model": model, "warmup_steps": 3, "measured_steps": 5, "backend_options": {}}
    req["overrides"] = req["overrides"] + short_run_overrides(spec, [0], "/tmp/autotune-snapshot.pickle")
    return req


@pytest.mark.parametrize("model,gpus", MODELS)
def test_the_workers_short_run_settings_are_accepted(probe, model, gpus):
    """The overrides workers.launcher adds (iterations, logging, no checkpoints, mock data, nsys,
    memory snapshot, alltoall dispatcher) exist and validate in Megatron-Bridge."""
    [result] = probe([short_run_request(model, gpus)])
    assert result["ok"], result


# --- performance knobs (issue 16) ------------------------------------------------------------------
# On a CPU the probe cannot validate the flex dispatcher (validate() queries the GPU): request() appends
# `alltoall` + a null backend after the layout's overrides, so flex candidates are checked as alltoall,
# which Megatron-Core's rules treat alike; only the flex backend's GPU check stays unseen.
PERF_CASES = [("qwen3_30b", 16, 120), ("deepseek_v3", 1024, 90)]


@functools.lru_cache(maxsize=None)
def sampled_perf_variants(model: str, gpus: int, count: int, seed: int = 0) -> list[LayoutConfig]:
    """`count` legal layouts with performance knobs changed: every knob value of the space appears."""
    from autotune.space.perf import variants

    space = load_space(model)
    workload = make_workload(space, gpus=gpus)
    default = LayoutConfig.from_mapping(space.model.defaults.layout)
    legal = enumerate_legal(space, workload).configs
    if space.model.pipeline_layout_function:
        # DeepSeek-V3's recipe carries a pipeline layout for its own PP/VPP that the worker recomputes with
        # the model's layout function after other splits; the probe builds the recipe without that step,
        # so its layouts keep the recipe's pipeline split here (the knobs are what this test is about)
        legal = [c for c in legal if (c.pp, c.vpp) == (default.pp, default.vpp)]
    rng = random.Random(seed)
    pool = list(variants(default, space, workload))
    for layout in rng.sample(legal, 40):
        pool += rng.sample(list(variants(layout, space, workload)) or [layout], 3)
    chosen: dict[str, LayoutConfig] = {}
    for name, domain in space.perf_domains.items():  # cover every value first
        for value in domain[1:]:
            found = next((c for c in pool if getattr(c, name) == value), None)
            if found is not None:
                chosen.setdefault(found.key(), found)
    for layout in rng.sample(pool, len(pool)):
        if len(chosen) >= count:
            break
        chosen.setdefault(layout.key(), layout)
    return list(chosen.values())


def test_sampled_performance_knob_combinations_are_accepted_by_megatron_bridge(probe):
    total = 0
    for model, gpus, count in PERF_CASES:
        workload = make_workload(load_space(model), gpus=gpus)
        layouts = sampled_perf_variants(model, gpus, count)
        assert all(not violations(c, workload) and c.perf() for c in layouts)
        results = probe([request(workload, c) for c in layouts])
        assert len(results) == len(layouts)
        rejected = [(c.short(), r["stage"], (r["error"] or "")[:200]) for c, r in zip(layouts, results) if not r["ok"]]
        assert rejected == [], rejected
        total += len(layouts)
    assert total >= 200


Q = {"ep": 16, "dist_opt": True}
D = {"tp": 2, "pp": 16, "ep": 64, "sp": True, "dist_opt": True}
FULL = {"recompute": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
# every performance-knob rule whose breach Megatron-Bridge's validate() can see on a CPU
PERF_ILLEGAL = [
    ("qwen3_30b", 16, {**Q, "pp": 2, "ep": 8, "ep_overlap": True}, "ep_overlap_needs_vpp_with_pp"),
    ("qwen3_30b", 16, {**Q, **FULL, "ep_overlap": True}, "ep_overlap_without_full_recompute"),
    ("qwen3_30b", 16, {**Q, "recompute": "selective", "recompute_modules": "moe", "ep_overlap": True,
                       "cuda_graph": "none"}, "ep_overlap_without_moe_recompute"),
    ("deepseek_v3", 1024, {**D, "pp": 8, "vpp": 2, "ep_overlap": True, "shared_expert_overlap": True},
     "ep_overlap_without_shared_expert_overlap"),
    ("deepseek_v3", 1024, {**D, "pp": 8, "vpp": 2, "ep_overlap": True, "cuda_graph": "te_attn_mlp"},
     "ep_overlap_graph_scope_without_moe_mlp"),
    ("deepseek_v3", 1024, {**D, "recompute": "selective", "recompute_modules": "shared_experts",
                           "shared_expert_overlap": True}, "shared_experts_recompute_without_shared_expert_overlap"),
    ("qwen3_30b", 16, {**Q, "recompute": "selective", "recompute_modules": "mla_up_proj"},
     "recompute_module_exists_in_model"),
    ("qwen3_30b", 16, {**Q, **FULL, "cuda_graph": "te_router"}, "full_recompute_needs_full_iteration_graph"),
    ("qwen3_30b", 16, {**Q, "recompute": "selective", "recompute_modules": "moe"}, "moe_recompute_without_router_graph"),
    ("qwen3_30b", 16, {**Q, "cuda_graph": "te_attn_mlp"}, "mlp_graph_needs_dense_layers"),
    ("qwen3_30b", 16, {**Q, "pp": 2, "ep": 8, "cpu_offload_layers": 4, "cuda_graph": "none"}, "cpu_offload_needs_pp1"),
    ("qwen3_30b", 16, {**Q, "recompute": "selective", "cpu_offload_layers": 4, "cuda_graph": "none"},
     "cpu_offload_without_recompute"),
    ("qwen3_30b", 16, {**Q, "cpu_offload_layers": 48, "cuda_graph": "none"}, "cpu_offload_layers_below_num_layers"),
    ("qwen3_30b", 16, {**Q, "cpu_offload_layers": 4}, "cpu_offload_with_graphs_only_full_iteration"),
]
PERF_MESSAGES = {  # words of Megatron's own message for each rule
    "ep_overlap_needs_vpp_with_pp": ("virtual_pipeline_model_parallel_size must be specified",),
    "ep_overlap_without_full_recompute": ("disable full recomputation",),
    "ep_overlap_without_moe_recompute": ("disable moe in recompute_modules",),
    "ep_overlap_without_shared_expert_overlap": ("disable moe_shared_expert_overlap",),
    "ep_overlap_graph_scope_without_moe_mlp": ("moe and mlp is not supported",),
    "shared_experts_recompute_without_shared_expert_overlap": ("shared_experts recompute cannot work",),
    "recompute_module_exists_in_model": ("only supported with multi_latent_attention",),
    "full_recompute_needs_full_iteration_graph": ("full recompute is only supported with full iteration",),
    "moe_recompute_without_router_graph": ("moe recompute is not supported with moe_router",),
    "mlp_graph_needs_dense_layers": ("mlp cuda graph is only supported for dense layers",),
    "cpu_offload_needs_pp1": ("no support for Pipeline parallelism with CPU offloading",),
    "cpu_offload_without_recompute": ("does not work when activation recomputation is enabled",),
    "cpu_offload_layers_below_num_layers": ("only for layers less than",),
    "cpu_offload_with_graphs_only_full_iteration": ("CUDA graphs not supported with CPU offloading",),
}
# Rules the probe cannot see: flex_backend_supports_gpu (validate() needs the GPU), cp_a2a_heads_divisible_by_cp
# (Transformer Engine checks at attention build), perf_knob_needs_its_parent and perf_knob_declared (Bridge
# silently ignores such a knob: TP overlap at TP1, cp_comm_type at CP1, shared-expert overlap without shared
# experts), ep_overlap_mtp_at_most_one_layer (no catalog model has more than one MTP layer).


def test_performance_knob_combinations_our_rules_reject_are_rejected_by_megatron_too(probe):
    requests, expected = [], []
    for model, gpus, config, rule in PERF_ILLEGAL:
        workload = make_workload(load_space(model), gpus=gpus)
        layout = LayoutConfig.from_mapping(config)
        assert rule in {v.rule for v in violations(layout, workload)}, (rule, layout.short())
        requests.append(request(workload, layout))
        expected.append((rule, layout.short()))
    results = probe(requests)
    accepted = [case for case, result in zip(expected, results) if result["ok"]]
    assert accepted == [], f"Megatron accepted what these rules reject: {accepted}"
    # ...and for the reason the rule gives, not another one (a pipeline split, a dtype)
    other = [(case, result["error"][:160]) for case, result in zip(expected, results)
             if not any(word in (result["error"] or "") for word in PERF_MESSAGES[case[0]])]
    assert other == [], other


def _every_request() -> list[dict]:
    """Every request the tests above send, so that one probe process answers them all."""
    requests = []
    for model, gpus in MODELS:
        workload, layouts = knob_layouts(model, gpus)
        requests += [request(workload, c) for c in layouts] + [short_run_request(model, gpus)]
    requests += [rule_case(model, gpus, config)[2] for model, gpus, config, _ in RULE_CASES]
    for model, gpus, count in PERF_CASES:
        workload = make_workload(load_space(model), gpus=gpus)
        requests += [request(workload, c) for c in sampled_perf_variants(model, gpus, count)]
    for model, gpus, config, _ in PERF_ILLEGAL:
        requests.append(request(make_workload(load_space(model), gpus=gpus), LayoutConfig.from_mapping(config)))
    return requests
