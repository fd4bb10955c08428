"""Benchmark-only settings (issue 16 item 3): off by default, in every trial's overrides when a user turns
one on, named on the study's leaderboards and dashboard, refused by export unless the user insists."""

from __future__ import annotations

import json

import pytest

from autotune import export, leaderboard
from autotune.controller._spec import trial_spec
from autotune.controller.options import StudyOptions
from autotune.errors import ConfigError
from autotune.megatron import benchmark_only
from autotune.space import study_space_and_workload
from tests.conftest import run_cli

FORCED = {"moe_router_force_load_balancing": True}


@pytest.fixture
def forced_study(tmp_path):
    from tests.test_export import _study_with_trial

    repo, study, layout = _study_with_trial(tmp_path, {"ep": 16, "dist_opt": True}, name="forced")
    with repo.session() as s:  # the options `start --benchmark-setting ...` stores
        from autotune.storage.models import StudyRow

        row = s.get(StudyRow, study.id)
        row.options = {**(row.options or {}), "benchmark_settings": FORCED}
    return repo, repo.get_study("forced"), layout


def test_parse_refuses_unknown_names_and_values():
    assert benchmark_only.parse(["moe_router_force_load_balancing=true", "check_for_nan_in_loss=false"]) == {
        "moe_router_force_load_balancing": True, "check_for_nan_in_loss": False}
    for bad in ("moe_router_force_load_balancing", "nope=true", "check_for_nan_in_loss=maybe", "=true"):
        with pytest.raises(ConfigError):
            benchmark_only.parse([bad])
    assert benchmark_only.active({"check_for_nan_in_loss": True}) == {}  # the recipes' value changes nothing
    assert StudyOptions().benchmark_settings == {}  # off by default
    with pytest.raises(ConfigError):
        StudyOptions.from_stored({"benchmark_settings": {"model.anything": True}})  # a tampered study row


def test_every_trial_of_the_study_carries_the_setting(forced_study):
    repo, study, layout = forced_study
    space, workload = study_space_and_workload(study)
    options = StudyOptions.from_stored(study.options)
    spec = trial_spec(study, space, workload, options, 1, 1, layout)
    assert "model.moe_router_force_load_balancing=true" in spec.overrides
    plain = trial_spec(study, space, workload, StudyOptions(), 1, 1, layout)
    assert not any("force_load_balancing" in o for o in plain.overrides)


def test_leaderboard_and_dashboard_name_it(forced_study):
    from autotune.dashboard._pages import DashboardApp

    repo, study, _ = forced_study
    board = leaderboard.build(repo, study)
    assert board.summary["benchmark_only"] == "benchmark-only: moe_router_force_load_balancing=true"
    assert "benchmark-only: moe_router_force_load_balancing=true" in leaderboard.summary_line(board.summary)
    assert "id='benchmark-only'" in DashboardApp(repo).study_page("forced", "trial", "asc").decode()


def test_export_refuses_it_unless_the_user_insists(forced_study, tmp_path):
    repo, study, _ = forced_study
    with pytest.raises(ConfigError, match="--allow-benchmark-settings"):
        export.render(repo, study, "overrides")
    text = export.render(repo, study, "overrides", allow_benchmark_settings=True)
    assert "model.moe_router_force_load_balancing=true" in text
    recipe = export.render(repo, study, "recipe", allow_benchmark_settings=True)
    assert "cfg.model.moe_router_force_load_balancing = True" in recipe
    document = json.loads(export.render(repo, study, "json", allow_benchmark_settings=True))
    assert document["benchmark_only_settings"] == FORCED
    # through the command: one line, exit 2, nothing written
    out = tmp_path / "tuned.py"
    result = run_cli("export", "forced", "--format", "recipe", "-o", str(out), "--storage", repo.url)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1 and not out.exists()
    assert "benchmark-only" in result.stderr


def test_the_replay_table_and_show_carry_it_too(forced_study, tmp_path):
    """Review: `export --format table` wrote the numbers with no trace of the setting and `show` listed
    overrides without it, though every run of the study had it."""
    import pandas as pd

    repo, study, _ = forced_study
    with pytest.raises(ConfigError, match="--allow-benchmark-settings"):
        export.render(repo, study, "table")
    out = tmp_path / "replay.csv"
    refused = run_cli("export", "forced", "--format", "table", "-o", str(out), "--storage", repo.url)
    assert refused.returncode == 2 and "benchmark-only" in refused.stderr and not out.exists()
    allowed = run_cli("export", "forced", "--format", "table", "-o", str(out), "--allow-benchmark-settings",
                      "--storage", repo.url)
    assert allowed.returncode == 0, allowed.stderr
    table = pd.read_csv(out)
    assert set(table["benchmark_only"]) == {"benchmark-only: moe_router_force_load_balancing=true"}
    shown = run_cli("show", "forced", "1", "--json", "--storage", repo.url)
    assert "model.moe_router_force_load_balancing=true" in json.loads(shown.stdout)["overrides"]
    shown = run_cli("show", "forced", "1", "--storage", repo.url, env={"COLUMNS": "400"})
    assert "model.moe_router_force_load_balancing=true" in shown.stdout and "benchmark-only" in shown.stdout
