"""The in-process reference dispatcher: runs each trial to its end inside `submit`, no Ray.

Like Optuna's InMemoryStorage it is the simplest correct implementation of the dispatcher contract
the controller relies on (free_slots / submit / poll / cancel / shutdown, events of
`(trial, step reports, outcome or None)`). One trial at a time, in the caller's thread: the
controller and the search run end to end in tests and benchmarks without starting Ray. A step
report that makes the pruner cancel arrives after the run, so this dispatcher never prunes early.
"""

from __future__ import annotations

import threading
import traceback
from typing import Any

from autotune.backends.base import StepReport, TrialOutcome, TrialSpec, TrialStatus
from autotune.dispatch._base import Dispatcher, TrialEvent


class InProcessDispatcher(Dispatcher):
    capacity = 1

    def __init__(self, backend_name: str, backend_options: dict[str, Any]) -> None:
        from autotune.backends import create_backend

        self.backend = create_backend(backend_name, backend_options)
        self._done: list[TrialEvent] = []

    def free_slots(self) -> int:
        return 0 if self._done else 1

    def submit(self, spec: TrialSpec) -> None:
        reports: list[StepReport] = []
        try:
            outcome = self.backend.run(spec, reports.append, threading.Event())
        except Exception as exc:  # a backend bug still ends the trial with one outcome
            outcome = TrialOutcome(spec.trial, TrialStatus.FAILED,
                                   error=f"backend raised {exc!r}\n{traceback.format_exc()[-3000:]}")
        self._done.append(TrialEvent(spec.trial, reports, outcome))

    def poll(self, timeout_s: float = 0.0) -> list[TrialEvent]:
        done, self._done = self._done, []
        return done

    def cancel(self, trial: int) -> None:
        """Nothing runs between calls: a trial is finished before `submit` returns."""

    def shutdown(self) -> None:
        self.backend.close()
