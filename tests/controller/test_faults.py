"""Worker deaths and concurrent controllers, on the session's local Ray and the real PostgreSQL."""

from __future__ import annotations

import os
import signal

import pytest

from autotune.controller.session import build_controller, create_study
from autotune.space import load_space, make_workload
from autotune.storage import Repository
from tests.conftest import run_in_threads

pytestmark = pytest.mark.usefixtures("ray_session")


def _study(url, name, budget, seconds_per_trial, sampler="auto", model="llama3_8b", gpus=8):
    repo = Repository.open(url)
    space = load_space(model)
    workload = make_workload(space, gpus=gpus)
    study = create_study(repo, name=name, space=space, workload=workload, budget=budget, sampler=sampler,
                         backend="simulate", backend_options={"seconds_per_trial": seconds_per_trial}, seed=3,
                         options={"prune_slow": False})
    return repo, study


def test_a_worker_killed_mid_trial_is_retried_once(tmp_path):
    repo, study = _study(f"sqlite:///{tmp_path / 'w.db'}", "w", budget=3, seconds_per_trial=2.0)
    controller = build_controller(repo, study, max_concurrent=1)
    killed: list[int] = []

    def kill_first_runner(c) -> None:
        if not killed and c.running:
            for trial, pid in c.dispatcher.runner_pids().items():
                os.kill(pid, signal.SIGKILL)
                killed.append(trial)

    controller.on_tick = kill_first_runner
    summary = controller.run()
    assert killed
    victim = repo.trial(study.id, killed[0])
    assert victim.status == "completed" and victim.attempt == 2
    assert victim.worker_losses == 1 and "worker died" in victim.artifacts["losses"][0]
    assert summary.counts["dispatched"] == 3 and summary.counts["completed"] == 3


def test_two_controllers_on_one_postgres_study_never_dispatch_a_layout_twice(postgres_url):
    """Both controllers use the same seed, so they propose the same layouts and race for them."""
    repo, study = _study(postgres_url, "shared", budget=10, seconds_per_trial=0.3)
    controller_ids: list[str] = []

    def run_controller() -> None:
        own_repo = Repository.open(postgres_url)
        controller = build_controller(own_repo, own_repo.get_study("shared"), max_concurrent=1)
        controller_ids.append(controller.controller_id)
        controller.run()

    errors = run_in_threads(run_controller, 2, timeout_s=600)
    assert not errors, errors
    trials = repo.trials(study.id, dispatched_only=True)
    assert len(trials) == 10
    # each layout once, except the deliberate re-runs of close contenders in the budget's last 15% (both
    # controllers now count the whole study's budget, so they reach that window as one controller does)
    first_runs = [t.config_key for t in trials if t.strategy_note != "remeasure"]
    assert len(first_runs) == len(set(first_runs)) >= 8
    assert all(t.config_key in first_runs for t in trials if t.strategy_note == "remeasure")
    assert {t.controller_id for t in trials} == set(controller_ids)  # both did work
    assert all(t.status == "completed" for t in trials)
    duplicates = [t for t in repo.trials(study.id) if t.reason == "duplicate"]
    assert all(not t.dispatched for t in duplicates)
