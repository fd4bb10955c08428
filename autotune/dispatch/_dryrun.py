"""`--dry-run`: print what a study would launch, run nothing.

Stands in for the Ray dispatcher: each submitted trial's launch is printed (the backend's `launch_lines`: the
megatron backend's per-node commands and overrides, the command backend's command line), and the cost model
answers in its place so the proposal sequence is the one a real study would start with (later proposals depend
on real measurements, which a dry run cannot have). The spec file the commands name is written where they say
(`<workdir>/<study>/trial<N>-attempt1/spec.json`, as both backends write it), so a printed command runs as it
stands on a node that sees that folder; nothing else is written.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Callable

from autotune.backends.base import TrialSpec
from autotune.dispatch._base import Dispatcher, TrialEvent
from autotune.backends.runs import prepare_trial_dir, write_new_file
from autotune.backends.simulate import SimulateBackend


class DryRunDispatcher(Dispatcher):
    capacity = 1

    def __init__(self, options: dict[str, Any], emit: Callable[[str], None] = print,
                 lines: Callable[[TrialSpec, dict[str, Any]], list[str] | None] | None = None) -> None:
        """`lines`: the study's backend's Backend.launch_lines (the megatron backend's by default)."""
        if lines is None:
            from autotune.backends.megatron import MegatronBackend

            lines = MegatronBackend.launch_lines
        self.options, self.emit, self.lines = options, emit, lines
        self._simulate = SimulateBackend({"seconds_per_trial": 0.0, "noise": 0.0})
        self._done: list[TrialEvent] = []

    def free_slots(self) -> int:
        return 0 if self._done else 1

    def submit(self, spec: TrialSpec) -> None:
        options = {**self.options, **spec.backend_options}
        # the file the printed commands name, in a checked folder (no link, nobody else's: runs.prepare_trial_dir)
        try:
            write_new_file(prepare_trial_dir(options, spec) / "spec.json", json.dumps(spec.to_dict()))
        except OSError as exc:  # a link, another user's folder, a folder where spec.json goes (adversarial pass)
            from autotune._paths import one_line
            from autotune.errors import ConfigError

            raise ConfigError(f"--dry-run cannot write trial {spec.trial}'s spec.json: {one_line(str(exc))}") from None
        for line in self.lines(spec, options) or []:
            self.emit(line)
        outcome = self._simulate.run(spec, lambda r: None, threading.Event())
        self._done.append(TrialEvent(spec.trial, [], outcome))

    def poll(self, timeout_s: float = 0.0) -> list[TrialEvent]:
        done, self._done = self._done, []
        return done

    def cancel(self, trial: int) -> None:
        pass

    def shutdown(self) -> None:
        pass
