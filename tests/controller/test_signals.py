"""SIGTERM to a running controller, alone or with its whole process group: stopped like Ctrl-C.

Each case starts a real study (local Ray, simulate backend slowed to 1 s per trial) as the leader
of its own process group, as a shell job is, waits until trials run, sends the signal, and checks
the exit code, the single stderr line, the study's status, that no Ray process of it survives,
and that `resume` completes the study.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from autotune.errors import StorageError
from autotune.storage import Repository

pytestmark = pytest.mark.slow
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "AUTOTUNE_HEARTBEAT_S": "0.5"}
BUDGET = 12


def _group_alive(pgids: set[int]) -> list[str]:
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) in pgids and fields[0] not in ("Z", "X"):
            alive.append(entry)
    return alive


def _descendants(pid: int) -> list[tuple[str, int]]:
    """(name, process group) of every descendant of `pid`, from /proc."""
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as handle:
                        head, rest = handle.read().rsplit(")", 1)
                except OSError:
                    continue
                fields = rest.split()
                if int(fields[1]) == parent:
                    found.append((head.split("(", 1)[1], int(fields[2])))
                    frontier.append(int(entry))
    return found


def _ray_groups(pid: int) -> set[int]:
    """Process groups of the controller's descendants (Ray's processes live in a group of their own)."""
    return {group for _, group in _descendants(pid)}


@pytest.mark.parametrize("target", ["controller", "process-group"])
def test_sigterm_interrupts_cleanly_and_resume_finishes(tmp_path, target):
    url = f"sqlite:///{tmp_path / 'sig.db'}"
    process = subprocess.Popen([sys.executable, "-m", "autotune", "start", "--model", "qwen3_30b", "--budget",
                                str(BUDGET), "--sim-seconds", "1", "--study", "sig", "--storage", url, "--json"],
                               env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0)
    repo = None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait until the study runs trials
        time.sleep(0.5)
        if os.path.exists(tmp_path / "sig.db"):
            try:
                repo = repo or Repository.open(url, create=False)
            except StorageError:
                continue  # the controller is still creating the schema
            study = repo.find_study("sig")
            if study is not None and repo.counts(study.id)["dispatched"] >= 2:
                break
    assert process.poll() is None, process.communicate()[1][-2000:]
    groups = _ray_groups(process.pid)
    if target == "controller":
        process.send_signal(signal.SIGTERM)
    else:
        os.killpg(process.pid, signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr[-3000:]
    assert stderr.strip().splitlines() == ["autotune: interrupted (SIGTERM)"], stderr[-3000:]
    assert repo.get_study("sig").status == "interrupted"
    deadline = time.monotonic() + 30
    while _group_alive(groups) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _group_alive(groups) == []  # the local Ray went with its controller
    resumed = subprocess.run([sys.executable, "-m", "autotune", "resume", "sig", "--storage", url, "--json"],
                             env=ENV, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    summary = json.loads(resumed.stdout)
    assert summary["dispatched"] == BUDGET and summary["running"] == 0 and summary["status"] == "finished"


def test_sigterm_while_the_local_ray_starts_stops_it_all(tmp_path):
    """Review: a SIGTERM inside ray.init met Ray's own handler (exit 15, no word), and Ray's agents, children
    of the half-started raylet, outlived the controller. The signal is sent as soon as Ray's GCS runs. A store
    that was there before stays, with no study added."""
    url = f"sqlite:///{tmp_path / 'early.db'}"
    process = subprocess.Popen([sys.executable, "-m", "autotune", "start", "--model", "qwen3_30b", "--budget", "4",
                                "--study", "early", "--storage", url], env=ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, process_group=0)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any("gcs_server" in n for n, _ in _descendants(process.pid)):
        time.sleep(0.05)
    assert process.poll() is None, process.communicate()[1][-2000:]
    groups = _ray_groups(process.pid)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, stderr[-3000:]
    assert stderr.strip().splitlines() == ["autotune: interrupted (SIGTERM)"], stderr[-3000:]
    deadline = time.monotonic() + 30
    while _group_alive(groups) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _group_alive(groups) == []  # the agents too
    # Ray starts before the study is stored, and the store file this start made is gone again (found by the
    # storage pass: a refused start left a new file holding only the schema behind)
    assert not list(tmp_path.glob("early.db*"))


def _stop(process: subprocess.Popen) -> str:
    process.send_signal(signal.SIGTERM)
    return process.communicate(timeout=120)[0]


def test_resume_of_stopped_runs_holds_a_slot_for_each(tmp_path):
    """Second review: resuming a study whose whole budget was dispatched and stopped counted no runs left
    and held one slot, so the stopped runs ran one after another."""
    url = f"sqlite:///{tmp_path / 'slots.db'}"
    common = ["--local-gpus", "32", "--storage", url]
    start = subprocess.Popen([sys.executable, "-m", "autotune", "start", "--model", "qwen3_30b", "--budget", "2",
                              "--sim-seconds", "300", "--study", "slots", *common], env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, process_group=0)
    repo, deadline = None, time.monotonic() + 120
    while time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            repo = repo or Repository.open(url, create=False)
        except StorageError:
            continue
        study = repo.find_study("slots")
        if study is not None and repo.counts(study.id)["dispatched"] == 2:
            break
    assert "Ray is up (2 trial(s) at a time)" in _stop(start) and start.returncode == 143
    resume = subprocess.Popen([sys.executable, "-m", "autotune", "resume", "slots", *common], env=ENV,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0)
    shown = ""
    while "Ray is up" not in shown and resume.poll() is None and time.monotonic() < deadline + 120:
        shown += resume.stdout.readline()
    shown += _stop(resume)
    assert "Ray is up (2 trial(s) at a time)" in shown, shown[-2000:]


def test_a_refused_start_leaves_an_existing_store_and_its_studies(tmp_path):
    """The new-file clean-up of a refused start removes only a file that start made: an existing store, with
    its studies, stays as it was (here refused for a taken name, after the store was opened)."""
    url = f"sqlite:///{tmp_path / 'kept.db'}"
    first = subprocess.run([sys.executable, "-m", "autotune", "start", "--model", "qwen3_30b", "--budget", "1",
                            "--study", "kept", "--storage", url, "--sim-seconds", "0", "--json"], env=ENV,
                           capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    again = subprocess.run([sys.executable, "-m", "autotune", "start", "--model", "qwen3_30b", "--budget", "1",
                            "--study", "kept", "--storage", url], env=ENV, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "already exists" in again.stderr, again.stderr[-2000:]
    assert Repository.open(url, create=False).find_study("kept") is not None
