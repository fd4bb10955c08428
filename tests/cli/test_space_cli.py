"""`autotune models / space / check` through the real command in a subprocess."""

from __future__ import annotations

import json

import pytest

from tests.conftest import json_lines


def test_models_json(cli):
    result = cli("models", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    names = {m["name"] for m in data["models"]}
    assert {"qwen3_30b", "deepseek_v3", "gpt_oss_120b"} <= names
    assert {"h100", "h200", "a100", "b200", "gb200"} <= {g["name"] for g in data["gpus"]}


def test_space_json_reports_count_and_rejections(cli):
    result = cli("space", "--model", "qwen3_30b", "--gpus", "16", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["legal"] > 1000
    assert data["rejected_by_rule"]["world_divisible_by_tp_pp_cp"] > 0
    assert data["legal"] + sum(data["rejected_by_rule"].values()) + sum(data["filtered_by_policy"].values()) \
        == data["candidates"]


def test_space_list_prints_one_json_per_legal_layout(cli):
    result = cli("space", "--model", "llama3_8b", "--gpus", "8", "--fix", "mbs=1", "--fix", "recompute=none", "--list")
    assert result.returncode == 0, result.stderr
    rows = json_lines(result.stdout)
    assert rows and all(r["mbs"] == 1 and r["recompute"] == "none" for r in rows)
    summary = json.loads(cli("space", "--model", "llama3_8b", "--gpus", "8", "--fix", "mbs=1", "--fix",
                             "recompute=none", "--json").stdout)
    assert len(rows) == summary["legal"]


def test_check_reads_json_lines(cli):
    stdin = "\n".join([json.dumps({"tp": 2, "ep": 8, "sp": True}), json.dumps({"tp": 2, "ep": 8, "sp": False}),
                       json.dumps({"tp": 1, "sp": True})])
    result = cli("check", "--model", "qwen3_30b", "--gpus", "16", stdin=stdin)
    assert result.returncode == 1, result.stderr  # two of them are illegal: exit 1, every line still answered
    rows = json_lines(result.stdout)
    assert [r["legal"] for r in rows] == [True, False, False]
    assert rows[1]["violations"][0]["rule"] == "ep_with_tp_needs_sp"
    assert rows[2]["violations"][0]["rule"] == "sp_needs_tp"
    assert all(set(r) >= {"legal", "violations", "policy", "filled_from_recipe"} for r in rows)
    assert rows[0]["filled_from_recipe"]["dist_opt"] is True  # the recipe's, said so


def test_check_from_flags(cli):
    result = cli("check", "--model", "llama3_70b", "--gpus", "32", "--tp", "4", "--pp", "4", "--vpp", "5",
                 "--cp", "2", "--sp")
    assert result.returncode == 0, result.stderr
    assert json_lines(result.stdout)[0]["legal"] is True


def test_check_exits_1_for_an_illegal_layout(cli):
    # found in the storage pass's notes: an illegal layout answered "legal": false with exit 0, so a script's
    # `autotune check ... && submit` went on. Exit 1 (checked: illegal), never 2 (which is for unusable input).
    result = cli("check", "--model", "qwen3_30b", "--gpus", "16", "--tp", "1", "--sp")
    assert result.returncode == 1, result.stderr
    row = json_lines(result.stdout)[0]
    assert row["legal"] is False and row["violations"][0]["rule"] == "sp_needs_tp"
    assert result.stderr == ""
    legal = cli("check", "--model", "qwen3_30b", "--gpus", "16", stdin=json.dumps({"tp": 2, "ep": 8, "sp": True}))
    assert legal.returncode == 0, legal.stderr


@pytest.mark.parametrize("args,stdin,needle", [
    (["space", "--model", "qwen9"], None, "unknown model 'qwen9'"),
    (["space", "--model", "qwen3_30b", "--fix", "tpp=2"], None, "unknown knob 'tpp'"),
    (["space", "--model", "qwen3_30b", "--gpus", "abc"], None, "invalid int value"),
    (["space", "--model", "qwen3_30b", "--fix", "tp=two"], None, "must be an integer"),
    (["space", "--model", "qwen3_30b", "--gpus", "12"], None, "not a multiple of --gpus-per-node"),
    (["space", "--model", "qwen3_30b", "--gpu", "v100"], None, "unknown GPU type"),
    (["space", "--model", "qwen3_30b", "--gpu", "a100", "--precision", "fp8"], None, "has no fp8"),
    (["check", "--model", "qwen3_30b"], "{not json\n", "stdin line 1 is not JSON"),
    (["check", "--model", "qwen3_30b"], '{"tpx": 1}\n', "unknown knob 'tpx'"),
    (["check", "--model", "qwen3_30b"], '{"tp": "x"}\n', "must be an integer"),
])
def test_bad_input_is_one_line_and_exit_2(cli, args, stdin, needle):
    result = cli(*args, stdin=stdin)
    assert result.returncode == 2
    assert needle in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_yaml_typo_is_one_line_and_exit_2(cli, tmp_path):
    from autotune.space import space_dir

    broken = tmp_path / "qwen3_30b.yaml"
    broken.write_text((space_dir() / "qwen3_30b.yaml").read_text().replace("  cp: [", "  cpp: [", 1))
    result = cli("space", "--model", "qwen3_30b", env={"AUTOTUNE_SEARCH_SPACES": str(tmp_path)})
    assert result.returncode == 2
    assert "knobs.cpp" in result.stderr and str(broken) in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
