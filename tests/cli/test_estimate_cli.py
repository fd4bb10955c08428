"""`autotune estimate` through the real command."""

from __future__ import annotations

import json
import re


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


def test_a_throughput_below_one_token_per_second_is_not_printed_as_zero(cli):
    # review: a billion-token sequence read "0 tokens/s/GPU" next to an MFU of 50%
    result = cli("estimate", "--model", "qwen3_30b", "--seq-length", "999999999", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert "| 0 tokens/s/GPU" not in result.stdout
    assert re.search(r"\| 0\.\d+ tokens/s/GPU", result.stdout), result.stdout  # two significant digits


def test_illegal_layout_is_refused_with_its_violations(cli):
    result = cli("estimate", "--model", "qwen3_30b", "--gpus", "16", "--tp", "2", "--ep", "16", "--no-sp")
    assert result.returncode == 2
    assert "ep_with_tp_needs_sp" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_knobs_left_out_take_the_recipes_values_and_are_named(cli):
    """Issue 11 item 5: the recipe's own layout fits (distributed optimizer on, as the recipe has it) and
    the output says which values were filled in; --no-dist-opt still switches it off."""
    result = cli("estimate", "--model", "qwen3_30b", "--gpus", "16", "--tp", "1", "--ep", "16", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["fits"] is True and payload["config"]["dist_opt"] is True
    assert payload["filled_from_recipe"]["dist_opt"] is True and "tp" not in payload["filled_from_recipe"]
    table = cli("estimate", "--model", "qwen3_30b", "--gpus", "16", "--tp", "1", "--ep", "16")
    assert "not given, so taken from the recipe (or following the knobs given" in " ".join(table.stdout.split())
    assert "dist_opt=true" in table.stdout
    off = json.loads(cli("estimate", "--model", "qwen3_30b", "--gpus", "16", "--ep", "16", "--no-dist-opt",
                         "--json").stdout)
    assert off["config"]["dist_opt"] is False and "dist_opt" not in off["filled_from_recipe"]
    # a changed TP brings sequence parallelism with it; a changed PP drops the recipe's VPP
    tp2 = json.loads(cli("estimate", "--model", "llama3_70b", "--gpus", "32", "--tp", "8", "--pp", "2",
                         "--json").stdout)
    assert tp2["config"]["sp"] is True and tp2["filled_from_recipe"]["vpp"] == 1
    # ... unless the space allows one value only: the vTrain sweeps ran without sequence parallelism, and
    # a knob that does not exist (recompute method without full recompute) stays absent
    vtrain = json.loads(cli("estimate", "--model", "vtrain_gpt_3p6b", "--tp", "16", "--recompute", "none",
                            "--json").stdout)
    assert vtrain["config"]["sp"] is False and vtrain["filled_from_recipe"]["sp"] is False
    assert vtrain["config"]["recompute_method"] is None


def test_performance_knob_flags_reach_the_cost_model(cli):
    """--ep-overlap and friends (issue 16): the estimate changes as cost/knobs.py says; a knob without its
    parent (TP overlap at TP1) is refused with its rule."""
    base = json.loads(cli("estimate", "--model", "qwen3_30b", "--gpus", "16", "--ep", "16", "--json").stdout)
    overlap = json.loads(cli("estimate", "--model", "qwen3_30b", "--gpus", "16", "--ep", "16", "--ep-overlap",
                             "--json").stdout)
    assert overlap["config"]["ep_overlap"] is True and overlap["step_time_s"] < base["step_time_s"]
    refused = cli("estimate", "--model", "qwen3_30b", "--gpus", "16", "--ep", "16", "--tp-comm-overlap")
    assert refused.returncode == 2 and "perf_knob_needs_its_parent" in refused.stderr


def test_the_clusters_own_bandwidth_changes_what_crosses_nodes_and_is_said(cli):
    """--network-gbps: a DGX H100 with half its NICs makes the 16-GPU expert group's all-to-all slower; the
    estimate names the figure and its JSON workload carries it (a study stores it the same way)."""
    dgx = json.loads(cli("estimate", "--model", "qwen3_30b", "--gpus", "16", "--ep", "16", "--json").stdout)
    half = json.loads(cli("estimate", "--model", "qwen3_30b", "--gpus", "16", "--ep", "16", "--network-gbps", "25",
                          "--json").stdout)
    assert "network_gbps" not in dgx["workload"] and half["workload"]["network_gbps"] == 25.0
    assert half["breakdown"]["ep"] > dgx["breakdown"]["ep"] and half["step_time_s"] > dgx["step_time_s"]
    table = cli("estimate", "--model", "qwen3_30b", "--gpus", "16", "--ep", "16", "--network-gbps", "25")
    assert "scale-out 25 GB/s/GPU" in " ".join(table.stdout.split())
