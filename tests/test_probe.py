"""The overrides autotune emits, checked by Megatron-Bridge's own code (shared/tools/megatron-probe).

For qwen3_30b and llama3_70b: a set of legal layouts in which every knob value of the search space
appears (full recompute included) plus the recipe default and a random sample, all of which the real
override parser, runtime_config_update / validate() and the parallel-grid checks must accept; and
layouts our rules call illegal that those same checks must refuse.
Needs a Python 3.12 (the probe's side environment, about 3 GB on first use); skips, saying why, elsewhere.
"""

from __future__ import annotations

import glob
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


@pytest.fixture(scope="module")
def probe():
    directory = probe_dir()
    if directory is None:
        pytest.skip("shared/tools/megatron-probe is not beside this checkout")
    if _python312() is None:
        pytest.skip("no Python 3.12 on this machine: megatron-bridge needs one, so the probe cannot run")
    try:
        return setup_probe(directory), directory
    except Exception as exc:  # the probe downloads its packages on first use
        pytest.skip(f"megatron-probe could not be set up here: {exc}")


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


@pytest.mark.parametrize("model,gpus", [("qwen3_30b", 16), ("llama3_70b", 32)])
def test_every_knob_value_is_accepted_by_megatron_bridge(probe, model, gpus):
    python, directory = probe
    space = load_space(model)
    workload = make_workload(space, gpus=gpus)
    layouts = covering_layouts(space, workload, extra=12)
    values = {(k, getattr(c, k)) for c in layouts for k in KNOBS}
    assert ("recompute", "full") in values and ("dist_opt", False) in values
    results = run_probe(python, directory, [request(workload, c) for c in layouts])
    assert len(results) == len(layouts)
    rejected = [(c.short(), r["stage"], r["error"]) for c, r in zip(layouts, results) if not r["ok"]]
    assert rejected == []
    for layout, result in zip(layouts, results):
        expected_dp = gpus // (layout.tp * layout.pp * layout.cp)
        assert result["data_parallel_size"] in (None, expected_dp)


@pytest.mark.parametrize("model,gpus,config,rule", [
    ("llama3_70b", 32, {"tp": 3}, "heads_divisible_by_tp"),
    ("llama3_70b", 32, {"tp": 4, "pp": 3, "sp": True}, "world_divisible_by_tp_pp_cp"),
    ("llama3_70b", 32, {"tp": 4, "cp": 8, "sp": True, "pp": 1}, None),  # legal control case
    ("qwen3_30b", 16, {"pp": 2, "ep": 16}, "world_divisible_by_etp_ep_pp"),
    ("llama3_70b", 32, {"vpp": 2}, "vpp_needs_pp"),
])
def test_layouts_our_rules_reject_are_rejected_by_megatron_too(probe, model, gpus, config, rule):
    python, directory = probe
    workload = make_workload(load_space(model), gpus=gpus)
    layout = LayoutConfig.from_mapping({"dist_opt": True, **config})
    ours = {v.rule for v in violations(layout, workload)}
    [result] = run_probe(python, directory, [request(workload, layout)])
    if rule is None:
        assert ours == set() and result["ok"], result
    else:
        assert rule in ours
        assert not result["ok"], f"Megatron accepted a layout our rule {rule} rejects"


@pytest.mark.parametrize("model,gpus", [("qwen3_30b", 16), ("llama3_70b", 32)])
def test_the_workers_short_run_settings_are_accepted(probe, model, gpus):
    """The overrides workers.launcher adds (iterations, logging, no checkpoints, mock data, nsys,
    memory snapshot, alltoall dispatcher) exist and validate in Megatron-Bridge."""
    from workers.launcher import short_run_overrides

    python, directory = probe
    workload = make_workload(load_space(model), gpus=gpus)
    layout = LayoutConfig.from_mapping(workload.model.defaults.layout)
    req = request(workload, layout)
    spec = {"model": model, "warmup_steps": 3, "measured_steps": 5, "backend_options": {}}
    req["overrides"] = req["overrides"] + short_run_overrides(spec, [0], "/tmp/autotune-snapshot.pickle")
    [result] = run_probe(python, directory, [req])
    assert result["ok"], result
