"""`autotune estimate` through the real command."""

from __future__ import annotations

import json


def test_estimate_json_has_the_documented_fields(cli):
    result = cli("estimate", "--model", "qwen3_30b", "--gpus", "16", "--tp", "1", "--ep", "16", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    for key in ("flops_per_token", "step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "peak_mem_gib",
                "fits", "memory", "breakdown"):
        assert key in data
    assert set(data["memory"]) == {"weights_grads_optimizer_gib", "activations_gib", "overhead_gib"}
    assert {"compute", "tp", "cp", "ep", "pp", "dp", "bubble", "recompute"} <= set(data["breakdown"])
    assert data["mfu_basis"] == "dense BF16 peak"


def test_estimate_table_output(cli):
    result = cli("estimate", "--model", "llama3_70b", "--tp", "4", "--pp", "4", "--vpp", "5", "--cp", "2", "--sp")
    assert result.returncode == 0, result.stderr
    assert "tokens/s/GPU" in result.stdout and "bubble" in result.stdout


def test_illegal_layout_is_refused_with_its_violations(cli):
    result = cli("estimate", "--model", "qwen3_30b", "--gpus", "16", "--tp", "2", "--ep", "16")
    assert result.returncode == 2
    assert "ep_with_tp_needs_sp" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
