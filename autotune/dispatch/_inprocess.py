"""The in-process reference dispatcher: runs each trial to its end inside `submit`, no Ray.

Like Optuna's InMemoryStorage it is the simplest correct implementation of the dispatcher contract
the controller relies on (free_slots / submit / poll / cancel / shutdown, events of
`(trial, step reports, outcome or None)`). Trials run in the caller's thread: the controller and the
search run end to end in tests and benchmarks without starting Ray. A step report that makes the
pruner cancel arrives after the run, so this dispatcher never prunes early.

`concurrency` k (default 1) plays k trials in flight, as on a cluster with room for k at once: each
trial still runs inside `submit`, but its events are held back and `poll` reports only the oldest
held trial, so the controller proposes every new layout while k - 1 others have not reported yet
(equal-length runs started one after another). The search is then measured as it works on Ray with
several slots, without Ray's start-up or timing.
"""

from __future__ import annotations

import threading
import traceback
from typing import Any

from autotune.backends.base import StepReport, TrialOutcome, TrialSpec, TrialStatus
from autotune.dispatch._base import Dispatcher, TrialEvent


class InProcessDispatcher(Dispatcher):
    capacity = 1

    def __init__(self, backend_name: str, backend_options: dict[str, Any], concurrency: int = 1) -> None:
        from autotune.backends import create_backend

        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a positive integer, not {concurrency!r}")
        self.capacity = concurrency
        self.backend = create_backend(backend_name, backend_options)
        self._done: list[TrialEvent] = []  # finished runs not yet reported, oldest first

    def free_slots(self) -> int:
        return max(0, self.capacity - len(self._done))

    def submit(self, spec: TrialSpec) -> None:
        reports: list[StepReport] = []
        try:
            outcome = self.backend.run(spec, reports.append, threading.Event())
        except Exception as exc:  # a backend bug still ends the trial with one outcome
            outcome = TrialOutcome(spec.trial, TrialStatus.FAILED,
                                   error=f"backend raised {exc!r}\n{traceback.format_exc()[-3000:]}")
        self._done.append(TrialEvent(spec.trial, reports, outcome))

    def poll(self, timeout_s: float = 0.0) -> list[TrialEvent]:
        return [self._done.pop(0)] if self._done else []  # the oldest run in flight ends first

    def cancel(self, trial: int) -> None:
        """Nothing runs between calls: a trial is finished before `submit` returns."""

    def shutdown(self) -> None:
        self.backend.close()
