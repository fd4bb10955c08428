"""Optuna interop, from the outside: a study started by `autotune start --study NAME` is the Optuna study
NAME in the same storage (`optuna.load_study`), its trials are the study's runs with the same numbers,
the objective is named and every trial carries autotune's metrics as user attributes, and
optuna-dashboard (its real WSGI app over real HTTP) lists all of it."""

from __future__ import annotations

import json
import threading
import urllib.request
from wsgiref.simple_server import WSGIRequestHandler, make_server

import optuna
import pytest
from optuna.trial import TrialState

from autotune.storage import REJECTED_BASE, Repository
from tests.workers.test_workers import LOG

NAME = "qwen3 tpe/16"  # a study name with a space and a slash: it is the Optuna study's name as it is
METRICS = ("tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "step_time_s", "peak_mem_gib")


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    """A real study (the CLI, simulate backend, local Ray) with an imported run: (storage URL, repository)."""
    from tests.conftest import run_cli

    directory = tmp_path_factory.mktemp("interop")
    url = f"sqlite:///{directory / 'interop.db'}"
    result = run_cli("start", "--model", "qwen3_30b", "--gpus", "16", "--budget", "5", "--sampler", "tpe",
                     "--study", NAME, "--storage", url, "--sim-seconds", "0", "--json",
                     env={"RAY_AUTH_MODE": "disabled"}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    log = directory / "run.log"
    log.write_text(LOG)
    imported = run_cli("import-log", str(log), "--study", NAME, "--tp", "2", "--ep", "8", "--sp", "--dist-opt",
                       "--storage", url, "--json")
    assert imported.returncode == 0, imported.stderr[-2000:]
    # a measured run among simulated ones is said to be one (found by review: nothing said so)
    assert any("other runs are simulated, not measured" in n for n in json.loads(imported.stdout)["notes"])
    repo = Repository.open(url, create=False)
    from autotune.dashboard.server import DashboardApp

    page = DashboardApp(repo).trial_page(NAME, repo.trials(repo.get_study(NAME).id)[-1].number).decode()
    assert "measured: this run was imported from its log" in page and "every number on this page" not in page
    yield url, repo
    repo.close()


def test_optuna_loads_the_study_by_its_name_with_the_same_trial_numbers(started):
    url, repo = started
    study = repo.get_study(NAME)
    runs = repo.trials(study.id, dispatched_only=True)
    assert study.optuna_study_name == NAME and study.numbering == "optuna"
    loaded = optuna.load_study(study_name=NAME, storage=url)
    assert loaded.metric_names == ["tokens_per_s_per_gpu"]
    # the Optuna study holds the study's runs (5 dispatched, 1 imported), numbered as autotune numbers them
    assert [t.number for t in loaded.trials] == [t.number for t in runs] == [t.optuna_trial_number for t in runs]
    assert [t.origin for t in runs] == ["study"] * 5 + ["imported"]
    from autotune.controller._optuna import config_of
    from autotune.space import load_space

    perf_domains = load_space("qwen3_30b").perf_domains  # the study's performance knobs are parameters too
    for frozen, trial in zip(loaded.trials, runs):
        assert config_of(frozen.params, perf_domains).key() == trial.config_key
        assert frozen.user_attrs["status"] == trial.status and frozen.user_attrs["origin"] == trial.origin
        assert {k: frozen.user_attrs.get(k) for k in METRICS} == {k: getattr(trial, k) for k in METRICS}
        if trial.status == "completed":
            assert frozen.state == TrialState.COMPLETE and frozen.value == trial.tokens_per_s_per_gpu
    assert loaded.trials[0].user_attrs["backend"] == "simulate" and loaded.trials[0].user_attrs["simulated"] is True
    assert loaded.trials[-1].user_attrs["log"].endswith("run.log")
    assert loaded.best_trial.number == max((t for t in runs if t.status == "completed"),
                                           key=lambda t: t.tokens_per_s_per_gpu).number


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args) -> None:  # no access log on the test's stderr
        pass


def test_optuna_dashboard_shows_the_named_objective_and_the_metrics(started):
    optuna_dashboard = pytest.importorskip("optuna_dashboard", reason="pip install optuna-dashboard (the dev extra)")
    url, repo = started
    server = make_server("127.0.0.1", 0, optuna_dashboard.wsgi(url), handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_port}"

        def get(path: str) -> dict:
            with urllib.request.urlopen(base + path, timeout=30) as response:
                return json.load(response)

        listed = {s["study_name"]: s for s in get("/api/studies")["study_summaries"]}
        assert NAME in listed and listed[NAME]["directions"] == ["maximize"]
        detail = get(f"/api/studies/{listed[NAME]['study_id']}")
    finally:
        server.shutdown()
        server.server_close()
    assert detail["objective_names"] == ["tokens_per_s_per_gpu"]
    runs = repo.trials(repo.get_study(NAME).id, dispatched_only=True)
    assert [t["number"] for t in detail["trials"]] == [t.number for t in runs]
    first = {a["key"]: a["value"] for a in detail["trials"][0]["user_attrs"]}
    assert {"status", "backend", "simulated", "origin", *METRICS} <= set(first)
    assert float(first["mfu"]) == pytest.approx(runs[0].mfu) and first["backend"] == "simulate"
    sortable = {a["key"] for a in detail["union_user_attrs"] if a["sortable"]}
    assert set(METRICS) <= sortable  # numbers: the trial table sorts by them


def test_layouts_rejected_before_dispatch_are_no_optuna_trials(tmp_path):
    """With a memory model up to 60% off, the study runs out of memory and layouts are rejected behind the
    OOM frontier (dozens to hundreds); the Optuna study still holds exactly the budget's 10 runs."""
    from autotune.controller.session import build_controller, create_study
    from autotune.space import load_space, make_workload

    url = f"sqlite:///{tmp_path / 'reject.db'}"
    repo = Repository.open(url)
    space = load_space("qwen3_30b")
    study = create_study(repo, name="tpe", space=space, workload=make_workload(space, gpus=8), budget=10,
                         sampler="tpe", backend="simulate", seed=1,
                         backend_options={"seconds_per_trial": 0.0, "landscape_seed": 3, "memory_error": 0.6,
                                          "knob_bias": 0.0})
    summary = build_controller(repo, study, dispatcher="inprocess").run()
    assert summary.counts["dispatched"] == 10 and summary.counts["oom"] > 0 and summary.counts["rejected"] > 0
    loaded = optuna.load_study(study_name="tpe", storage=url)
    assert [t.number for t in loaded.trials] == list(range(10))
    rejected = [t for t in repo.trials(study.id) if not t.dispatched]
    assert [t.number for t in rejected] == list(range(REJECTED_BASE, REJECTED_BASE + len(rejected)))
    assert all(t.optuna_trial_number is None for t in rejected)
    repo.close()
