"""The cost forecast `start` prints before the first run (controller/forecast.py), checked against what the
simulate backend charges for the same run, and the live view's time left."""

from __future__ import annotations

import threading

import pytest

from autotune.backends.base import TrialSpec
from autotune.backends.simulate import SimulateBackend
from autotune.controller.forecast import ASSUMED_STARTUP_S, forecast
from autotune.controller.options import StudyOptions
from autotune.controller.session import recipe_baseline
from autotune.space import load_space, make_workload


@pytest.mark.parametrize("model, gpus", [("qwen3_30b", 16), ("llama3_70b", 64)])
def test_the_forecast_of_a_run_is_what_the_simulate_backend_charges_for_the_recipes_layout(model, gpus):
    """The forecast assumes the simulate backend's charge: start-up, a first step of three, warm-ups of 1.1. A
    noiseless simulated run of the recipe's layout (the layout the forecast takes) holds its GPUs that long."""
    space = load_space(model)
    workload = make_workload(space, gpus=gpus)
    options = StudyOptions(warmup_steps=3, measured_steps=5)
    predicted = forecast(space, workload, 40, options, SimulateBackend.startup_seconds({}))
    layout = recipe_baseline(space)
    spec = TrialSpec(study="f", trial=0, model=model, gpus=gpus, gpus_per_node=8, gpu="h100",
                     global_batch_size=workload.global_batch_size, seq_length=workload.seq_length,
                     precision="bf16", config=layout.to_dict(), overrides=[],
                     warmup_steps=3, measured_steps=5)
    outcome = SimulateBackend({"noise": 0.0, "seconds_per_trial": 0.0}).run(spec, lambda _: None, threading.Event())
    assert outcome.wall_time_s == pytest.approx(predicted.run_s, rel=1e-9)
    assert predicted.gpu_hours == pytest.approx(40 * outcome.wall_time_s * gpus / 3600)
    assert predicted.bound_gpu_hours == pytest.approx(40 * 3600 * gpus / 3600)
    assert not predicted.startup_assumed


def test_a_real_launch_assumes_its_start_up_and_validation_runs_are_counted_apart():
    space = load_space("qwen3_30b")
    workload = make_workload(space, gpus=16)
    plain = forecast(space, workload, 10, StudyOptions(), None)
    validated = forecast(space, workload, 10, StudyOptions(validate_steps=50), None)
    assert plain.startup_assumed and plain.startup_s == ASSUMED_STARTUP_S
    assert validated.validation_runs == 2 and validated.validation_run_s > 4 * plain.run_s
    assert validated.gpu_hours == pytest.approx(plain.gpu_hours + 2 * validated.validation_run_s * 16 / 3600)
    line = validated.line(None, None)
    assert line.startswith("forecast: about ") and "90 s start-up assumed" in line and "2 validation run(s)" in line
    assert "wall time" not in line  # no concurrency known (a dry run)
    assert "2 at a time" in plain.line(2, None) and "simulated study, no GPU time is spent" in plain.line(2, "simulated")


def test_no_step_time_for_an_illegal_recipe_layout_leaves_only_the_bound():
    """A workload on which the recipe's layout is illegal (a global batch its data parallelism cannot divide):
    the forecast has no step time and says only the timeout's bound."""
    from autotune.space import violations

    space = load_space("qwen3_30b")
    workload = make_workload(space, gpus=16, global_batch_size=8)
    if not violations(recipe_baseline(space), workload):
        pytest.skip("the recipe's layout is legal on this workload")
    predicted = forecast(space, workload, 5, StudyOptions(), None)
    assert predicted.gpu_hours is None and predicted.wall_hours(1) is None
    assert "no step time for the recipe's layout" in predicted.line(1, None) and "at most 80 GPU-hours" in \
        predicted.line(1, None)
