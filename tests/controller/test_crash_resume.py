"""SIGKILL the controller at random points of a command-backend study, resume each time.

The final study has exactly its budget of dispatched trials, each layout once, every completed
measurement kept unchanged, Optuna agreeing; nothing of a killed controller's session survives, and a
run that had finished (its outcome.json written) while its controller was dead is harvested, never
launched again.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.backends.runs import OUTCOME_FILE, study_dir
from autotune.storage import Repository
from tests.conftest import FAKE_LAUNCHER, wait_for_study

pytestmark = pytest.mark.slow
KILLS = int(os.environ.get("AUTOTUNE_TEST_KILLS", "10"))
BUDGET = 12


def _env():
    return {**os.environ, "RAY_AUTH_MODE": "disabled", "AUTOTUNE_HEARTBEAT_S": "0.5", "FAKE_STEP_SLEEP_S": "0.15"}


def _session_processes(sid: int) -> list[str]:
    alive = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    command = handle.read().replace(b"\0", b" ").decode()[:200]
                alive.append(f"{pid} {command}")
            except FileNotFoundError:
                continue
    return alive


def _completed(repo: Repository, name: str) -> dict[int, tuple]:
    study = repo.find_study(name)
    if study is None:
        return {}
    return {t.number: (t.config_key, t.step_time_s, t.tokens_per_s_per_gpu)
            for t in repo.trials(study.id) if t.status == "completed"}


def _attempts(workdir: Path, study: str) -> dict[int, list[tuple[int, bool]]]:
    """trial -> [(attempt, its run finished)] from the run folders."""
    found: dict[int, list[tuple[int, bool]]] = {}
    for folder in sorted(study_dir({"workdir": str(workdir)}, study).glob("trial*-attempt*")):
        trial, attempt = folder.name.removeprefix("trial").split("-attempt")
        found.setdefault(int(trial), []).append((int(attempt), (folder / OUTCOME_FILE).is_file()))
    return {k: sorted(v) for k, v in found.items()}


def test_sigkill_at_random_points_then_resume(tmp_path):
    url, workdir = f"sqlite:///{tmp_path / 'crash.db'}", tmp_path / "runs"
    rng = random.Random(1234)
    start = [sys.executable, "-m", "autotune", "start", "--model", "llama3_8b", "--gpus", "8", "--budget",
             str(BUDGET), "--study", "crash", "--storage", url, "--backend", "command", "--command",
             f"{sys.executable} {FAKE_LAUNCHER}", "--workdir", str(workdir), "--sampler", "random", "--seed", "7", "--no-prune", "--json"]
    resume = [sys.executable, "-m", "autotune", "resume", "crash", "--storage", url, "--json"]
    kept: dict[int, tuple] = {}
    repo = None
    for cycle in range(KILLS):
        command = start if cycle == 0 else resume
        process = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   start_new_session=True)
        if cycle == 0:  # start reaches Ray before it stores the study: kill it once there is one to resume
            wait_for_study(tmp_path / "crash.db", "crash", process)
        time.sleep(rng.uniform(3.0, 9.0))
        finished = process.poll() is not None
        if not finished:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        deadline = time.monotonic() + 60  # Ray's processes exit once they notice the driver is gone
        while _session_processes(process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _session_processes(process.pid) == [], "a killed controller left processes behind"
        repo = repo or Repository.open(url)
        now = _completed(repo, "crash")
        for number, measurement in kept.items():
            assert now[number] == measurement, "a completed measurement changed or vanished"
        kept = now
        if finished:
            break
    final = subprocess.run(resume, env=_env(), capture_output=True, text=True, timeout=300)
    if final.returncode == 2 and "already finished" in final.stderr:
        pass  # the study ended in a cycle; nothing to resume
    else:
        assert final.returncode == 0, final.stderr[-2000:]
        json.loads(final.stdout)
    repo = repo or Repository.open(url)
    study = repo.get_study("crash")
    trials = repo.trials(study.id, dispatched_only=True)
    assert len(trials) == BUDGET
    assert len({t.config_key for t in trials}) == BUDGET
    assert all(t.status == "completed" for t in trials), [(t.number, t.status, t.message) for t in trials]
    assert all(t.worker_losses == 0 for t in trials)  # controller deaths only
    for number, measurement in kept.items():
        assert _completed(repo, "crash")[number] == measurement
    optuna_trials = optuna.load_study(study_name="crash", storage=url).trials
    complete = {t.number for t in optuna_trials if t.state == TrialState.COMPLETE}
    assert complete == {t.number for t in trials} == {t.optuna_trial_number for t in trials}
    assert not [t for t in optuna_trials if t.state == TrialState.RUNNING]
    assert study.status == "finished"
    attempts = _attempts(workdir, "crash")
    assert set(attempts) == {t.number for t in trials}
    for number, tries in attempts.items():
        for (attempt, finished), later in zip(tries, tries[1:]):
            assert not finished, f"trial {number}: attempt {attempt} had finished, yet attempt {later[0]} ran"
