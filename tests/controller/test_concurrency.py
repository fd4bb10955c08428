"""Concurrency: a controller joining a running study, and runs that finished while their controller was dead.

- A joiner (`resume` while the first controller runs) must not fail the first one's in-flight
  Optuna proposals: every trial autotune recorded completed is COMPLETE in Optuna (both stores).
- A trial whose run finished (its outcome.json written) while its controller was dead is harvested
  on resume, not launched again (over 10 random SIGKILLs of the controller: test_crash_resume.py).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState
from sqlalchemy import update

from autotune.backends import TrialSpec
from autotune.backends.command import CommandBackend
from autotune.backends.runs import OUTCOME_FILE, study_dir
from autotune.config import LayoutConfig
from autotune.controller.session import build_controller, create_study
from autotune.space import load_space, make_workload
from autotune.storage import Repository
from autotune.storage.models import TrialRow
from tests.conftest import FAKE_LAUNCHER

HOSTILE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "hostile_launcher.py")
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "AUTOTUNE_HEARTBEAT_S": "0.5"}


def _optuna_states(url: str, name: str) -> dict[int, TrialState]:
    return {t.number: t.state for t in optuna.load_study(study_name=name, storage=url).trials}


@pytest.mark.slow
def test_a_joining_controller_leaves_the_first_ones_proposals_alone(storage_url):
    common = ["--storage", storage_url, "--json", "--local-gpus", "8", "--max-concurrent", "1"]
    first = subprocess.Popen([sys.executable, "-m", "autotune", "start", "--model", "llama3_8b", "--gpus", "8",
                              "--budget", "8", "--study", "join", "--backend", "command", "--command",
                              f"{sys.executable} {FAKE_LAUNCHER}", "--sampler", "random", "--no-prune", *common],
                             env={**ENV, "FAKE_STEP_SLEEP_S": "0.25"}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    repo = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            repo = repo or Repository.open(storage_url, create=False)
            study = repo.find_study("join")
        except Exception:
            continue
        if study is not None and repo.counts(study.id)["dispatched"] >= 1:
            break
    joiner = subprocess.run([sys.executable, "-m", "autotune", "resume", "join", *common],
                            env={**ENV, "FAKE_STEP_SLEEP_S": "0.25"}, capture_output=True, text=True, timeout=600)
    _, first_err = first.communicate(timeout=600)
    assert first.returncode == 0, first_err[-2000:]
    assert joiner.returncode in (0, 2), joiner.stderr[-2000:]  # 2: it arrived after the budget was used up
    study = repo.get_study("join")
    trials = repo.trials(study.id, dispatched_only=True)
    assert len(trials) == 8 and len({t.config_key for t in trials}) == 8
    states = _optuna_states(storage_url, "join")
    for trial in trials:
        if trial.status == "completed":
            assert states[trial.number] == TrialState.COMPLETE, (trial.number, trial.optuna_trial_number)
    assert TrialState.RUNNING not in states.values()


def _stale_dispatched_trial(repo: Repository, study, config: LayoutConfig) -> int:
    """A trial as a controller that died right after its run finished would leave it."""
    from autotune.controller._optuna import OptunaStudy

    space = load_space("qwen3_30b")
    number = OptunaStudy(repo.url, study.optuna_study_name, space, "auto", 0, create=False).ask(config)
    trial = repo.claim_dispatch(study.id, config.to_dict(), config.key(), number, "dead-controller", study.budget,
                                number=number)
    with repo.session() as s:
        s.execute(update(TrialRow).where(TrialRow.study_id == study.id, TrialRow.number == trial.number)
                  .values(heartbeat_at=dt.datetime(2020, 1, 1)))
    return trial.number


def _run_finished_while_its_controller_was_dead(tmp_path, name: str):
    """A study with one trial whose controller went stale after its command-backend run finished (the
    run's outcome.json written): (repo, study, trial number, run folder options, launch log, spec)."""
    import threading

    repo = Repository.open(f"sqlite:///{tmp_path / 'h.db'}")
    space = load_space("qwen3_30b")
    workload = make_workload(space, gpus=16)
    log = tmp_path / "launches.log"
    options = {"command": [sys.executable, HOSTILE], "workdir": str(tmp_path / "runs"),
               "env": {"HOSTILE_MODE": "result", "HOSTILE_LAUNCH_LOG": str(log),
                       "HOSTILE_RESULT": json.dumps({"status": "completed", "step_time_s": 30.0})}}
    study = create_study(repo, name=name, space=space, workload=workload, budget=1, sampler="auto",
                         backend="command", backend_options=options, seed=0)
    config = LayoutConfig.from_mapping(space.model.defaults.layout)
    number = _stale_dispatched_trial(repo, study, config)
    spec = TrialSpec(study=name, trial=number, model="qwen3_30b", gpus=16, gpus_per_node=8, gpu="h100",
                     global_batch_size=workload.global_batch_size, seq_length=workload.seq_length,
                     precision=workload.precision, config=config.to_dict(), overrides=[], attempt=1,
                     backend_options=options)
    assert CommandBackend(options).run(spec, lambda _r: None, threading.Event()).status.value == "completed"
    assert log.read_text().count("start") == 1  # the dead controller's run, finished
    return repo, study, number, options, log, spec


@pytest.mark.usefixtures("ray_session")
def test_a_run_that_finished_while_its_controller_was_dead_is_harvested(tmp_path):
    repo, study, number, _, log, _ = _run_finished_while_its_controller_was_dead(tmp_path, "harvest")
    build_controller(repo, study, max_concurrent=1).run()
    trial = repo.trial(study.id, number)
    assert trial.status == "completed" and trial.step_time_s == 30.0 and trial.attempt == 1
    assert log.read_text().count("start") == 1  # harvested, not launched again
    assert _optuna_states(repo.url, "harvest")[trial.number] == TrialState.COMPLETE
    assert repo.get_study("harvest").status == "finished"


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("tamper, harvested", [
    ({"wall_time_s": 1e308}, True),  # types right, a wall time no run lasts: bounded by the watchdog
    ({"wall_time_s": "forever"}, False),  # not a backend's record: the trial runs again
    ({"step_time_s": [30.0]}, False),
    ({"status": "won"}, False),
])
def test_a_tampered_outcome_file_never_reaches_the_store(tmp_path, tamper, harvested):
    """Whoever can write the run folder can change outcome.json before a controller harvests it: a wrong
    type is no outcome (the run is launched again), an absurd wall time is bounded, and every command
    can still read the store afterwards (an infinite GPU time once made the whole store unreadable)."""
    repo, study, number, options, log, spec = _run_finished_while_its_controller_was_dead(tmp_path, "tampered")
    path = study_dir(options, "tampered") / f"trial{number}-attempt1" / OUTCOME_FILE
    record = json.loads(path.read_text())
    record["outcome"].update(tamper)
    path.write_text(json.dumps(record))
    build_controller(repo, study, max_concurrent=1).run()
    trial = repo.trial(study.id, number)
    assert trial.status == "completed" and trial.step_time_s == 30.0
    assert log.read_text().count("start") == (1 if harvested else 2)
    assert 0 <= trial.gpu_seconds <= (spec.timeout_s + 60.0) * spec.gpus
    assert [s.name for s in repo.list_studies()] == ["tampered"]  # the read side accepts every row
