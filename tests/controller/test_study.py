"""Whole studies on the session's local Ray (16 logical GPUs), real SQLite files and PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import optuna
import pytest
from optuna.trial import TrialState

from autotune.controller.session import build_controller, create_study
from autotune.errors import ConfigError
from autotune.space import load_space, make_workload
from autotune.storage import REJECTED_BASE, Repository
from tests.conftest import FAKE_LAUNCHER

pytestmark = pytest.mark.usefixtures("ray_session")


def run(url, name="s", model="qwen3_30b", gpus=8, budget=8, sampler="auto", backend="simulate",
        backend_options=None, fixes=None, options=None, seed=0):
    repo = Repository.open(url)
    space = load_space(model)
    if fixes:
        space = space.fixed(fixes)
    workload = make_workload(space, gpus=gpus)
    opts = {"seconds_per_trial": 0.0, **(backend_options or {})} if backend == "simulate" else (backend_options or {})
    study = create_study(repo, name=name, space=space, workload=workload, budget=budget, sampler=sampler,
                         backend=backend, backend_options=opts, seed=seed, options=options)
    summary = build_controller(repo, study).run()
    return repo, repo.get_study(name), summary


def optuna_trials(url, name):
    return optuna.load_study(study_name=name, storage=url).trials  # the Optuna study has the study's name


def test_simulate_study_dispatches_exactly_its_budget(storage_url):
    repo, study, summary = run(storage_url, budget=8, gpus=16)  # the recipe default is legal on 16
    trials = repo.trials(study.id, dispatched_only=True)
    assert len(trials) == 8 == summary.counts["dispatched"]
    first_runs = [t for t in trials if t.strategy_note != "remeasure"]
    assert len({t.config_key for t in first_runs}) == len(first_runs)  # each layout once ...
    earlier = {t.config_key for t in first_runs}
    assert all(t.config_key in earlier for t in trials if t.strategy_note == "remeasure")  # ... unless re-measured
    assert all(t.status == "completed" and t.tokens_per_s_per_gpu for t in trials)
    assert study.status == "finished"
    assert trials[0].strategy_note == "baseline"  # the recipe's layout is measured first
    assert summary.best.tokens_per_s_per_gpu >= trials[0].tokens_per_s_per_gpu
    completed = [t for t in optuna_trials(storage_url, "s") if t.state == TrialState.COMPLETE]
    assert len(completed) == 8
    # a trial's number is its Optuna trial number
    assert [t.number for t in completed] == [t.number for t in trials] == [t.optuna_trial_number for t in trials]
    assert all(t.gpu_seconds > 0 and t.dispatched_at and t.finished_at for t in trials)
    assert not [t for t in optuna_trials(storage_url, "s") if t.state == TrialState.FAIL]  # no stray asks


def test_two_trials_run_at_once_when_the_cluster_holds_two(tmp_path):
    """8-GPU trials on the 16-GPU local Ray: two placement groups, two trials at a time."""
    url = f"sqlite:///{tmp_path / 'a.db'}"
    repo = Repository.open(url)
    space = load_space("llama3_8b")
    workload = make_workload(space, gpus=8)
    study = create_study(repo, name="c", space=space, workload=workload, budget=4, sampler="random",
                         backend="simulate", backend_options={"seconds_per_trial": 0.5}, seed=1,
                         options={"prune_slow": False})
    controller = build_controller(repo, study)
    assert controller.dispatcher.capacity == 2
    seen = []
    controller.on_tick = lambda c: seen.append(len(c.running))
    controller.run()
    assert max(seen) == 2
    assert repo.counts(study.id)["completed"] == 4


@pytest.mark.parametrize("sampler", ["tpe", "gp"])
def test_optuna_samplers_propose_only_legal_layouts(tmp_path, sampler):
    """TPE and GP sample knobs in a private study; their illegal suggestions are told infeasible there
    and never reach the controller, the study of record or a backend."""
    url = f"sqlite:///{tmp_path / 't.db'}"
    repo, study, summary = run(url, name=sampler, sampler=sampler, budget=4, gpus=16)
    counts = repo.counts(study.id)
    assert counts["dispatched"] == 4 and counts["completed"] == 4
    assert not [t for t in repo.trials(study.id) if t.status == "rejected" and t.reason != "predicted_oom"]
    assert all(t.strategy_note.startswith(sampler) for t in repo.trials(study.id, dispatched_only=True))
    states = [t.state for t in optuna_trials(url, sampler)]
    assert states.count(TrialState.COMPLETE) == 4 and TrialState.FAIL not in states


def test_oom_trials_are_infeasible_and_imply_a_frontier(tmp_path):
    """A hidden 40% memory-model error makes measured OOMs; dominated layouts are skipped with their source."""
    url = f"sqlite:///{tmp_path / 'o.db'}"
    repo, study, _ = run(url, name="oom", gpus=8, budget=10,
                         backend_options={"landscape_seed": 3, "memory_error": 0.4, "knob_bias": 0.0})
    trials = repo.trials(study.id)
    oom = [t for t in trials if t.status == "oom"]
    assert oom, "the landscape should make some layouts run out of memory"
    assert all(t.reason == "out_of_memory" and t.peak_mem_gib for t in oom)
    by_number = {t.number: t for t in optuna_trials(url, "oom")}
    for t in oom:
        frozen = by_number[t.number]
        assert frozen.state == TrialState.PRUNED and frozen.user_attrs["status"] == "oom"
    implied = [t for t in trials if t.reason == "oom_frontier"]
    assert implied and all(t.implied_by_trial in {o.number for o in oom} for t in implied)
    assert repo.counts(study.id)["dispatched"] == 10
    # rejected layouts never ran: they are no Optuna trials, and take no run's number
    assert sorted(by_number) == [t.number for t in trials if t.dispatched] == list(range(10))
    assert all(t.number >= REJECTED_BASE and t.optuna_trial_number is None for t in implied)


def test_slow_branches_are_pruned(tmp_path):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    repo, study, _ = run(url, name="slow", sampler="random", budget=10, seed=4,
                         backend_options={"seconds_per_trial": 0.6},  # steps must arrive while it runs
                         options={"slow_margin": 0.0, "warmup_steps": 1})
    trials = repo.trials(study.id, dispatched_only=True)
    pruned = [t for t in trials if t.status == "pruned"]
    assert pruned and all(t.reason == "slow_branch" for t in pruned)
    assert all(len(t.step_times_s) < 6 for t in pruned)  # stopped before all 6 steps
    # its record says why, with the figures (found by a new-user pass: "cancelled by the controller")
    assert all(t.message.startswith("pruned as a slow branch: its median measured step, ") and "the best completed run's"
               in t.message for t in pruned)
    # and the board shows where each stood when it was cut (the median of its measured steps, as the pruner saw it)
    from autotune import leaderboard
    from autotune.dashboard._figures import throughput_by_trial

    board = leaderboard.build(repo, study)
    partial = {r["trial"]: r["partial_tokens_per_s_per_gpu"] for r in board.rows if r["status"] == "pruned"}
    best = max(r["tokens_per_s_per_gpu"] or 0 for r in board.rows)
    assert partial and all(p is None or 0 < p < best for p in partial.values())
    assert any(partial.values())
    names = [t["name"] for t in throughput_by_trial("slow", board.rows, None)["data"]]
    assert "pruned (its steps before the cut)" in names
    states = {t.number: t.state for t in optuna_trials(url, "slow")}
    assert all(states[t.number] == TrialState.PRUNED for t in pruned)


def test_command_backend_study_survives_crashes(tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    repo, study, summary = run(url, name="crash", backend="command", budget=3,
                               backend_options={"command": f"python3 {FAKE_LAUNCHER}", "env": {"FAKE_MODE": "crash"}})
    trials = repo.trials(study.id, dispatched_only=True)
    assert len(trials) == 3 and all(t.status == "failed" for t in trials)
    assert all("NCCL error" in t.message for t in trials)
    assert summary.best is None


def test_command_backend_partial_results_are_completed_by_the_controller(tmp_path):
    url = f"sqlite:///{tmp_path / 'd.db'}"
    # pruning off: the fake launcher's step times are real sleeps, which a loaded machine stretches
    repo, study, _ = run(url, name="partial", backend="command", budget=2, options={"prune_slow": False},
                         backend_options={"command": f"python3 {FAKE_LAUNCHER}", "env": {"FAKE_MODE": "partial"}})
    for t in repo.trials(study.id, dispatched_only=True):
        assert t.status == "completed"
        assert t.tokens_per_s_per_gpu and t.tflops_per_gpu and 0 < t.mfu < 1
        assert t.tokens_per_s_per_gpu == pytest.approx(1024 * 4096 / (t.step_time_s * 8))


def test_a_traced_run_s_measured_parts_are_stored_and_calibrate_the_model(tmp_path):
    """Issue 15: the parts of a step a trace measured (here a cluster whose exposed communication is twice
    the model's, compute 1.3x) are stored with each trial and fitted by the calibration: with them the
    communication terms move further toward the cluster's than whole step times alone move them."""
    import dataclasses

    from autotune.controller.physics import fit_from_trials

    url = f"sqlite:///{tmp_path / 't.db'}"
    repo, study, _ = run(url, name="traced", backend="command", budget=4, options={"prune_slow": False},
                         backend_options={"command": f"python3 {FAKE_LAUNCHER}", "env": {"FAKE_MODE": "traced"}})
    trials = [t for t in repo.trials(study.id, dispatched_only=True) if t.status == "completed"]
    assert len(trials) >= 3 and all(set(t.measured_terms_s) == {"compute", "exposed_communication"} for t in trials)
    for t in trials:  # what the launcher said, per step, inside the measured step
        assert t.measured_terms_s["compute"] + t.measured_terms_s["exposed_communication"] < t.step_time_s
    traced = fit_from_trials(trials)
    blind = fit_from_trials([dataclasses.replace(t, measured_terms_s=None) for t in trials])
    assert traced["traced_runs"] == len(trials) and blind["traced_runs"] == 0
    ep_traced, ep_blind = traced["step_time_terms"]["ep"]["scale"], blind["step_time_terms"]["ep"]["scale"]
    assert abs(ep_traced - 2.0) < abs(ep_blind - 2.0), (ep_traced, ep_blind)
    shown = subprocess.run([sys.executable, "-m", "autotune", "show", "traced", "--calibration", "--json",
                            "--storage", url], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and json.loads(shown.stdout)["traced_runs"] == len(trials), shown.stderr
    table = subprocess.run([sys.executable, "-m", "autotune", "show", "traced", "--calibration", "--storage", url],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert f"{len(trials)} of the runs carried a measured breakdown of their step" in table.stdout, table.stdout
    repo.close()


def test_grid_and_random_strategies_finish(tmp_path):
    for sampler in ("grid", "random"):
        url = f"sqlite:///{tmp_path / (sampler + '.db')}"
        repo, study, _ = run(url, name=sampler, sampler=sampler, budget=5)
        assert repo.counts(study.id)["dispatched"] == 5


def test_a_small_space_is_exhausted_before_the_budget(tmp_path):
    url = f"sqlite:///{tmp_path / 'e.db'}"
    fixes = {"tp": 1, "pp": 1, "vpp": 1, "cp": 1, "etp": 1, "mbs": 1, "recompute": "none", "dist_opt": True,
             "sp": False}
    # on 16 GPUs (on 8 no layout of these fits: such a study is refused before it is stored, see below)
    repo, study, summary = run(url, name="small", budget=40, fixes=fixes, gpus=16)
    assert summary.stop_reason == "exhausted"
    assert 0 < repo.counts(study.id)["dispatched"] < 40
    with pytest.raises(ConfigError, match="predicted to fit"):
        run(url, name="nothing-fits", budget=40, fixes=fixes, gpus=8)
    assert repo.find_study("nothing-fits") is None


def test_a_space_of_one_layout_tunes_its_performance_knobs(tmp_path):
    """Found by a new-user pass: with every layout knob pinned (`--fix` each one: tune only the performance
    knobs of a layout one trusts), the knob phase's GP refused its zero inputs and the study died on a traceback
    after its first run."""
    fixes = {"tp": 1, "pp": 1, "vpp": 1, "cp": 1, "ep": 16, "etp": 1, "mbs": 1, "recompute": "none",
             "dist_opt": True, "sp": False}
    repo, study, summary = run(f"sqlite:///{tmp_path / 'one.db'}", name="one", budget=30, fixes=fixes, gpus=16)
    trials = repo.trials(study.id, dispatched_only=True)
    assert study.status == "finished" and summary.counts["completed"] == len(trials) > 1
    assert len({tuple(sorted((k, str(t.config.get(k))) for k in fixes)) for t in trials}) == 1  # one layout
    assert any(t.strategy_note == "knobs" for t in trials)  # its performance knobs were tuned


def test_a_gpu_hour_cap_stops_runs_from_starting_and_resume_raises_it(tmp_path):
    """--max-gpu-hours: no run starts once the study's runs have held it; the study ends `finished` with
    stop reason gpu_hours (no validation run then), and a raised cap (resume --max-gpu-hours) continues it."""
    import datetime as dt

    from autotune.storage import StudyStatus

    url = f"sqlite:///{tmp_path / 'cap.db'}"
    # a simulated run of this study holds 16 GPUs for about 7 minutes: about 1.8 GPU-hours
    repo, study, summary = run(url, name="cap", gpus=16, budget=10, options={"max_gpu_hours": 4.0, "validate_steps": 20})
    spent_h = repo.gpu_seconds_spent(study.id) / 3600
    assert summary.stop_reason == "gpu_hours" and study.status == "finished"
    assert 2 <= summary.counts["dispatched"] < 10 and summary.counts["validation"] == 0
    last = max(repo.trials(study.id, dispatched_only=True), key=lambda t: t.number)
    assert spent_h >= 4.0 and spent_h - last.gpu_seconds / 3600 < 4.0  # the last run started below the cap
    # a raised cap: the study has runs to make in it again, so `resume` may run it; under the lock, as --budget
    repo.set_study_limits(study.id, 10, dt.datetime(2020, 1, 1), max_gpu_hours=spent_h + 4.0)
    again = repo.get_study("cap")
    assert again.status == StudyStatus.INTERRUPTED.value and again.options["max_gpu_hours"] == spent_h + 4.0
    summary = build_controller(repo, again).run()
    assert summary.counts["dispatched"] > 2 and repo.get_study("cap").status == "finished"
    # a cap below the hours spent leaves a finished study finished
    repo.set_study_limits(study.id, 11, dt.datetime(2020, 1, 1), max_gpu_hours=1.0)
    assert repo.get_study("cap").status == "finished" and repo.get_study("cap").budget == 11
    repo.close()


def _q16(tmp_path, name, budget=4, options=None):
    """A stored, not yet run, simulated qwen3_30b@16 study (runs of about 1.8 GPU-hours) in its own SQLite file."""
    repo = Repository.open(f"sqlite:///{tmp_path / (name + '.db')}")
    space = load_space("qwen3_30b")
    study = create_study(repo, name=name, space=space, workload=make_workload(space, gpus=16), budget=budget,
                         sampler="auto", backend="simulate", backend_options={"seconds_per_trial": 0.0}, seed=0,
                         options=options)
    return repo, study


def _capped(tmp_path, name, budget, cap, concurrency=1, validate_steps=0):
    """A simulated qwen3_30b@16 study under a GPU-hour cap, run in process."""
    repo, study = _q16(tmp_path, name, budget, {"max_gpu_hours": cap, "validate_steps": validate_steps})
    summary = build_controller(repo, study, dispatcher="inprocess", max_concurrent=concurrency).run()
    return repo, repo.get_study(name), summary


def test_a_claim_the_cap_refuses_stops_this_round_without_ending_the_search(tmp_path, monkeypatch):
    """claim_dispatch refuses a run the cap has no room for under the study's lock (another controller's run took
    it since this controller's own check): the proposal is told to Optuna as not dispatched (reason cap), nothing is
    stored for it, and the study goes on once there is room (the space is not taken for used up)."""
    from optuna.trial import TrialState

    from autotune.storage import ClaimRefused

    repo, study = _q16(tmp_path, "capclaim", budget=3, options={"max_gpu_hours": 100.0})
    real, refused = repo.claim_dispatch, []

    def claim(*args, **kwargs):
        assert kwargs.get("cap") is not None  # the controller hands its cap to the locked check
        if not refused:
            refused.append(args[4] if len(args) > 4 else None)
            return ClaimRefused.CAP
        return real(*args, **kwargs)

    monkeypatch.setattr(repo, "claim_dispatch", claim)
    summary = build_controller(repo, study, dispatcher="inprocess").run()
    assert refused and summary.counts["dispatched"] == 3 and summary.stop_reason == "budget"
    failed = [t for t in optuna_trials(repo.url, "capclaim") if t.state == TrialState.FAIL]
    assert [t.user_attrs.get("reason") for t in failed] == ["cap"]
    repo.close()


def test_with_several_runs_in_flight_the_cap_counts_them_at_the_mean_run(tmp_path):
    """Review: four slots and a 3 GPU-hour cap started five runs (9.2 GPU-hours): a run in flight counted
    nothing; and then a cap below one round's hours started the whole first round (no run had ended to tell
    its length). Runs in flight count at the mean of the ended runs, before any has at the cost forecast's run,
    so none starts past the cap: 3 GPU-hours start two runs of ~1.8, not four."""
    repo, study, summary = _capped(tmp_path, "four", budget=12, cap=3.0, concurrency=4)
    assert summary.stop_reason == "gpu_hours" and summary.counts["dispatched"] == 2
    # at the figure `start` printed (the recipe's layout; review: the controller priced another layout, 34%
    # dearer, once the recipe's had been dispatched)
    from autotune.backends import backend_class
    from autotune.controller.forecast import forecast

    repo, study = _q16(tmp_path, "printed", budget=6, options={"max_gpu_hours": 4.5})
    controller = build_controller(repo, study, dispatcher="inprocess", max_concurrent=4)
    printed = forecast(controller.state, controller.baseline, 6, controller.options, backend_class("simulate"),
                       study.backend_options)
    controller.run()
    assert controller._first_run_gpu_s == pytest.approx(printed.run_s * printed.gpus)
    repo, study, summary = _capped(tmp_path, "four-more", budget=12, cap=9.0, concurrency=4)
    per_run_h = repo.gpu_seconds_spent(study.id) / 3600 / summary.counts["dispatched"]
    # runs start while held + in flight (at the mean) < cap: at most one run's hours above it
    assert summary.counts["dispatched"] < 12 and repo.gpu_seconds_spent(study.id) / 3600 < 9.0 + 1.2 * per_run_h


def test_validation_runs_count_against_the_cap_and_a_raised_cap_runs_the_ones_it_kept(tmp_path):
    """Review: validation runs were checked against the cap once, before the first (a 9.5 GPU-hour study ended at
    25); and a study whose budget spent the cap skipped its validation unsaid, for good."""
    import datetime as dt

    repo, study, summary = _capped(tmp_path, "val", budget=5, cap=12.0, validate_steps=50)
    assert summary.counts["dispatched"] == 5 and summary.counts["validation"] == 1  # the second one kept
    assert summary.stop_reason == "gpu_hours" and study.status == "finished"
    from autotune import leaderboard

    assert leaderboard.build(repo, study).summary["validation_skipped"] is None  # one ran
    repo, study, summary = _capped(tmp_path, "val0", budget=5, cap=8.0, validate_steps=50)
    assert summary.counts["validation"] == 0 and summary.stop_reason == "gpu_hours"
    # and the board says so (found by a new-user pass: the validation the study promised was skipped unsaid)
    board = leaderboard.build(repo, repo.get_study("val0"))
    assert board.summary["validation_skipped"] == "the GPU-hour cap was reached first"
    assert leaderboard.validation_note(board.summary).startswith("no validation run (--validate-steps): the GPU-hour")
    repo.set_study_limits(study.id, 5, dt.datetime(2020, 1, 1), max_gpu_hours=100.0)
    assert repo.get_study("val0").status == "interrupted"  # validation runs owed: resumable
    summary = build_controller(repo, repo.get_study("val0"), dispatcher="inprocess").run()
    assert summary.counts["validation"] >= 1 and summary.stop_reason == "budget"


def test_the_gpu_time_of_a_stopped_attempt_is_counted(tmp_path):
    """Review: an interrupted attempt (Ctrl-C, a dead controller) held GPUs that no figure counted, so each
    interruption quietly gave back cap."""
    import dataclasses
    import datetime as dt

    from autotune.config import LayoutConfig
    from autotune.controller.loop import _held_until_silent

    repo, study = _q16(tmp_path, "held", budget=3)
    layout = LayoutConfig.from_mapping({"ep": 16, "dist_opt": True})
    trial = repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), None, "c", 3)
    repo.release_trials(study.id, [trial.number], {trial.number: 1600.0})
    assert repo.trial(study.id, trial.number).gpu_seconds == 1600.0 == repo.gpu_seconds_spent(study.id)
    stale = repo.trial(study.id, trial.number)
    beat = dt.datetime(2026, 1, 1, 12, 0, 0)
    for dispatched, heartbeat, held in ((beat - dt.timedelta(seconds=100), beat, 1600.0),  # 100 s on 16 GPUs
                                        (beat, None, 0.0), (beat + dt.timedelta(seconds=5), beat, 0.0)):
        assert _held_until_silent(dataclasses.replace(stale, dispatched_at=dispatched, heartbeat_at=heartbeat),
                                  16) == held
    repo.close()


def test_a_hand_edited_gpu_time_that_sums_to_no_number_is_a_storage_error(tmp_path):
    from autotune.cli._study_cmds import _raised_cap
    from autotune.errors import StorageError
    from autotune.storage.models import TrialRow

    repo, study, _ = _capped(tmp_path, "inf", budget=2, cap=100.0)
    with repo.session() as s:
        s.query(TrialRow).filter(TrialRow.study_id == study.id).update({"gpu_seconds": float("inf")})
    with pytest.raises(StorageError, match="no plausible number"):
        repo.gpu_seconds_spent(study.id)
    assert _raised_cap(5.42) == "6.8" and _raised_cap(0.0) == "0.01" and _raised_cap(1e12) == "1e+09"
    repo.close()


def _study_with_a_stale_run(tmp_path, name, cap, budget=4, done_gpu_seconds=3700.0, heartbeat=True):
    """A study whose first run completed (`done_gpu_seconds`) and whose second was left `dispatched` by a dead
    controller (dispatched, then heartbeating for 60 s) or released by an interrupted one (`heartbeat` False)."""
    import datetime as dt

    from autotune.config import LayoutConfig
    from autotune.storage.models import TrialRow

    repo, study = _q16(tmp_path, name, budget, {"max_gpu_hours": cap})
    done, stale = (LayoutConfig.from_mapping(c) for c in ({"ep": 16, "dist_opt": True}, {"ep": 8, "dist_opt": True}))
    # numbered apart from the Optuna trials the controller asks for (0, 1, ...), as runs of another numbering
    first = repo.claim_dispatch(study.id, done.to_dict(), done.key(), None, "dead:1", budget, number=100)
    repo.finish_trial(study.id, first.number, "completed", metrics={"tokens_per_s_per_gpu": 8000.0,
                      "step_time_s": 30.0, "peak_mem_gib": 60.0}, gpu_seconds=done_gpu_seconds)
    second = repo.claim_dispatch(study.id, stale.to_dict(), stale.key(), None, "dead:1", budget, number=101)
    long_ago = dt.datetime(2026, 1, 1)
    with repo.session() as s:
        row = s.query(TrialRow).filter(TrialRow.study_id == study.id, TrialRow.number == second.number).one()
        row.dispatched_at, row.heartbeat_at = long_ago, (long_ago + dt.timedelta(seconds=60)) if heartbeat else None
    return repo, study, second.number


def test_a_stopped_run_under_the_cap_runs_again_and_more_start_while_there_is_room(tmp_path):
    """Review: after a resume the stopped runs were counted in flight twice (a stale list of other controllers'
    runs held them too), and the study ended at 4 of 8 runs, 7.3 of its 9 GPU-hours, saying the cap was held.
    Runs in flight are now those with a live heartbeat: a released run is none."""
    repo, study, stale = _study_with_a_stale_run(tmp_path, "room", cap=9.0, budget=8, heartbeat=False)
    summary = build_controller(repo, repo.get_study("room"), dispatcher="inprocess", max_concurrent=4).run()
    assert repo.trial(study.id, stale).status == "completed" and repo.trial(study.id, stale).attempt == 2
    spent_h = repo.gpu_seconds_spent(study.id) / 3600
    assert summary.stop_reason == "gpu_hours" and spent_h >= 9.0 and summary.counts["dispatched"] > 3
    assert repo.get_study("room").status == "finished"
    repo.close()


def test_a_dead_controllers_run_is_not_run_again_past_the_cap(tmp_path):
    """Adopting a dead controller's run re-runs it: not once the cap is spent. It ends as a cancelled run with
    the time it held counted, and the study finishes (review: let go, it stayed `dispatched`; the controller
    hung on a study whose budget was dispatched, or left it interrupted with nothing able to run it)."""
    for budget in (4, 2):  # runs of the budget left to make, or none (the controller hung there)
        repo, study, stale = _study_with_a_stale_run(tmp_path, f"dead{budget}", cap=1.0, budget=budget)
        summary = build_controller(repo, repo.get_study(study.name), dispatcher="inprocess").run()
        trial = repo.trial(study.id, stale)
        assert (trial.status, trial.reason, trial.attempt) == ("pruned", "cancelled", 1)  # not run again
        assert "GPU-hour cap" in trial.message
        assert trial.gpu_seconds == 60 * 16  # from its dispatch to its last heartbeat, on 16 GPUs
        assert summary.counts["dispatched"] == 2 and summary.stop_reason == ("gpu_hours" if budget == 4 else "budget")
        assert repo.get_study(study.name).status == "finished"
        repo.close()


def test_a_dead_controllers_run_waits_while_others_in_flight_hold_the_room_under_the_cap(tmp_path):
    """The last note: the adopter checked the cap by the time spent alone, outside the study row's lock. It now
    counts the runs in flight as a new run's claim does: while another controller's run holds the last room, the
    dead run is left as it is (stale, counted by nobody), not run nor cancelled, and it runs once that room is
    back."""
    repo, study, stale = _study_with_a_stale_run(tmp_path, "wait", cap=2.0, budget=3)
    # spent 3,700 + held 960 < 7,200, but a live run counting at the ended runs' mean (3,700) fills it
    live = repo.claim_dispatch(study.id, {"ep": 4, "dist_opt": True}, "other-layout", None, "alive:1", 3, number=102)
    controller = build_controller(repo, repo.get_study("wait"), dispatcher="inprocess")
    before = repo.trial(study.id, stale)
    controller._adopt_stale()
    assert repo.trial(study.id, stale) == before  # nothing written
    # the board: not `running` (the last note), but a dead controller's run that the live one runs when there is room
    from autotune import leaderboard
    from autotune.storage import StudyStatus

    repo.set_study_status(study.id, StudyStatus.RUNNING)
    repo.controller_heartbeat(study.id, controller.controller_id)
    board = leaderboard.build(repo, repo.get_study("wait"), top=5)
    assert (board.summary["running"], board.summary["stopped"]) == (1, 1)  # the live run, the dead one
    assert [leaderboard.shown_status(r) for r in board.rows if r["trial"] == stale] == ["stopped"]
    assert "1 run(s) whose controller stopped: the study's controller runs them again" in \
        leaderboard.summary_line(board.summary)
    repo.finish_trial(study.id, live.number, "completed", metrics={"tokens_per_s_per_gpu": 7000.0, "step_time_s": 30.0,
                      "peak_mem_gib": 60.0}, gpu_seconds=100.0)
    controller.run()
    again = repo.trial(study.id, stale)
    assert (again.status, again.attempt) == ("completed", 2) and again.gpu_seconds > 960
    repo.close()


@contextlib.contextmanager
def _another_controller_heartbeating(repo, study_id, number, until):
    """Another controller, alive (heartbeating run `number` every 0.1 s, from a thread: not bound to the pace of the
    controller's loop) until `until(controller)` holds at one of the controller's loop passes (on_tick), when it dies.
    Yields the list that then gets the run's owner (the run must still be the other controller's then)."""
    import threading

    died, owner_then = threading.Event(), []

    def beat():
        while not died.wait(0.1):
            repo.heartbeat_trials(study_id, [number])

    def on_tick(controller):
        if until(controller) and not died.is_set():
            died.set()
            owner_then.append(repo.trial(study_id, number).controller_id)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield on_tick, owner_then
    finally:
        died.set()
        thread.join()


def test_a_controller_that_used_up_the_space_waits_to_adopt_a_dead_controllers_run(tmp_path, monkeypatch):
    """The last note: a controller with nothing left to propose left at once while another controller's run was in
    flight, and when that controller had died the study ended interrupted with its run `dispatched` for ever (only a
    controller still there adopts it). It now waits, as after the budget: the other controller heartbeats its run
    until this one has used up the space, then dies; the run is adopted once stale, run again, and the study ends."""
    import autotune.controller.loop as loop
    from autotune.config import LayoutConfig

    monkeypatch.setattr(loop, "HEARTBEAT_S", 0.5)  # stale after 1.5 s without a heartbeat
    fixes = {"tp": 1, "pp": 1, "vpp": 1, "cp": 1, "etp": 1, "mbs": 1, "recompute": "none", "dist_opt": True,
             "sp": False}
    repo = Repository.open(f"sqlite:///{tmp_path / 'x.db'}")
    space = load_space("qwen3_30b").fixed(fixes)
    study = create_study(repo, name="x", space=space, workload=make_workload(space, gpus=16), budget=40,
                         sampler="auto", backend="simulate", backend_options={"seconds_per_trial": 0.0}, seed=0)
    layout = LayoutConfig.from_mapping({**fixes, "ep": 8})
    dead = repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), None, "dead:1", 40, number=100)
    with _another_controller_heartbeating(repo, study.id, dead.number, lambda c: c._exhausted) as (tick, owner_then):
        controller = build_controller(repo, study, dispatcher="inprocess")
        controller.on_tick = tick
        summary = controller.run()
    assert owner_then == ["dead:1"], "the run was adopted before the space was used up: the test proves nothing"
    again = repo.trial(study.id, dead.number)
    assert (again.status, again.attempt, again.controller_id) == ("completed", 2, controller.controller_id)
    assert summary.stop_reason == "exhausted" and repo.get_study("x").status == "finished"
    repo.close()


def test_a_stale_validation_run_is_no_run_of_the_budget_on_the_board(tmp_path):
    """Review: the board's `stopped` counted a stale validation run, which counts["running"] leaves out, so `running`
    read -1 in a finished study, and `leaderboard --watch` (which waits for `running` 0) never ended."""
    import datetime as dt

    from autotune import leaderboard
    from autotune.storage import StudyStatus, TrialOrigin
    from autotune.storage.models import TrialRow

    repo, study, _ = _study_with_a_stale_run(tmp_path, "val", cap=1.0, budget=4)
    done = repo.trial(study.id, 100)
    with repo.session() as s:  # the dead controller's run is its validation run, not a run of the budget
        s.query(TrialRow).filter(TrialRow.study_id == study.id, TrialRow.number == 101).delete()
    validation = repo.claim_dispatch(study.id, done.config, done.config_key, None, "dead:1", 4,
                                     dispatch_key=f"{done.config_key}#validation", origin=TrialOrigin.VALIDATION,
                                     number=101)
    with repo.session() as s:
        s.query(TrialRow).filter(TrialRow.study_id == study.id, TrialRow.number == validation.number).update(
            {"heartbeat_at": dt.datetime(2026, 1, 1)})
    for status in (StudyStatus.FINISHED, StudyStatus.RUNNING):
        repo.set_study_status(study.id, status)
        board = leaderboard.build(repo, repo.get_study("val"), top=5)
        assert (board.summary["running"], board.summary["stopped"]) == (0, 0)  # not -1: the budget's runs only
        assert [r["stopped"] for r in board.rows if r["trial"] == validation.number] == [True]  # its row says it
    repo.close()


def test_only_another_controllers_run_that_ended_lately_keeps_a_controller_that_used_up_the_space():
    """Review: with nothing in flight for a moment, a controller that had used up the space left while another
    controller still ran the study (between its runs, proposing), writing `finished` onto it."""
    import datetime as dt
    from types import SimpleNamespace

    from autotune.controller._recovery import others_ended_lately
    from autotune.storage.models import utcnow

    now = utcnow()
    run = lambda who, ago_s: SimpleNamespace(controller_id=who, finished_at=now - dt.timedelta(seconds=ago_s))  # noqa: E731
    assert others_ended_lately([run("b:1", 2.0)], "a:1", 15.0)
    assert not others_ended_lately([run("b:1", 20.0), run("a:1", 1.0)], "a:1", 15.0)  # long ago; its own
    assert not others_ended_lately([SimpleNamespace(controller_id="b:1", finished_at=None)], "a:1", 15.0)
    aware = SimpleNamespace(controller_id="b:1", finished_at=(now - dt.timedelta(seconds=1)).replace(
        tzinfo=dt.timezone.utc).astimezone(dt.timezone(dt.timedelta(hours=5))))  # PostgreSQL may hand back an offset
    assert others_ended_lately([aware], "a:1", 15.0)


def test_an_imported_runs_hours_are_on_the_board_but_not_of_the_cap(tmp_path):
    """The last note: the live view's room under the cap subtracted the board's GPU-seconds, imported runs'
    included, while the cap counts the study's own runs (Repository.gpu_seconds_spent). The board now says both."""
    from autotune import leaderboard
    from autotune.config import LayoutConfig
    from autotune.storage.models import TrialRow

    repo, study = _q16(tmp_path, "imp", options={"max_gpu_hours": 2.0})
    own, other = (LayoutConfig.from_mapping(c) for c in ({"ep": 16, "dist_opt": True}, {"ep": 8, "dist_opt": True}))
    ran = repo.claim_dispatch(study.id, own.to_dict(), own.key(), None, "c:1", 4, number=100)
    metrics = {"tokens_per_s_per_gpu": 8000.0, "step_time_s": 30.0, "peak_mem_gib": 60.0}
    repo.finish_trial(study.id, ran.number, "completed", metrics=metrics, gpu_seconds=3600.0)
    imported = repo.add_imported(study.id, other.to_dict(), other.key(), 101, "completed", metrics, [30.0] * 5,
                                 "log.txt", number=101)
    with repo.session() as s:  # a log that said what its run held (no importer writes it today; a store may)
        s.query(TrialRow).filter(TrialRow.study_id == study.id, TrialRow.number == imported.number).one() \
            .gpu_seconds = 7200.0
    summary = leaderboard.build(repo, repo.get_study("imp"), top=5).summary
    assert summary["gpu_seconds"] == 10800.0
    assert summary["spent_gpu_seconds"] == 3600.0 == repo.gpu_seconds_spent(study.id)
    assert not summary["gpu_hour_cap_reached"]  # 1 of 2 GPU-hours: the imported 2 are not the study's
    repo.close()


def test_the_summary_line_counts_a_timeout_apart_from_failures(tmp_path):
    """Found by a new-user pass: a run past --trial-timeout read `timeout` on its row and `timeout: 1` in JSON,
    but `failed 1` on the table's footer."""
    from autotune import leaderboard
    from autotune.config import LayoutConfig

    repo, study = _q16(tmp_path, "to")
    layout = LayoutConfig.from_mapping({"ep": 16, "dist_opt": True})
    trial = repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), None, "c:1", 4)
    repo.finish_trial(study.id, trial.number, "timeout", metrics={}, message="ran past 5 s")
    line = leaderboard.summary_line(leaderboard.build(repo, repo.get_study("to"), top=5).summary)
    assert "| failed 0 | timeout 1 |" in line, line
    repo.close()
