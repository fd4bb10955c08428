"""The shared test suite every backend runs (house rule 1; like Optuna's pytest_storages and Hydra's
launcher_common_tests). A backend's test module subclasses BackendContract and provides `backend()`
and `spec()` for a trial that completes."""

from __future__ import annotations

import json
import threading

import pytest

from autotune.backends import Backend, StepReport, TrialOutcome, TrialSpec, TrialStatus
from autotune.config import LayoutConfig
from autotune.megatron.overrides import layout_overrides
from autotune.space import load_space, make_workload


def make_spec(trial: int = 1, config: dict | None = None, **changes) -> TrialSpec:
    space = load_space("qwen3_30b")
    workload = make_workload(space, gpus=16)
    layout = LayoutConfig.from_mapping(config or {"ep": 8, "dist_opt": True, "mbs": 1})
    values = dict(study="suite", trial=trial, model="qwen3_30b", gpus=16, gpus_per_node=8, gpu="h100",
                  global_batch_size=1024, seq_length=4096, precision="bf16", config=layout.to_dict(),
                  overrides=layout_overrides(layout, workload), warmup_steps=2, measured_steps=3, timeout_s=3600.0)
    values.update(changes)
    return TrialSpec(**values)


class BackendContract:
    def backend(self) -> Backend:
        raise NotImplementedError

    def spec(self, **changes) -> TrialSpec:
        return make_spec(**changes)

    def run(self, spec: TrialSpec, cancel: threading.Event | None = None):
        reports: list[StepReport] = []
        outcome = self.backend().run(spec, reports.append, cancel or threading.Event())
        return outcome, reports

    def test_completed_trial_has_one_outcome_with_metrics(self):
        spec = self.spec(trial=7)
        outcome, _ = self.run(spec)
        assert isinstance(outcome, TrialOutcome)
        assert outcome.trial == 7
        assert outcome.status == TrialStatus.COMPLETED
        assert outcome.step_time_s and outcome.step_time_s > 0

    def test_outcome_round_trips_through_json(self):
        outcome, reports = self.run(self.spec())
        again = TrialOutcome.from_dict(json.loads(json.dumps(outcome.to_dict())))
        assert again == outcome
        for report in reports:
            assert StepReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report

    def test_what_it_says_a_run_holds_is_unknown_or_what_a_run_held(self):
        """The cost forecast (controller/forecast.py) takes a backend's charge for a run: None (a real launch,
        whose length nobody knows before it runs), or what a completed run of that step time held its GPUs
        (within the step noise), its start-up included, and its own step time for a layout when it knows one."""
        import math

        backend = self.backend()
        spec = self.spec()
        kind = type(backend)
        outcome, _ = self.run(spec)
        held = kind.held_seconds(backend.options, outcome.step_time_s, spec.warmup_steps, spec.measured_steps)
        startup = kind.startup_seconds(backend.options)
        if held is None:
            assert startup is None
        else:
            assert isinstance(held, float) and math.isfinite(held) and held >= (startup or 0.0) >= 0
            assert held == pytest.approx(outcome.wall_time_s, rel=0.1)
        known = kind.known_step_seconds(backend.options, LayoutConfig.from_mapping(spec.config).key())
        assert known is None or known == pytest.approx(outcome.step_time_s)

    def test_reports_come_in_step_order(self):
        _, reports = self.run(self.spec())
        steps = [r.step for r in reports]
        assert steps == sorted(steps)

    def test_cancel_before_start_ends_the_trial(self):
        cancel = threading.Event()
        cancel.set()
        outcome, _ = self.run(self.spec(), cancel)
        assert outcome.status in (TrialStatus.PRUNED, TrialStatus.COMPLETED)  # fast backends may finish first

    def test_a_dry_run_says_how_it_launches_a_trial_on_printable_lines_or_nothing(self, tmp_path):
        """Backend.launch_lines (`start --dry-run`): None, when a run launches nothing outside the controller, or
        lines naming the trial, each printable (no control character reaches the reader's terminal) and naming
        no folder outside the study's run folder; has_dry_run says which."""
        backend = self.backend()
        options = {**backend.options, "workdir": str(tmp_path)}
        lines = type(backend).launch_lines(self.spec(trial=5), options)
        assert (lines is not None) == type(backend).has_dry_run()
        if lines is None:
            return
        assert lines and all(isinstance(line, str) and line.isprintable() for line in lines)
        assert lines[0].startswith("trial 5:")
        assert any(f"{tmp_path}/suite/trial5-attempt1" in line for line in lines)
