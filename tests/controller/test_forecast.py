"""The cost forecast `start`, `resume` and `--dry-run` print before the first run (controller/forecast.py),
checked against what the simulate and replay backends charge for the same runs."""

from __future__ import annotations

import threading

import pytest

from autotune.backends.base import TrialSpec
from autotune.backends.replay import ReplayBackend
from autotune.backends.simulate import SimulateBackend
from autotune.config import LayoutConfig
from autotune._tables import duration
from autotune.controller.forecast import ASSUMED_STARTUP_S, forecast
from autotune.controller.options import StudyOptions
from autotune.controller.session import recipe_baseline
from autotune.controller.state import SearchState
from autotune.errors import ConfigError
from autotune.space import enumerate_legal, load_space, make_workload


def _state(space, workload) -> SearchState:
    return SearchState.build(workload, enumerate_legal(space, workload).configs)


@pytest.fixture(scope="module")
def qwen16():
    space = load_space("qwen3_30b")
    workload = make_workload(space, gpus=16)
    return space, workload, _state(space, workload)


def _simulated_run(workload, layout: LayoutConfig, warmup: int, measured: int, timeout_s: float = 3600.0) -> float:
    spec = TrialSpec(study="f", trial=0, model=workload.model.name, gpus=workload.cluster.gpus, gpus_per_node=8,
                     gpu="h100", global_batch_size=workload.global_batch_size, seq_length=workload.seq_length,
                     precision="bf16", config=layout.to_dict(), overrides=[], warmup_steps=warmup,
                     measured_steps=measured, timeout_s=timeout_s)
    backend = SimulateBackend({"noise": 0.0, "seconds_per_trial": 0.0})
    return backend.run(spec, lambda _: None, threading.Event()).wall_time_s


@pytest.mark.parametrize("warmup, measured", [(3, 5), (0, 5), (1, 1)])
def test_a_simulated_runs_forecast_is_what_the_backend_charges_for_the_recipes_layout(qwen16, warmup, measured):
    """The forecast prices the study's first run, the recipe's layout: a noiseless simulated run of it holds its
    GPUs exactly that long (warm-up 0 included: its first measured step is the slow one; review found the forecast
    20% short there)."""
    space, workload, state = qwen16
    options = StudyOptions(warmup_steps=warmup, measured_steps=measured)
    predicted = forecast(state, recipe_baseline(space), 40, options, SimulateBackend, {})
    assert predicted.layout == recipe_baseline(space).short() and "the recipe's layout" in predicted.priced
    assert predicted.run_s == pytest.approx(_simulated_run(workload, recipe_baseline(space), warmup, measured))
    assert predicted.gpu_hours == pytest.approx(40 * predicted.run_s * 16 / 3600)
    assert predicted.bound_gpu_hours == pytest.approx(40 * 3600 * 16 / 3600)
    assert not predicted.startup_assumed and not predicted.over_timeout and predicted.open_layouts is None


def test_a_run_over_the_timeout_is_capped_and_warned_of(qwen16):
    """Review: `--trial-timeout 60` forecast 5.5 GPU-hours "at most 0.8", and every run then timed out unwarned."""
    space, _, state = qwen16
    predicted = forecast(state, recipe_baseline(space), 3, StudyOptions(trial_timeout_s=60.0), SimulateBackend, {})
    assert predicted.over_timeout and predicted.run_s == 60.0
    assert predicted.gpu_hours <= predicted.bound_gpu_hours == pytest.approx(3 * 60 * 16 / 3600)
    line = predicted.line(1, "simulated")
    assert "over the 60 s --trial-timeout: most runs will time out" in line


def test_validation_runs_are_priced_at_their_steps_and_bounded_by_their_own_timeout(qwen16):
    """Review: with --validate-steps 1000 the forecast said 294 GPU-hours "at most 96" (the bound took the
    screening timeout for the validation runs, whose timeout is longer: controller/_spec.py)."""
    from autotune.controller._spec import validation_timeout_s

    space, workload, state = qwen16
    options = StudyOptions(validate_steps=1000)
    plain = forecast(state, recipe_baseline(space), 4, StudyOptions(), SimulateBackend, {})
    validated = forecast(state, recipe_baseline(space), 4, options, SimulateBackend, {})
    assert validated.validation_runs == 2
    assert validated.validation_run_s == pytest.approx(_simulated_run(workload, recipe_baseline(space), 3, 1000,
                                                                              timeout_s=1e6))
    assert validated.gpu_hours == pytest.approx(plain.gpu_hours + 2 * validated.validation_run_s * 16 / 3600)
    timeout = validation_timeout_s(options, validated.step_s)
    assert validated.bound_gpu_hours == pytest.approx((4 * 3600 + 2 * timeout) * 16 / 3600)
    assert validated.gpu_hours < validated.bound_gpu_hours
    assert "2 validation run(s) of" in validated.line(None, None)


def test_a_real_launch_assumes_its_start_up(qwen16):
    from autotune.backends.command import CommandBackend

    space, _, state = qwen16
    predicted = forecast(state, recipe_baseline(space), 10, StudyOptions(), CommandBackend, {"command": "x"})
    assert predicted.startup_assumed and predicted.startup_s == ASSUMED_STARTUP_S
    line = predicted.line(2, None)
    assert line.startswith("forecast: about ") and "90 s start-up assumed" in line and "running 2 at a time" in line
    assert "the cost model's step time of the recipe's layout" in line and "no GPU time" not in line


def test_a_study_that_cannot_run_the_recipes_layout_is_priced_at_a_layout_it_may_run():
    """Review: with --fix tp=8 the forecast priced the recipe's TP1 layout, which the study never runs; on 8
    GPUs, where the recipe's layout is illegal, it said only "no step time"."""
    space = load_space("qwen3_30b").fixed({"tp": 8})
    workload = make_workload(space, gpus=16)
    state = _state(space, workload)
    predicted = forecast(state, recipe_baseline(space), 40, StudyOptions(), SimulateBackend, {})
    assert "median predicted step time" in predicted.priced and predicted.layout.startswith("TP8")
    assert predicted.gpu_hours > 0 and predicted.layout in {c.short() for c in state.legal}


def test_a_space_smaller_than_the_budget_is_said(qwen16):
    space = load_space("qwen3_30b").fixed({"tp": 1, "pp": 1, "cp": 1, "ep": 16, "recompute": "none"})
    workload = make_workload(space, gpus=16)
    state = _state(space, workload)
    predicted = forecast(state, recipe_baseline(space), 40, StudyOptions(), SimulateBackend, {})
    assert predicted.open_layouts is not None and predicted.open_layouts < 40
    assert "the study may stop before its budget" in predicted.line(1, "simulated")


def test_a_replayed_run_is_priced_at_the_tables_step_time_as_the_backend_charges_it(tmp_path):
    """Review: a replayed study's forecast was 34% high (the cost model's step time, a simulated run's slow first
    step) against what the study charged (the table's step time, every step alike)."""
    space = load_space("qwen3_30b")
    workload = make_workload(space, gpus=16)
    recipe = recipe_baseline(space)
    import pandas as pd

    table = tmp_path / "sweep.csv"
    pd.DataFrame([{**recipe.to_dict(), "status": "completed", "step_time_s": 12.5}]).to_csv(table, index=False)
    options = {"replay": str(table)}
    legal = [c for c in enumerate_legal(space, workload).configs if c.key() in ReplayBackend.answerable_layouts(options)]
    state = SearchState.build(workload, legal)
    predicted = forecast(state, recipe, 5, StudyOptions(), ReplayBackend, options)
    assert predicted.step_s == 12.5 and "the replay table's step time" in predicted.priced
    spec = TrialSpec(study="r", trial=0, model="qwen3_30b", gpus=16, gpus_per_node=8, gpu="h100",
                     global_batch_size=workload.global_batch_size, seq_length=workload.seq_length, precision="bf16",
                     config=recipe.to_dict(), overrides=[])
    outcome = ReplayBackend(options).run(spec, lambda _: None, threading.Event())
    assert predicted.run_s == pytest.approx(outcome.wall_time_s)


@pytest.mark.parametrize("backend, options", [
    ("simulate", {"startup_s": None}), ("simulate", {"startup_s": "abc"}), ("simulate", {"startup_s": -1}),
    ("simulate", {"noise": None}), ("replay", {"startup_s": None}), ("replay", {"startup_s": float("nan")}),
    ("replay", {"startup_s": [1]})])
def test_a_hand_edited_start_up_is_refused_in_one_line(tmp_path, backend, options):
    """Review: a stored `startup_s: null` made `resume` raise float(None)'s TypeError after Ray had started (the
    range check skipped null; replay checked nothing)."""
    from autotune.backends import backend_class

    if backend == "replay":
        table = tmp_path / "t.csv"
        table.write_text("tp,ep,status,step_time_s\n1,16,completed,12.5\n")
        options = {**options, "replay": str(table)}
    with pytest.raises(ConfigError, match=f"{backend} backend option"):
        backend_class(backend).check_options(options)
    # memory_error's null is the landscape's default, as before
    SimulateBackend.check_options({"memory_error": None})


def test_durations_read_at_a_glance():
    assert [duration(s) for s in (45, 414, 9000, 500_000, 3e12, float("inf"))] == [
        "45 s", "6.9 min", "2.5 h", "5.8 days", "95,064 years", "an unbounded time"]


def test_the_cap_clause_counts_runs_as_the_controller_starts_them(qwen16):
    """Review: the forecast's "stops after N runs" ignored the runs in flight and priced validation runs as
    screening runs. Under_cap follows the controller's rule: a run starts while the hours held and in flight (at
    the forecast's run before any has ended) stay below the cap, however many slots; validation runs only after
    the whole budget."""
    space, _, state = qwen16
    options = StudyOptions(max_gpu_hours=3.0)
    capped = forecast(state, recipe_baseline(space), 10, options, SimulateBackend, {})
    run_h = capped.run_s * 16 / 3600  # about 1.8
    assert capped.under_cap() == (2, 0, pytest.approx(2 * run_h))
    assert "stops the study after about 2 of its 10 run(s)" in capped.line(4, "simulated")
    validated = forecast(state, recipe_baseline(space), 5, StudyOptions(max_gpu_hours=12.0, validate_steps=50),
                         SimulateBackend, {})
    runs, validations, _ = validated.under_cap()
    assert (runs, validations) == (5, 1)
    assert "stops the study before 1 of its 2 validation run(s)" in validated.line(1, "simulated")
    assert "cap" not in forecast(state, recipe_baseline(space), 5, StudyOptions(max_gpu_hours=1000.0),
                                 SimulateBackend, {}).line(1, None)


def test_a_resumed_studys_cap_clause_knows_its_runs_length_and_a_tiny_cap_still_starts_one_run(qwen16):
    """Review: "stops the study before 0 of its 0 validation run(s)" when the cap stopped nothing; a cap below
    one run's hours still starts that run (the controller starts a run while the hours are below the cap)."""
    space, _, state = qwen16
    tiny = forecast(state, recipe_baseline(space), 4, StudyOptions(max_gpu_hours=0.1), SimulateBackend, {})
    assert tiny.under_cap()[0] == 1 and "stops the study after about 1 of its 4 run(s)" in tiny.line(4, "simulated")
    resumed = forecast(state, recipe_baseline(space), 10, StudyOptions(max_gpu_hours=9.0), SimulateBackend, {},
                       spent_gpu_hours=7.3)
    assert resumed.under_cap()[0] == 1
    assert "stops the study after about 1 of its 10 run(s)" in resumed.line(4, "simulated")
    assert resumed.to_dict()["runs_under_cap"] == 1
