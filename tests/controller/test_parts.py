"""The controller's parts on their own, without Ray: the verdict table, outcomes and what Optuna is
told, screening, study options, the slow-branch pruner, the search state, the Optuna adapter, and a
whole study on the in-process dispatcher in a process that never imports Ray."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

import pytest
from optuna.trial import TrialState

from autotune.backends import TrialOutcome, TrialStatus
from autotune.config import LayoutConfig
from autotune.controller import outcomes
from autotune.controller._optuna import OptunaStudy
from autotune.controller.options import DEFAULTS, StudyOptions
from autotune.controller.pruning import SlowBranchPruner
from autotune.controller.screening import Rejection, frontier_skips, screen
from autotune.controller.session import create_study
from autotune.controller.state import SearchState
from autotune.errors import ConfigError
from autotune.space import enumerate_legal, load_space, make_workload
from autotune.storage import Repository, TrialOrigin
from autotune.storage.models import StudyRow
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def qwen16():
    space = load_space("qwen3_30b")
    workload = make_workload(space, gpus=16)
    return space, workload, enumerate_legal(space, workload).configs


# --- the verdict table ----------------------------------------------------------------------------

@pytest.mark.parametrize("status, error, saw_steps, reason", [
    ("completed", None, True, None),
    ("oom", "CUDA out of memory", True, "out_of_memory"),
    ("pruned", None, True, "slow_branch"),
    ("pruned", None, False, "cancelled"),  # stopped before its first step: nothing was slow
    ("timeout", "ran past 60 s", True, "timeout"),
    ("failed", "exit code 1", True, "failed"),
    ("failed", "impossible result (mfu 3.2 > 1)", True, "invalid_result"),
    ("failed", "invalid result: step_time_s is a list", False, "invalid_result"),
    ("lost", "worker died", True, "lost"),
])
def test_verdict_table(status, error, saw_steps, reason):
    assert outcomes.verdict(status, error, saw_steps) == reason


def test_derive_metrics_fills_throughput_tflops_and_mfu_from_the_step_time(qwen16):
    _, workload, legal = qwen16
    config = legal[0]
    metrics = outcomes.derive_metrics(TrialOutcome(1, TrialStatus.COMPLETED, step_time_s=2.0, peak_mem_gib=50.0),
                                      workload, config)
    tokens = workload.global_batch_size * workload.seq_length / workload.cluster.gpus / 2.0
    assert metrics["tokens_per_s_per_gpu"] == pytest.approx(tokens)
    assert metrics["mfu"] == pytest.approx(metrics["tflops_per_gpu"] / workload.cluster.gpu.bf16_peak_tflops)


@pytest.mark.parametrize("changes, status", [
    ({"step_time_s": 20.0, "peak_mem_gib": 50.0}, TrialStatus.COMPLETED),
    ({"step_time_s": 1e-9, "peak_mem_gib": 50.0}, TrialStatus.FAILED),  # faster than the GPU's peak allows
    ({"step_time_s": 20.0, "peak_mem_gib": 1e6}, TrialStatus.FAILED),  # more memory than the GPU has
    ({"step_time_s": 20.0, "peak_mem_gib": -1.0}, TrialStatus.FAILED),
])
def test_checked_turns_impossible_numbers_into_a_failed_trial(qwen16, changes, status):
    _, workload, legal = qwen16
    outcome, metrics = outcomes.checked(TrialOutcome(1, TrialStatus.COMPLETED, **changes), workload, legal[0])
    assert outcome.status == status
    if status == TrialStatus.FAILED:
        assert outcome.error.startswith("impossible result") and all(v is None for v in metrics.values())
        assert outcomes.verdict(outcome.status.value, outcome.error, True) == "invalid_result"


@pytest.mark.parametrize("compute_s, kept", [(1e-300, False), (0.5, False), (8.0, True), (19.0, True)])
def test_a_trace_whose_compute_beats_the_gpus_peak_is_left_out_and_the_run_kept(qwen16, compute_s, kept):
    """Found by an adversarial pass: a launcher's breakdown with `compute: 1e-300` (an infinite TFLOP/s) was stored
    and pulled the calibration's compute and optimizer terms to their bounds. A compute time under half the step's
    model FLOPs at the GPU's peak is no measurement: the breakdown is left out, the run (its step time) kept."""
    from autotune.backends.validation import TRACE_COMPUTE_MIN_SHARE, _step_tflops, peak_tflops

    _, workload, legal = qwen16
    config = legal[0]
    floor_s = TRACE_COMPUTE_MIN_SHARE * _step_tflops(20.0, workload, config.tp) * 20.0 / peak_tflops(
        workload.cluster.gpu, workload.precision)
    assert 0.5 < floor_s < 8.0  # the cases sit either side of the floor for this workload at 20 s a step
    terms = {"compute": compute_s, "exposed_communication": 0.5}
    outcome, metrics = outcomes.checked(TrialOutcome(1, TrialStatus.COMPLETED, step_time_s=20.0, peak_mem_gib=50.0,
                                                     measured_terms_s=terms), workload, config)
    assert outcome.status == TrialStatus.COMPLETED and metrics["step_time_s"] == 20.0
    assert outcome.measured_terms_s == (terms if kept else {})


# --- what Optuna is told: one mapping, checked against a real Optuna storage -----------------------

@pytest.fixture
def optuna_study(tmp_path, qwen16):
    space, _, _ = qwen16
    return OptunaStudy(f"sqlite:///{tmp_path / 'o.db'}", "t", space, "auto", 0, create=True, backend="simulate")


@pytest.mark.parametrize("status, metrics, steps, state, constraint", [
    ("completed", {"tokens_per_s_per_gpu": 7000.0, "tflops_per_gpu": 180.0, "mfu": 0.18, "step_time_s": 37.4,
                   "peak_mem_gib": 60.0}, [], TrialState.COMPLETE, None),
    ("oom", {"peak_mem_gib": 90.0}, [], TrialState.PRUNED, "memory"),
    ("rejected", {}, [], TrialState.PRUNED, "legality"),
    ("pruned", {}, [3.0, 3.0, 3.0, 3.1, 3.2], TrialState.PRUNED, None),
    ("failed", {}, [], TrialState.FAIL, None),
    ("timeout", {}, [], TrialState.FAIL, None),
])
def test_tell_maps_each_status_to_one_optuna_state(optuna_study, qwen16, status, metrics, steps, state, constraint):
    _, workload, legal = qwen16
    number = optuna_study.ask(legal[0])
    outcomes.tell(optuna_study, number, status, metrics, "why", steps, workload, warmup_steps=3, reason="rule",
                  origin="study", strategy="explore")
    trial = optuna_study.study.trials[number]
    assert trial.state == state
    # what autotune recorded is there to read: the study's backend, the trial's origin, strategy and outcome
    assert {k: trial.user_attrs.get(k) for k in ("backend", "simulated", "origin", "strategy", "status", "reason")} \
        == {"backend": "simulate", "simulated": True, "origin": "study", "strategy": "explore", "status": status,
            "reason": "rule"}
    assert {k: v for k, v in trial.user_attrs.items() if k in metrics} == metrics
    assert ("message" in trial.user_attrs) == (status != "completed")  # a failure says why
    if state == TrialState.COMPLETE:
        assert trial.value == 7000.0
    if constraint == "memory":
        assert trial.system_attrs["constraints:memory"] == pytest.approx(90.0 - workload.cluster.gpu.memory_gib)
    elif constraint == "legality":
        assert trial.system_attrs["constraints:legality"] == 1.0
    if status == "pruned":  # the measured throughput of the steps after warm-up is its last report
        assert list(trial.intermediate_values.values())[-1] > 0
    # telling a finished trial again changes nothing (a resumed controller may repeat itself)
    outcomes.tell(optuna_study, number, "completed", {"tokens_per_s_per_gpu": 1.0}, None, [], workload, 3)
    assert optuna_study.study.trials[number].state == state
    assert optuna_study.study.trials[number].user_attrs["status"] == status


def test_a_trial_is_one_storage_transaction_to_start_and_one_to_end(optuna_study, qwen16):
    """The controller's overhead per trial: through Optuna's public storage API a trial's start takes
    three statements per parameter and its end one transaction per attribute; the adapter writes each
    in one transaction of a few statements."""
    from sqlalchemy import event

    from autotune.controller import _optuna
    from autotune.controller._optuna import config_of

    _, workload, legal = qwen16
    assert _optuna.ONE_TRANSACTION, "this Optuna lacks the RDB internals the adapter uses: see _optuna.py"
    optuna_study.ask(legal[0])  # the first trial a process creates goes through Optuna's own checks
    commits, statements = [], []
    event.listen(optuna_study.storage.engine, "commit", lambda _connection: commits.append(1))
    event.listen(optuna_study.storage.engine, "before_cursor_execute",
                 lambda _c, _cursor, sql, *_: statements.append(sql.split()[0]))
    number = optuna_study.ask(legal[1])
    assert len(commits) == 1 and len(statements) <= 5, statements  # lock, trial, parameters, number (+ BEGIN)
    frozen = optuna_study.study.trials[number]
    assert number == 1 and frozen.state == TrialState.RUNNING and config_of(frozen.params) == legal[1]
    # the layout knobs; performance knobs only on trials that set them (conditional parameters)
    assert frozen.distributions == {k: v for k, v in optuna_study.distributions.items() if k in frozen.params}
    assert set(frozen.params) >= {"tp", "pp", "recompute"}
    commits.clear()  # reading the trial above was a transaction of its own
    statements.clear()
    metrics = {"tokens_per_s_per_gpu": 7000.0, "tflops_per_gpu": 180.0, "mfu": 0.18, "step_time_s": 37.4,
               "peak_mem_gib": 60.0}
    outcomes.tell(optuna_study, number, "completed", metrics, None, [], workload, 3, origin="study", strategy="refine")
    assert len(commits) == 1 and len(statements) <= 7, statements  # lock, attributes (2), value, state
    assert len(optuna_study.study.trials[number].user_attrs) == 10  # backend, simulated, origin, ... 5 metrics


@pytest.mark.parametrize("status, metrics, steps", [
    ("completed", {"tokens_per_s_per_gpu": 7000.0, "peak_mem_gib": 60.0}, []),
    ("oom", {"peak_mem_gib": 90.0}, []),
    ("pruned", {}, [3.0, 3.0, 3.0, 3.1, 3.2]),
    ("failed", {}, []),
])
def test_without_optunas_internals_the_public_api_writes_the_same_trial(optuna_study, qwen16, monkeypatch,
                                                                        status, metrics, steps):
    from autotune.controller import _optuna

    _, workload, legal = qwen16
    optuna_study.ask(legal[1])  # the first trial a process creates goes through Optuna's own checks
    ended = []
    for one_transaction in (True, False):
        monkeypatch.setattr(_optuna, "ONE_TRANSACTION", one_transaction)
        number = optuna_study.ask(legal[0])
        outcomes.tell(optuna_study, number, status, metrics, "why", steps, workload, 3, reason="rule", origin="study")
        trial = optuna_study.study.trials[number]
        ended.append((trial.state, trial.value, trial.user_attrs, trial.system_attrs, trial.intermediate_values,
                      trial.params, trial.datetime_complete is not None))
    assert ended[0] == ended[1]


def test_the_optuna_adapter_fixes_a_layout_and_round_trips_its_parameters(optuna_study, qwen16):
    from autotune.controller._optuna import config_of

    _, _, legal = qwen16
    for config in legal[:: max(1, len(legal) // 25)]:
        number = optuna_study.ask(config)
        assert config_of(optuna_study.study.trials[number].params) == config
        assert optuna_study.study.trials[number].state == TrialState.RUNNING
    # a run that sets performance knobs has them as parameters; one that leaves them has none (conditional)
    space, _, _ = qwen16
    variant = legal[0].replace(cuda_graph="full_iteration", ep_overlap=True)
    number = optuna_study.ask(variant)
    params = optuna_study.study.trials[number].params
    assert (params["cuda_graph"], params["ep_overlap"]) == ("full_iteration", True)
    assert config_of(params, space.perf_domains) == variant
    number = optuna_study.ask(legal[0])
    plain = optuna_study.study.trials[number].params
    assert not set(plain) & set(space.perf_domains) and config_of(plain, space.perf_domains) == legal[0]
    imported = optuna_study.add_measured(legal[1], None, oom=True,
                                         attrs={"origin": "imported", "status": "oom", "log": "run.log"})
    frozen = optuna_study.study.trials[imported]
    assert frozen.state == TrialState.PRUNED and frozen.system_attrs["constraints:memory"] > 0
    assert frozen.user_attrs == {"backend": "simulate", "simulated": True, "origin": "imported", "status": "oom",
                                 "log": "run.log"}


def test_the_optuna_study_is_named_like_the_study_and_names_its_objective(tmp_path, qwen16):
    """Its name is the autotune study's; a study that autotune left from a start that failed half-way
    gives way, another tool's study of that name is refused and left as it was."""
    import optuna

    import time

    from autotune.controller._optuna import CREATED_KEY, ORPHAN_AGE_S, OWNER_KEY
    from autotune.errors import StudyError

    space, _, legal = qwen16
    url = f"sqlite:///{tmp_path / 'names.db'}"
    left = OptunaStudy(url, "mine", space, "auto", 0, create=True)  # left behind by a failed start ...
    left.ask(legal[0])
    # ... a moment ago: it may be another start of that name, half-way through creating its study
    with pytest.raises(StudyError, match="another `autotune start` creating it now"):
        OptunaStudy(url, "mine", space, "auto", 0, create=True)
    left.storage.set_study_system_attr(left.study_id, CREATED_KEY, time.time() - ORPHAN_AGE_S - 1)
    fresh = OptunaStudy(url, "mine", space, "auto", 0, create=True)  # an old leftover gives way
    loaded = optuna.load_study(study_name="mine", storage=url)
    assert loaded.metric_names == ["tokens_per_s_per_gpu"]
    assert loaded._storage.get_study_system_attrs(loaded._study_id)[OWNER_KEY] == "mine"
    assert loaded.trials == [] and fresh.study_id == loaded._study_id
    theirs = optuna.create_study(study_name="theirs", storage=url)
    theirs.enqueue_trial({"x": 1})
    with pytest.raises(StudyError, match="'theirs' that is not a leftover of a failed start"):
        OptunaStudy(url, "theirs", space, "auto", 0, create=True)
    assert len(optuna.load_study(study_name="theirs", storage=url).trials) == 1


# --- screening ----------------------------------------------------------------------------------

def test_screening_names_the_first_reason_a_layout_must_not_run(qwen16):
    space, workload, legal = qwen16
    state = SearchState.build(workload, legal)
    illegal = LayoutConfig(tp=3)
    rejection = screen(illegal, workload, space, state)
    assert isinstance(rejection, Rejection) and rejection.kind == "legality" and rejection.constraint >= 1
    fitting = int(max(range(len(legal)), key=lambda i: state.p_fit()[i]))
    assert screen(legal[fitting], workload, space, state) is None
    # a measured OOM puts every layout that needs at least as much memory behind the frontier
    heavy = max(range(len(legal)), key=lambda i: state.predicted.peak_mem_gib[i])
    source = legal[heavy]
    state.add_oom(source, trial_number=7)
    dominated = [c for i, c in enumerate(legal) if state.frontier_by[i] == 7 and c != source]
    if dominated:
        rejection = screen(dominated[0], workload, space, state)
        assert rejection.reason == "oom_frontier" and rejection.implied_by == 7 and rejection.kind == "memory"


def test_predicted_oom_is_rejected_only_when_it_surely_does_not_fit(qwen16):
    space, workload, legal = qwen16
    state = SearchState.build(workload, legal)
    p_fit = state.p_fit()
    sure_oom = [i for i in range(len(legal)) if p_fit[i] < 0.05]
    assert sure_oom, "the qwen3_30b space on 16 GPUs has layouts that cannot fit"
    rejection = screen(legal[sure_oom[0]], workload, space, state)
    assert rejection.reason == "predicted_oom" and rejection.constraint > 0


def test_frontier_skips_record_only_untried_layouts_the_prior_ranked_higher(qwen16):
    _, workload, legal = qwen16
    state = SearchState.build(workload, legal)
    heavy = max(range(len(legal)), key=lambda i: state.predicted.peak_mem_gib[i])
    state.add_oom(legal[heavy], trial_number=3)
    chosen = min(range(len(legal)), key=lambda i: state.log_prior[i])  # the prior's last choice
    rows = frontier_skips(state, legal[chosen], "refine")
    assert all(r["reason"] == "oom_frontier" and r["implied_by_trial"] == 3 for r in rows)
    assert all(state.tried[state.index[r["config_key"]]] for r in rows)
    assert frontier_skips(state, legal[chosen], "refine") == []  # recorded once


# --- options --------------------------------------------------------------------------------------

def test_study_options_hold_every_default_once_and_read_old_studies():
    assert StudyOptions.from_stored({}) == DEFAULTS
    stored = StudyOptions.from_stored({"warmup_steps": 1, "retired_option": 5, "memory_headroom_gib": None})
    assert stored.warmup_steps == 1 and stored.memory_headroom_gib is None and stored.measured_steps == 5
    with pytest.raises(ConfigError, match="finite"):
        StudyOptions(slow_margin=math.nan).to_stored()


def test_create_study_refuses_an_unknown_option_before_writing(tmp_path, qwen16):
    space, workload, _ = qwen16
    repo = Repository.open(f"sqlite:///{tmp_path / 'x.db'}")
    with pytest.raises(ConfigError, match="unknown study option"):
        create_study(repo, name="x", space=space, workload=workload, budget=2, sampler="auto", backend="simulate",
                     backend_options={}, seed=0, options={"warmup_stepz": 2})
    assert repo.list_studies() == []
    repo.close()


# --- pruning --------------------------------------------------------------------------------------

@pytest.mark.parametrize("steps, best, expected", [
    ([9.0, 9.0, 9.0, 2.0], 1.0, False),  # one measured step after warm-up: too early to judge
    ([9.0, 9.0, 9.0, 2.0, 2.0], 1.0, True),  # twice the best: cannot win
    ([9.0, 9.0, 9.0, 1.2, 1.2], 1.0, False),  # within the 25% margin
    ([9.0, 9.0, 9.0, 2.0, 2.0], None, False),  # nothing completed yet to compare with
])
def test_slow_branch_pruner(steps, best, expected):
    assert SlowBranchPruner(warmup_steps=3).should_prune(steps, best) is expected
    assert SlowBranchPruner(warmup_steps=3, enabled=False).should_prune(steps, best) is False


# --- the search state -----------------------------------------------------------------------------

def test_state_marks_tried_layouts_and_learns_memory_from_a_measurement(qwen16):
    _, workload, legal = qwen16
    state = SearchState.build(workload, legal)
    state.mark_tried(legal[0].key())
    state.mark_tried("not-a-layout")  # a layout outside the legal set changes nothing
    assert state.tried.sum() == 1 and state.tried[0]
    i = 5
    before = state.predicted_peak_gib(i)
    state.record_memory(legal[i], before * 1.2, oom=False)
    assert state.predicted_peak_gib(i) > before
    state.record_speed(legal[i], 5000.0)
    assert state.n_runs == 1 and i in state.measured_means()


# --- a whole study on the in-process dispatcher, in a process that never imports Ray ---------------

def test_a_study_runs_on_the_in_process_dispatcher_without_ray(tmp_path):
    code = f"""
import sys
from autotune.controller.session import build_controller, create_study
from autotune.space import load_space, make_workload
from autotune.storage import Repository
space = load_space("qwen3_30b"); workload = make_workload(space, gpus=16)
repo = Repository.open("sqlite:///{tmp_path / 'inproc.db'}")
study = create_study(repo, name="s", space=space, workload=workload, budget=6, sampler="auto",
                     backend="simulate", backend_options={{"seconds_per_trial": 0.0}}, seed=1)
summary = build_controller(repo, study, dispatcher="inprocess").run()
print(summary.counts["dispatched"], summary.best is not None, "ray" in sys.modules)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["6", "True", "False"]


def test_readers_of_a_finished_study_find_its_pooling_stored_and_import_no_scikit_learn(tmp_path, qwen16, monkeypatch,
                                                                                          capsys):
    """The pooled recommendation's GP imports scikit-learn (~2.5 s of a 3.6 s `autotune status`): the
    controller stores the pooling with the study, and `status`, `leaderboard`, `show` and `export` read it.
    A run added later (an imported log) makes it stale: the reader pools afresh and says the same."""
    from autotune.controller.session import build_controller

    space, workload, _ = qwen16
    url = f"sqlite:///{tmp_path / 'cached.db'}"
    repo = Repository.open(url)
    study = create_study(repo, name="c", space=space, workload=workload, budget=6, sampler="auto",
                         backend="simulate", backend_options={"seconds_per_trial": 0.0, "run_noise": 0.05}, seed=2)
    summary = build_controller(repo, study, dispatcher="inprocess").run()
    cache = repo.get_study("c").pooled_cache
    assert len(cache["key"]) == 64 and len(cache["estimates"]) >= 3
    code = """
import contextlib, io, sys
from autotune.cli import main
for argv in (["status", "--json"], ["leaderboard", "c", "--format", "json"], ["show", "c", "0", "--json"],
             ["export", "c", "--format", "yaml"]):
    with contextlib.redirect_stdout(io.StringIO()):
        assert main([*argv, "--storage", sys.argv[1]]) == 0, argv
print("sklearn" in sys.modules, "alembic" in sys.modules)  # nor Alembic: the store is at this code's revision
"""
    read = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=240)
    assert read.returncode == 0, read.stderr[-2000:]
    assert read.stdout.split() == ["False", "False"]
    board = json.loads(run_cli("leaderboard", "c", "--format", "json", "--storage", url).stdout)
    assert board["summary"]["best_trial"] == summary.best.number
    from sqlalchemy import update

    with repo.session() as s:  # a cache of other runs (as after an import-log): pooled afresh, the same answer
        s.execute(update(StudyRow).where(StudyRow.name == "c").values(pooled_cache={**cache, "key": "0" * 64}))
    read = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=240)
    assert read.returncode == 0 and read.stdout.split() == ["True", "False"], read.stderr[-2000:]
    assert json.loads(run_cli("leaderboard", "c", "--format", "json", "--storage", url).stdout)["summary"]["best_trial"] \
        == summary.best.number
    # a real import-log pools the study's runs again and stores them: its readers import no scikit-learn
    best = LayoutConfig.from_mapping(summary.best.config)
    log = tmp_path / "by-hand.log"
    log.write_text("".join(f" iteration {i}/10 | consumed samples: {i} | elapsed time per iteration (ms): "
                           f"{1000 * summary.best.step_time_s * (1.3 if i == 1 else 1.0):.1f} |\n" for i in range(1, 6)))
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in best.to_dict().items() if not isinstance(v, bool) and v is not None]
    flags += [f"--{'' if v else 'no-'}{k.replace('_', '-')}" for k, v in best.to_dict().items() if isinstance(v, bool)]
    imported = run_cli("import-log", "--study", "c", str(log), *flags, "--storage", url)
    assert imported.returncode == 0, imported.stderr
    stored = repo.get_study("c").pooled_cache
    assert stored["key"] != cache["key"] and stored["key"] != "0" * 64
    read = subprocess.run([sys.executable, "-c", code, url], capture_output=True, text=True, timeout=240)
    assert read.returncode == 0 and read.stdout.split() == ["False", "False"], read.stderr[-2000:]
    # a refresh that fails (here the pooling itself) is only a cache: the import stands and says so
    import autotune.controller.recommend as rec
    from autotune.cli import main

    from autotune.megatron.logparse import parse_log

    def broken(_trials):
        raise RuntimeError("the GP could not be fitted")

    before = len(repo.trials(study.id))
    monkeypatch.setattr(rec, "pooled_cache_entry", broken)
    another = tmp_path / "another-run.log"  # another run's log: the same log again is refused as held already
    another.write_text(log.read_text().replace(f"(ms): {1000 * summary.best.step_time_s:.1f} |\n",
                                               f"(ms): {1000 * summary.best.step_time_s + 7:.1f} |\n"))
    assert parse_log(another.read_text()).iterations != parse_log(log.read_text()).iterations
    assert main(["import-log", "--study", "c", str(another), *flags, "--storage", url]) == 0
    assert len(repo.trials(study.id)) == before + 1
    assert "imported as trial" in capsys.readouterr().out
    repo.close()


@pytest.mark.parametrize("backend, status, stored", [("simulate", "finished", True), ("simulate", "running", False),
                                                     ("replay", "finished", False)])
def test_import_log_refreshes_the_stored_pooling_only_of_a_study_no_controller_will(tmp_path, backend, status, stored):
    """After an import the stored pooling is refreshed for a finished study; a running study's controller
    stores its own at its end, and a backend whose runs repeat exactly pools nothing."""
    from autotune.controller.imports import refresh_pooled_cache

    repo = Repository.open(f"sqlite:///{tmp_path / 'refresh.db'}")
    study = repo.create_study(name="r", model="qwen3_30b",
                              workload={"gpus": 16, "gpus_per_node": 8, "gpu": "h100", "global_batch_size": 1024,
                                        "seq_length": 4096, "precision": "bf16"},
                              space={"domains": {}}, budget=4, sampler="auto", backend=backend, backend_options={},
                              options={}, optuna_study_name="autotune:r", status=status)
    for config, speed in (({"ep": 16, "dist_opt": True}, 7400.0), ({"ep": 8, "dist_opt": True, "mbs": 2}, 7900.0),
                          ({"ep": 4, "dist_opt": True}, 7600.0)):
        layout = LayoutConfig.from_mapping(config)
        trial = repo.claim_dispatch(study.id, layout.to_dict(), layout.key(), None, "c", 4,
                                    predicted={"tokens_per_s_per_gpu": 7000.0})
        repo.finish_trial(study.id, trial.number, "completed", gpu_seconds=1.0,
                          metrics={"tokens_per_s_per_gpu": speed, "peak_mem_gib": 60.0})
    refresh_pooled_cache(repo, repo.get_study("r"))
    cache = repo.get_study("r").pooled_cache
    assert (cache is not None and len(cache["key"]) == 64) == stored
    repo.close()


def _validated_study(tmp_path, qwen16, name: str, budget: int, run_noise: float, seed: int):
    """(repo, study, summary) of a simulated study run to its end with 12-step validation runs."""
    from autotune.controller.session import build_controller

    space, workload, _ = qwen16
    repo = Repository.open(f"sqlite:///{tmp_path / f'{name}.db'}")
    study = create_study(repo, name=name, space=space, workload=workload, budget=budget, sampler="auto",
                         backend="simulate", backend_options={"seconds_per_trial": 0.0, "run_noise": run_noise},
                         seed=seed, options={"validate_steps": 12})
    return repo, study, build_controller(repo, study, dispatcher="inprocess").run()


def test_validate_steps_runs_the_winner_again_outside_the_budget(tmp_path, qwen16):
    from autotune.controller.recommend import layout_results

    repo, study, summary = _validated_study(tmp_path, qwen16, "v", budget=5, run_noise=0.05, seed=3)
    trials = repo.trials(study.id, dispatched_only=True)
    validation = [t for t in trials if t.origin == "validation"]
    assert summary.counts["dispatched"] == 5 and 1 <= summary.counts["validation"] == len(validation) <= 2
    # the recommendation is a validated layout (of two validated contenders, the faster validation wins)
    assert summary.recommendation.trial.config_key in {t.config_key for t in validation}
    assert all(len(t.step_times_s) == DEFAULTS.warmup_steps + 12 for t in validation)
    assert {r.trial.config_key for r in layout_results(trials, validation=True)} == {t.config_key for t in validation}
    # reported apart: the summary names each validated layout with its validation mean and screening figure
    from autotune import leaderboard

    entries = leaderboard.build(repo, repo.get_study("v")).summary["validation_runs"]
    assert entries[0]["recommended"] and entries[0]["config"] == summary.recommendation.trial.config
    assert sorted(n for e in entries for n in e["trials"]) == sorted(t.number for t in validation)
    assert all(e["measured_steps"] == 12 and e["screening_tokens_per_s_per_gpu"] > 0 for e in entries)
    by_key = {LayoutConfig.from_mapping(e["config"]).key(): e for e in entries}
    for t in validation:
        assert by_key[t.config_key]["tokens_per_s_per_gpu"] == pytest.approx(t.tokens_per_s_per_gpu)
    # `show` of a screening run of a validated layout names its validation runs (it did not)
    screening = next(t for t in trials if t.origin != "validation" and t.config_key == validation[0].config_key)
    view = leaderboard.trial_view(repo, repo.get_study("v"), screening)
    same = sorted(t.number for t in validation if t.config_key == screening.config_key)
    assert [r["trial"] for r in view["layout_validation_runs"]] == same
    assert "validated in longer runs (--validate-steps, reported apart from the screening runs): trial" \
        in leaderboard.layout_runs_text(view)
    assert leaderboard.trial_view(repo, repo.get_study("v"), validation[0])["layout_validation_runs"] == []
    repo.close()


@pytest.mark.parametrize("out_of_memory", [2, 99])
def test_a_validation_run_out_of_memory_moves_the_recommendation_to_a_layout_validated_in_turn(
        tmp_path, qwen16, monkeypatch, out_of_memory):
    """Found by review: when the winner's longer validation run ran out of memory, the study recommended another
    layout that no validation ran (the choices were made once, before any validation run). The layout recommended
    then is validated in another round; the rounds stop once VALIDATION_ROUNDS validation runs ran out of memory
    (counted from the store). Here the first two validation runs run out of memory (the first round's one or two,
    and the next round's if the first had one), or every one."""
    from autotune.backends.simulate import SimulateBackend
    from autotune.controller.loop import VALIDATION_ROUNDS

    real = SimulateBackend.run
    oomed: list[str] = []

    def validation_runs_out_of_memory(self, spec, report, cancelled):
        if spec.measured_steps == 12 and len(oomed) < out_of_memory:  # validation runs only (screening: 5 steps)
            oomed.append(LayoutConfig.from_mapping(spec.config).key())
            return TrialOutcome(spec.trial, TrialStatus.OOM, peak_mem_gib=81.0, error="CUDA out of memory")
        return real(self, spec, report, cancelled)

    monkeypatch.setattr(SimulateBackend, "run", validation_runs_out_of_memory)
    repo, study, summary = _validated_study(tmp_path, qwen16, "r", budget=6, run_noise=0.0, seed=5)
    validation = [t for t in repo.trials(study.id, dispatched_only=True) if t.origin == "validation"]
    recommended = summary.recommendation.trial.config_key
    if out_of_memory == 2:
        assert len(oomed) == 2 and [t.status for t in validation][:2] == ["oom", "oom"]
        # the layout recommended now was validated too, and completed
        assert [t.status for t in validation if t.config_key == recommended] == ["completed"]
    else:  # every validation runs out of memory: the rounds stop, the recommendation left unvalidated
        assert VALIDATION_ROUNDS <= len(oomed) <= VALIDATION_ROUNDS + 1
        assert all(t.status == "oom" for t in validation) and recommended not in {t.config_key for t in validation}
    repo.close()


def test_a_validation_run_gets_a_timeout_for_its_steps(tmp_path, qwen16):
    """Found by review: a validation run had the screening's timeout whatever --validate-steps asked for, so a
    long validation of a slow step could only end as `timeout`. Its steps are allowed three times the layout's
    slowest screening step beyond the screening's timeout (second review: scaling the whole timeout by the steps
    gave 1,000 steps 125 hours, for a hang to hold the cluster); without a screening step, that scaling."""
    from autotune.controller._spec import VALIDATION_STEP_SLACK, trial_spec, validation_timeout_s
    from autotune.controller.session import build_controller

    space, workload, _ = qwen16
    options = StudyOptions(trial_timeout_s=600.0, warmup_steps=3, measured_steps=5, validate_steps=100)
    assert validation_timeout_s(options, 20.0) == pytest.approx(600.0 + 103 * VALIDATION_STEP_SLACK * 20.0)
    assert validation_timeout_s(options) == pytest.approx(600.0 * 103 / 8)
    # never shorter than a screening run's, however few steps are asked for
    assert validation_timeout_s(dataclasses.replace(options, validate_steps=2)) == 600.0
    assert validation_timeout_s(dataclasses.replace(options, validate_steps=2), 1e-3) > 600.0
    study = create_study(Repository.open(f"sqlite:///{tmp_path / 't.db'}"), name="t", space=space, workload=workload,
                         budget=4, sampler="auto", backend="simulate", backend_options={}, seed=0)
    config = LayoutConfig.from_mapping(space.model.defaults.layout)
    screening = trial_spec(study, space, workload, options, 1, 1, config)
    validation = trial_spec(study, space, workload, options, 2, 1, config, validation=True, screening_step_s=20.0)
    assert (screening.measured_steps, screening.timeout_s) == (5, 600.0)
    assert (validation.measured_steps, validation.timeout_s) == (100, pytest.approx(6780.0))
    # a study's validation runs get it from their layout's slowest screening run
    specs = []
    repo, study, summary = _validated_study(tmp_path, qwen16, "v", budget=5, run_noise=0.05, seed=3)
    controller = build_controller(repo, study, dispatcher="inprocess")
    trials = repo.trials(study.id, dispatched_only=True)
    for trial in (t for t in trials if t.origin == "validation"):
        slowest = max(t.step_time_s for t in trials if t.config_key == trial.config_key and t.origin == "study")
        specs.append(controller._spec(trial, LayoutConfig.from_mapping(trial.config)))
        assert specs[-1].timeout_s == pytest.approx(validation_timeout_s(controller.options, slowest))
        assert specs[-1].measured_steps == 12
    assert specs
    repo.close()


@pytest.mark.parametrize("other", ["dead", "alive"])
def test_another_controllers_validation_run_is_waited_for_and_a_dead_ones_run_again(tmp_path, qwen16, other):
    """Found by review: a controller finished the study without waiting for another controller's validation
    run, so a validation run whose controller died stayed `dispatched` in a study marked finished. Here another
    controller's validation run appears the moment this controller's screening ends: a dead controller's (its
    heartbeat long stale) is adopted and run again with the validation's steps; a live one's is waited for until
    that controller records it (a few ticks later). Then this controller's own validation round runs."""
    import datetime as dt

    from sqlalchemy import update

    from autotune.controller.session import build_controller
    from autotune.storage.models import TrialRow

    space, workload, _ = qwen16
    repo = Repository.open(f"sqlite:///{tmp_path / 'other.db'}")
    study = create_study(repo, name="other", space=space, workload=workload, budget=4, sampler="auto",
                         backend="simulate", backend_options={"seconds_per_trial": 0.0, "run_noise": 0.0},
                         seed=2, options={"validate_steps": 12})
    left: list[int] = []
    ticks_waited = [0]

    def other_controllers_validation_run(controller) -> None:
        if left:  # the live controller records its run on the third tick after it began
            trial = repo.trial(study.id, left[0])
            if other == "alive" and trial.status == "dispatched":
                ticks_waited[0] += 1
                repo.heartbeat_trials(study.id, left)
                if ticks_waited[0] == 3:
                    repo.finish_trial(study.id, left[0], "completed", metrics={
                        "step_time_s": 20.0, "tokens_per_s_per_gpu": 1000.0, "peak_mem_gib": 50.0},
                        step_times_s=[20.0] * (DEFAULTS.warmup_steps + 12))
            return
        if controller.running or repo.counts(study.id)["dispatched"] < study.budget:
            return
        # the slowest layout, so that the study's own round validates another (the recommendation)
        done = min((t for t in repo.trials(study.id, dispatched_only=True) if t.status == "completed"),
                   key=lambda t: t.tokens_per_s_per_gpu)
        number = controller.optuna.ask(LayoutConfig.from_mapping(done.config))  # as the other controller asked
        trial = repo.claim_dispatch(study.id, done.config, done.config_key, number, f"{other}-controller",
                                    study.budget, dispatch_key=f"{done.config_key}#validation",
                                    origin=TrialOrigin.VALIDATION, number=number)
        if other == "dead":
            with repo.session() as s:  # its controller stopped heartbeating long ago
                s.execute(update(TrialRow).where(TrialRow.study_id == study.id, TrialRow.number == trial.number)
                          .values(heartbeat_at=dt.datetime(2020, 1, 1)))
        left.append(trial.number)

    summary = build_controller(repo, study, dispatcher="inprocess", on_tick=other_controllers_validation_run).run()
    assert left, "the screening never ended"
    theirs = repo.trial(study.id, left[0])
    assert theirs.status == "completed" and len(theirs.step_times_s) == DEFAULTS.warmup_steps + 12
    # a dead controller's run goes again (a second attempt, here); a live one's is left to it
    assert theirs.attempt == (2 if other == "dead" else 1)
    assert (theirs.controller_id == "alive-controller") == (other == "alive") and theirs.controller_id != "dead-controller"
    assert ticks_waited[0] == (3 if other == "alive" else 0)
    trials = repo.trials(study.id, dispatched_only=True)
    assert not [t for t in trials if t.status == "dispatched"]
    assert repo.get_study("other").status == "finished"
    # and the study's own validation round ran after it, on what the store then held (its own runs, first attempts)
    own = [t for t in trials if t.origin == "validation" and t.number != left[0]]
    assert own and all(t.attempt == 1 and t.controller_id not in ("dead-controller", "alive-controller") for t in own)
    assert summary.recommendation.trial.config_key in {t.config_key for t in trials if t.origin == "validation"}
    repo.close()


def test_two_slots_freed_at_once_never_run_the_same_remeasurement_twice(tmp_path, qwen16):
    """In the budget's last share the strategy names a close contender to measure again; it counts runs
    only when they end. With two slots free at once it named the same run twice, the second was refused
    as a duplicate 2000 times and the study ended a trial short ("exhausted"). The second slot now waits."""
    from autotune.controller.session import build_controller
    from autotune.dispatch._inprocess import InProcessDispatcher

    class TwoSlots(InProcessDispatcher):
        """Two trials at a time, both ending at the next poll (two slots free at once)."""

        capacity = 2

        def __init__(self, *args) -> None:
            super().__init__(*args)
            self._held = []

        def free_slots(self) -> int:
            return 2 - len(self._held)

        def submit(self, spec) -> None:
            super().submit(spec)
            self._held.append(self._done.pop()[-1])  # (simulated end, submission number, event): the event

        def poll(self, timeout_s: float = 0.0):
            done, self._held = self._held, []
            return done

    space, workload, _ = qwen16
    repo = Repository.open(f"sqlite:///{tmp_path / 'two.db'}")
    study = create_study(repo, name="two", space=space, workload=workload, budget=10, sampler="auto",
                         backend="simulate", backend_options={"seconds_per_trial": 0.0, "run_noise": 0.05}, seed=0,
                         options={"knob_share": 0.0})  # the layout search alone: its last share remeasures
    summary = build_controller(repo, study, dispatcher=TwoSlots("simulate", study.backend_options)).run()
    trials = repo.trials(study.id)
    assert summary.stop_reason == "budget" and summary.counts["dispatched"] == 10
    # both slots free at dispatch 8, the first contender always runs again: the re-measurement takes the first
    # slot (the second waits for it); whether the last run is a second re-measurement or a new layout is the
    # knowledge-gradient rule's call (test_search.py), not this test's
    notes = [t.strategy_note for t in trials if t.dispatched]  # trials() is in trial-number order
    assert notes[8] == "remeasure"
    assert not [t for t in trials if t.reason == "duplicate"]
    repo.close()


@pytest.mark.parametrize("precision,gpu", [("fp8", "h100"), ("nvfp4", "gb300")])
def test_a_launchers_own_flop_convention_is_kept_or_replaced_never_refused(precision, gpu):
    """Launchers count FLOPs their own way (6 x active parameters x tokens leaves attention out; an MFU may be
    against the precision's peak). Within 2x of this package's count the reported figures stay; beyond, they
    are replaced by it, and the run is never failed for it (found by the second review: long-context runs
    counted by 6ND were refused whole)."""
    space = load_space("qwen3_30b")
    w = make_workload(space, gpus=16, gpu=gpu, precision=precision, seq_length=32768)
    config = LayoutConfig.from_mapping(space.model.defaults.layout)
    peak = w.cluster.gpu.peak_tflops[precision]
    at_30_s = outcomes.derive_metrics(TrialOutcome(0, TrialStatus.COMPLETED, step_time_s=30.0), w, config)
    step = 30.0 * at_30_s["tflops_per_gpu"] / (0.3 * peak)  # a step at 30% of the precision's peak
    ours = outcomes.derive_metrics(TrialOutcome(0, TrialStatus.COMPLETED, step_time_s=step), w, config)
    tflops = ours["tflops_per_gpu"]
    kept = outcomes.derive_metrics(TrialOutcome(0, TrialStatus.COMPLETED, step_time_s=step,
                                                tflops_per_gpu=0.8 * tflops, mfu=0.8 * tflops / peak), w, config)
    assert kept["tflops_per_gpu"] == 0.8 * tflops and kept["mfu"] == 0.8 * tflops / peak  # against its precision
    six_nd = outcomes.derive_metrics(TrialOutcome(0, TrialStatus.COMPLETED, step_time_s=step,
                                                  tflops_per_gpu=0.3 * tflops, mfu=0.3 * tflops / peak), w, config)
    assert six_nd["tflops_per_gpu"] == tflops and six_nd["mfu"] == ours["mfu"]
    outcome, metrics = outcomes.checked(TrialOutcome(0, TrialStatus.COMPLETED, step_time_s=step,
                                                     tflops_per_gpu=0.3 * tflops), w, config)
    assert outcome.status == TrialStatus.COMPLETED and metrics["tflops_per_gpu"] == tflops


def test_ctrl_c_before_the_first_run_leaves_the_study_interrupted_not_created(tmp_path, qwen16, monkeypatch):
    """Found by an adversarial pass: Ctrl-C while the controller was being built (the legal set, Ray) left the
    study `created`, as if nobody had started it; it is `interrupted` now (and resume continues both alike)."""
    from autotune.cli import main
    from autotune.controller import session

    space, workload, _ = qwen16
    url = f"sqlite:///{tmp_path / 'c.db'}"
    repo = Repository.open(url)
    create_study(repo, name="c", space=space, workload=workload, budget=3, sampler="auto", backend="simulate",
                 backend_options={"seconds_per_trial": 0.0}, seed=0)
    assert repo.get_study("c").status == "created"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(session, "build_controller", interrupted)
    assert main(["resume", "c", "--storage", url]) == 130
    assert repo.get_study("c").status == "interrupted" and repo.counts(repo.get_study("c").id)["dispatched"] == 0
    repo.close()


def test_a_log_is_an_oom_by_an_allocators_message_and_not_after_its_last_iteration():
    """An adversarial pass: `INFO: training finished; no out of memory errors were observed` after ten of ten
    iterations made import-log store an OOM. The words alone are no failed allocation; and after a log's last
    iteration the measurement is whole, whatever a line says then."""
    from autotune.megatron.logparse import classify_failure, parse_log

    def iterations(last: int, of: int = 10) -> str:
        return "".join(f" [2026-11-30 10:00:00] iteration {i:>8}/{of:>8} | consumed samples: {i * 1024} | "
                       "elapsed time per iteration (ms): 30000.0 | learning rate: 1.0E-05 |\n" for i in range(1, last + 1))

    assert parse_log(iterations(10) + "INFO: training finished; no out of memory errors were observed\n").failure is None
    assert parse_log(iterations(10) + "torch.OutOfMemoryError: CUDA out of memory (saving a checkpoint)\n").failure \
        is None  # after the last iteration: the run's steps were all measured
    assert parse_log(iterations(5) + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB\n").failure \
        == "oom"
    for text in ("RuntimeError: CUDA error: out of memory", "NCCL WARN Cuda failure 2 'out of memory'",
                 "CUDA Error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "cudaErrorMemoryAllocation",
                 # Transformer Engine's cuBLAS and cuDNN checks print the status string, not the enum name
                 "RuntimeError: /opt/te/common/gemm/cublaslt_gemm.cu:412 in function cublas_gemm: cuBLAS Error: "
                 "the resource allocation failed",
                 "cuDNN Error: CUDNN_STATUS_ALLOC_FAILED", "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED"):
        assert classify_failure(text) == "oom", text
    # a host allocation is not the GPU's memory
    assert classify_failure("cuDNN Error: CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED") == "crash"
    assert classify_failure("set expandable_segments:True to avoid out of memory errors") == "crash"
