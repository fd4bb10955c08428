"""Each backend runs the shared suite, plus its own cases."""

from __future__ import annotations

import sys
import threading
import time

import numpy as np
import pandas as pd
import pytest

from autotune.backends import TrialSpec, TrialStatus, create_backend
from autotune.backends.command import CommandBackend
from autotune.backends._landscapes import Landscape
from autotune.backends.simulate import workload_from_spec
from autotune.config import LayoutConfig
from tests.backends.backend_suite import BackendContract, make_spec
from tests.conftest import FAKE_LAUNCHER


def test_spec_round_trips_through_json():
    spec = make_spec()
    assert TrialSpec.from_dict(spec.to_dict()) == spec
    assert spec.to_dict()["version"] == 1


class TestSimulate(BackendContract):
    def backend(self):
        return create_backend("simulate", {"seconds_per_trial": 0.0})

    def test_layout_that_does_not_fit_is_oom(self):
        outcome, reports = self.run(self.spec(config={"ep": 1, "mbs": 8}))
        assert outcome.status == TrialStatus.OOM
        assert outcome.peak_mem_gib > 79.6 and reports == []

    def test_hidden_landscape_changes_speed_but_is_deterministic(self):
        plain = create_backend("simulate", {"seconds_per_trial": 0.0, "noise": 0.0})
        hidden = create_backend("simulate", {"seconds_per_trial": 0.0, "noise": 0.0, "landscape_seed": 5})
        spec = self.spec()
        a = plain.run(spec, lambda r: None, threading.Event())
        b = hidden.run(spec, lambda r: None, threading.Event())
        c = hidden.run(spec, lambda r: None, threading.Event())
        assert a.step_time_s != b.step_time_s and b.step_time_s == c.step_time_s
        land = Landscape(5)
        factor = land.speed_factor(LayoutConfig.from_mapping(spec.config), workload_from_spec(spec))
        assert 0.25 < factor < 4 and 0.95 <= land.memory_factor(LayoutConfig()) <= 1.05

    def test_stragglers_are_a_share_of_runs_20_to_40_percent_slower(self):
        """The benchmark's slow-node runs (`stragglers`): whatever the layout, a share of runs is slower by
        20-40% (not a bell around the layout's speed), the same run the same way every time."""
        from autotune.backends._landscapes import straggler_factor

        factors = [straggler_factor(3, trial, 1, 0.2) for trial in range(2000)]
        slow = [f for f in factors if f < 1.0]
        assert 0.17 < len(slow) / len(factors) < 0.23 and all(0.6 <= f <= 0.8 for f in slow)
        assert set(factors) - set(slow) == {1.0} and straggler_factor(3, 7, 1, 0.0) == 1.0
        assert factors == [straggler_factor(3, trial, 1, 0.2) for trial in range(2000)]
        plain = create_backend("simulate", {"seconds_per_trial": 0.0, "noise": 0.0})
        always = create_backend("simulate", {"seconds_per_trial": 0.0, "noise": 0.0, "stragglers": 1.0})
        spec = self.spec()
        a = plain.run(spec, lambda r: None, threading.Event())
        b = always.run(spec, lambda r: None, threading.Event())
        assert 0.6 <= a.step_time_s / b.step_time_s <= 0.8

    @pytest.mark.parametrize("family", ["knob", "interact", "regime", "prior_wrong", "mixed", "knobs"])
    def test_landscape_splits_its_true_step_into_the_parts_a_trace_shows(self, family):
        """Landscape.step_parts: the true step (the model's / speed_factor) split into compute, communication
        and idle, each effect's time in its own part, none negative however large a saving."""
        from autotune.backends._landscapes import TRACE_PARTS
        from autotune.cost import estimate

        workload = workload_from_spec(self.spec())
        land = Landscape(11, family)
        configs = [LayoutConfig.from_mapping(c) for c in (
            {"ep": 8, "dist_opt": True, "mbs": 1}, {"tp": 4, "cp": 4, "ep": 4, "mbs": 1},
            {"tp": 2, "pp": 2, "ep": 16, "etp": 1, "mbs": 4, "recompute": "full", "recompute_method": "uniform",
             "recompute_num_layers": 1}, {"ep": 8, "mbs": 2, "cuda_graph": "full_iteration", "dispatcher": "alltoall"})]
        for config in configs:
            predicted = estimate(workload, config.layout_only() if land.owns_knob_effects else config).breakdown
            parts = land.step_parts(config, workload, predicted)
            assert set(parts) == set(TRACE_PARTS) and min(parts.values()) > 0
            assert sum(parts.values()) == pytest.approx(sum(predicted.values()) / land.speed_factor(config, workload))
            assert land.speed_factor(config, workload) == pytest.approx(
                np.prod([f for f, _ in land.effects(config, workload)]))

    def test_regime_cliffs_land_in_their_physical_part(self):
        """A TP x CP group leaving the node is communication; small expert GEMMs are compute."""
        workload = workload_from_spec(self.spec())
        land = Landscape(11, "regime")
        inside = land._regime(LayoutConfig.from_mapping({"tp": 2, "cp": 2, "ep": 8, "mbs": 8}), workload, 1.0)
        leaving = land._regime(LayoutConfig.from_mapping({"tp": 4, "cp": 4, "ep": 8, "mbs": 8}), workload, 1.0)
        assert all(part != "communication" for _, part in inside)
        assert [part for f, part in leaving if f < 1 and part == "communication"] == ["communication"]
        starved = land._regime(LayoutConfig.from_mapping({"ep": 1, "mbs": 1, "cp": 8}), workload, 1.0)
        assert ("compute" in [part for _, part in starved]) and all(f < 1 for f, _ in starved)

    def test_traced_runs_report_the_true_split_with_trace_noise(self):
        """With `traced`, a completed run carries what an nsys trace of it would measure: compute and exposed
        communication of the landscape's true step, within the run's step time and each within the trace
        noise of the truth; without it, nothing (the field stays empty, as for an untraced real run)."""
        from autotune._numbers import MEASURED_TERMS, measured_terms
        from autotune.cost import estimate

        spec = self.spec()
        options = {"seconds_per_trial": 0.0, "noise": 0.0, "landscape_seed": 5, "landscape": "mixed"}
        untraced = create_backend("simulate", options).run(spec, lambda r: None, threading.Event())
        assert untraced.measured_terms_s == {}
        traced = create_backend("simulate", {**options, "traced": True, "trace_noise": 0.05})
        outcome = traced.run(spec, lambda r: None, threading.Event())
        assert outcome.step_time_s == untraced.step_time_s  # tracing does not change the run
        terms = outcome.measured_terms_s
        assert set(terms) == set(MEASURED_TERMS) and measured_terms(terms, outcome.step_time_s) == terms
        workload, config = workload_from_spec(spec), LayoutConfig.from_mapping(spec.config)
        parts = Landscape(5, "mixed").step_parts(config, workload, estimate(workload, config).breakdown)
        true_step = sum(parts.values())
        assert true_step == pytest.approx(outcome.step_time_s, rel=1e-9)  # no noise: the run is the truth
        for name, part in (("compute", "compute"), ("exposed_communication", "communication")):
            assert terms[name] == pytest.approx(parts[part], rel=0.05)  # +-5% trace noise
        again = traced.run(spec, lambda r: None, threading.Event())
        other = traced.run(self.spec(trial=2), lambda r: None, threading.Event())
        assert again.measured_terms_s == terms and other.measured_terms_s != terms  # noise drawn per run

    @pytest.mark.parametrize("options", [{"noise": 0.1}, {"noise": 0.05, "trace_noise": 0.5}, {"trace_noise": 7.0},
                                         {"run_noise": 0.3, "stragglers": 0.5}])
    def test_traced_parts_stay_within_the_measured_step_under_any_noise(self, options):
        """Review: the parts were scaled to the run's step before its per-step noise, so with noisy steps
        (or a large trace_noise) they outgrew the measured mean and the trace was dropped as impossible. They
        follow the measured mean now and never exceed it together."""
        from autotune._numbers import measured_terms

        backend = create_backend("simulate", {"seconds_per_trial": 0.0, "landscape_seed": 3, "landscape": "mixed",
                                              "traced": True, **options})
        for trial in range(40):
            spec = self.spec(trial=trial, measured_steps=1, config={"tp": 2, "ep": 8, "dist_opt": True, "mbs": 1})
            outcome = backend.run(spec, lambda r: None, threading.Event())
            assert outcome.status == TrialStatus.COMPLETED
            terms = outcome.measured_terms_s
            assert measured_terms(terms, outcome.step_time_s) == terms and min(terms.values()) >= 0
            assert sum(terms.values()) <= outcome.step_time_s * (1 + 1e-12)

    def test_timeout(self):
        outcome, _ = self.run(self.spec(timeout_s=100.0))  # 90 s start-up + steps > 100 s
        assert outcome.status == TrialStatus.TIMEOUT


class TestCommand(BackendContract):
    mode = "model"

    def backend(self):
        return CommandBackend({"command": f"python3 {FAKE_LAUNCHER}"})

    @pytest.fixture(autouse=True)
    def _mode(self, monkeypatch, tmp_path):
        monkeypatch.setenv("FAKE_MODE", self.mode)
        self.pid_file = tmp_path / "pids"
        monkeypatch.setenv("FAKE_PID_FILE", str(self.pid_file))

    def test_intermediate_reports_are_parsed(self):
        outcome, reports = self.run(self.spec())
        assert [r.step for r in reports] == [1, 2, 3, 4, 5]
        assert reports[0].warmup and not reports[-1].warmup
        assert outcome.tokens_per_s_per_gpu and outcome.peak_mem_gib

    def test_crash_is_failed_with_stderr_tail(self, monkeypatch):
        monkeypatch.setenv("FAKE_MODE", "crash")
        outcome, _ = self.run(self.spec())
        assert outcome.status == TrialStatus.FAILED
        assert "exit code 3" in outcome.error and "NCCL error" in outcome.error

    def test_garbage_output_is_failed(self, monkeypatch):
        monkeypatch.setenv("FAKE_MODE", "garbage")
        outcome, _ = self.run(self.spec())
        assert outcome.status == TrialStatus.FAILED and "no result JSON" in outcome.error

    def test_oom_result(self, monkeypatch):
        monkeypatch.setenv("FAKE_MODE", "oom")
        outcome, _ = self.run(self.spec())
        assert outcome.status == TrialStatus.OOM and outcome.peak_mem_gib == 81.0

    def test_partial_result_keeps_step_time(self, monkeypatch):
        monkeypatch.setenv("FAKE_MODE", "partial")
        outcome, _ = self.run(self.spec())
        assert outcome.status == TrialStatus.COMPLETED and outcome.tokens_per_s_per_gpu is None

    def _group_alive(self) -> list[int]:
        """Recorded processes still running (a zombie, dead but not yet reaped by PID 1, does not count)."""
        alive = []
        for line in self.pid_file.read_text().split("\n"):
            if line.strip():
                pid = int(line.split()[0])
                try:
                    state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
                except FileNotFoundError:
                    continue
                if state not in ("Z", "X"):
                    alive.append(pid)
        return alive

    def test_hang_times_out_and_the_whole_group_dies(self, monkeypatch):
        monkeypatch.setenv("FAKE_MODE", "hang")
        start = time.monotonic()
        outcome, _ = self.run(self.spec(timeout_s=1.5))
        assert outcome.status == TrialStatus.TIMEOUT
        assert time.monotonic() - start < 15
        time.sleep(0.2)
        assert len(self.pid_file.read_text().split()) >= 4  # the launcher and its child
        assert self._group_alive() == []

    def test_cancel_kills_the_process_group(self, monkeypatch):
        monkeypatch.setenv("FAKE_MODE", "hang")
        cancel = threading.Event()
        threading.Timer(1.0, cancel.set).start()
        outcome, _ = self.run(self.spec(timeout_s=60), cancel)
        assert outcome.status == TrialStatus.PRUNED
        time.sleep(0.2)
        assert self._group_alive() == []

    def test_a_failure_reported_on_stdout_is_quoted_when_stderr_is_empty(self):
        """Review: `bash -c "echo garbage; exit 3"` left the record an empty "stderr tail:"."""
        def failed(command: str) -> str:
            outcome = CommandBackend({"command": command}).run(self.spec(), lambda r: None, threading.Event())
            assert outcome.status == TrialStatus.FAILED
            return outcome.error

        assert failed("bash -c 'echo garbage; exit 3'") == "exit code 3; stderr empty; stdout tail:\ngarbage"
        assert failed("bash -c 'echo on-stdout; echo on-stderr >&2; exit 3'") == "exit code 3; stderr tail:\non-stderr\n"
        assert failed("bash -c 'exit 3'") == "exit code 3; no output on stderr or stdout"
        assert failed("bash -c 'echo not json'") == "the command printed no result JSON line; stderr empty; " \
                                                   "stdout tail:\nnot json"

    def test_a_json_log_line_after_the_result_is_not_the_result(self):
        """Review: a JSON logger's line printed after `{"status": "oom"}` was taken for the result, its
        status defaulted to completed, and the OOM was recommended at the step lines' throughput."""
        script = ('import json; [print(json.dumps({"step": k, "step_time_s": 30.5})) for k in range(1, 7)]; '
                  'print(json.dumps({"status": "oom", "peak_mem_gib": 85.0, "error": "CUDA out of memory"})); '
                  'print(json.dumps({"event": "shutdown", "level": "info"})); print(json.dumps({"status": "done"}))')
        outcome = CommandBackend({"command": [sys.executable, "-c", script]}).run(self.spec(), lambda r: None,
                                                                                  threading.Event())
        assert outcome.status == TrialStatus.OOM and outcome.peak_mem_gib == 85.0
        # a JSON line with no status at all is no result either
        only_log = 'import json; print(json.dumps({"event": "done", "step_time_s": 30.0}))'
        outcome = CommandBackend({"command": [sys.executable, "-c", only_log]}).run(self.spec(), lambda r: None,
                                                                                    threading.Event())
        assert outcome.status == TrialStatus.FAILED and "no result JSON line" in outcome.error

    def test_missing_program_is_failed_not_raised(self):
        outcome = CommandBackend({"command": "/nonexistent/launcher"}).run(self.spec(), lambda r: None,
                                                                        threading.Event())
        assert outcome.status == TrialStatus.FAILED and "cannot start" in outcome.error


class TestReplay(BackendContract):
    @pytest.fixture(autouse=True)
    def _table(self, tmp_path):
        rows = [{**LayoutConfig.from_mapping(make_spec().config).to_dict(), "status": "completed",
                 "step_time_s": 30.0, "peak_mem_gib": 70.0},
                {**LayoutConfig(ep=16).to_dict(), "status": "oom", "peak_mem_gib": 85.0}]
        self.path = tmp_path / "table.csv"
        pd.DataFrame(rows).to_csv(self.path, index=False)

    def backend(self):
        return create_backend("replay", {"replay": str(self.path)})

    def test_missing_layout_is_failed(self):
        outcome, _ = self.run(self.spec(config={"ep": 4}))
        assert outcome.status == TrialStatus.FAILED and "not in the replay table" in outcome.error

    def test_oom_row(self):
        outcome, _ = self.run(self.spec(config={"ep": 16}))
        assert outcome.status == TrialStatus.OOM

    def test_a_table_of_throughputs_alone_replays_the_step_time_they_imply(self, tmp_path):
        # review: the table passed the start-up check, then every run failed ("has no step_time_s")
        spec = self.spec()
        tokens = 4000.0
        path = tmp_path / "throughputs.csv"
        pd.DataFrame([{**LayoutConfig.from_mapping(spec.config).to_dict(), "status": "completed",
                       "tokens_per_s_per_gpu": tokens}]).to_csv(path, index=False)
        outcome = create_backend("replay", {"replay": str(path)}).run(spec, lambda r: None, threading.Event())
        assert outcome.status == TrialStatus.COMPLETED and outcome.tokens_per_s_per_gpu == tokens
        assert outcome.step_time_s == pytest.approx(spec.global_batch_size * spec.seq_length / (tokens * spec.gpus))

    def test_parquet_table(self, tmp_path):
        pytest.importorskip("pyarrow")
        parquet = tmp_path / "t.parquet"
        pd.read_csv(self.path).to_parquet(parquet)
        backend = create_backend("replay", {"replay": str(parquet)})
        assert backend.run(self.spec(), lambda r: None, threading.Event()).status == TrialStatus.COMPLETED


    def test_a_table_is_parsed_once_per_version_of_the_file(self, monkeypatch):
        """A start asked for the table five times (a Parquet table of 10^5 rows is seconds per reading);
        a file edited between two readings is read again."""
        import os

        from autotune.backends import replay

        reads = []
        monkeypatch.setattr(replay, "read_table", lambda path, real=replay.read_table: reads.append(path) or real(path))
        options = {"replay": str(self.path)}
        replay.ReplayBackend.check_options(options)
        keys = replay.ReplayBackend.answerable_layouts(options)
        assert replay.repeated_rows(self.path) == (0, 0, 0) and len(reads) == 1
        outcome, _ = self.run(self.spec(config={"ep": 16}))
        assert outcome.status == TrialStatus.OOM and len(reads) == 1
        frame = pd.read_csv(self.path)
        frame.loc[frame["ep"] == 16, "status"] = "failed"
        frame.to_csv(self.path, index=False)
        os.utime(self.path, ns=(1, 1))  # another version even where the clock's grain hides the edit
        assert self.run(self.spec(config={"ep": 16}))[0].status == TrialStatus.FAILED and len(reads) == 2
        assert replay.ReplayBackend.answerable_layouts(options) == keys
        # what a backend changes in its index is its own: the next reader gets the table as read
        self.backend()._index[next(iter(keys))]["status"] = "changed"
        assert all(r["status"] != "changed" for rows in replay.table_groups(self.path).values() for r in rows)

@pytest.mark.parametrize("backend, expected", [
    ("simulate", {"workdir": "/w", "noise": 0.02, "seconds_per_trial": 0.0}),
    ("command", {"workdir": "/w", "command": "my-launcher --x"}),
    ("replay", {"workdir": "/w", "replay": "t.csv"}),
    ("megatron", {"workdir": "/w", "python": "/opt/py", "dispatcher": "recipe", "nsys_ranks": [0, 8],
                  "memory_snapshot": True}),
])
def test_each_backend_reads_its_own_start_flags(backend, expected):
    """`autotune start` hands the parsed flags to the chosen backend, which takes only its own (Hydra's
    launcher plugins own their options the same way)."""
    import argparse

    from autotune.backends import backend_class

    args = argparse.Namespace(workdir="/w", noise=0.02, sim_seconds=0.0, command="my-launcher --x", replay="t.csv",
                              worker_python="/opt/py", dispatcher="recipe", nsys_ranks="0,8", memory_snapshot=True)
    assert backend_class(backend).options_from_cli(args) == expected


def test_megatron_refuses_malformed_nsys_ranks():
    import argparse

    from autotune.backends import backend_class
    from autotune.errors import ConfigError

    with pytest.raises(ConfigError, match="--nsys-ranks"):
        backend_class("megatron").options_from_cli(argparse.Namespace(nsys_ranks="0,x"))
