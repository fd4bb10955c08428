"""The in-process reference dispatcher: runs each trial to its end inside `submit`, no Ray.

Like Optuna's InMemoryStorage it is the simplest correct implementation of the dispatcher contract
the controller relies on (free_slots / submit / poll / cancel / shutdown, events of
`(trial, step reports, outcome or None)`). Trials run in the caller's thread: the controller and the
search run end to end in tests and benchmarks without starting Ray. A step report that makes the
pruner cancel arrives after the run, so this dispatcher never prunes early.

`concurrency` k (default 1) plays k trials in flight, as on a cluster with room for k at once: each
trial still runs inside `submit`, but its events are held back and `poll` reports the held trial that
ends first on a simulated clock (`clock_s`): a trial starts when it is submitted and lasts its
outcome's `wall_time_s` (start-up and steps; an OOM only its start-up), so a short run reports before
a long one started earlier, and the controller proposes every new layout while k - 1 others have not
reported yet. `clock_s` at the end is the study's wall time on such a cluster (the start-up and steps
the backend simulates, no Ray, no controller time). Runs of equal length report oldest first.
"""

from __future__ import annotations

import heapq
import threading
import traceback
from typing import Any

from autotune._numbers import is_positive_finite
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
        # finished runs not yet reported: (simulated end s, submission number, event), a heap
        self._done: list[tuple[float, int, TrialEvent]] = []
        self._submitted = 0
        self.clock_s = 0.0  # simulated wall time: the end of the last reported run

    def free_slots(self) -> int:
        return max(0, self.capacity - len(self._done))

    def submit(self, spec: TrialSpec) -> None:
        reports: list[StepReport] = []
        try:
            outcome = self.backend.run(spec, reports.append, threading.Event())
        except Exception as exc:  # a backend bug still ends the trial with one outcome
            outcome = TrialOutcome(spec.trial, TrialStatus.FAILED,
                                   error=f"backend raised {exc!r}\n{traceback.format_exc()[-3000:]}")
        # a run starts when it is submitted (a slot was free at clock_s) and lasts what its outcome says;
        # a missing or non-physical wall time counts as instantaneous rather than stalling the clock
        duration_s = outcome.wall_time_s if is_positive_finite(outcome.wall_time_s) else 0.0
        event = TrialEvent(spec.trial, reports, outcome)
        heapq.heappush(self._done, (self.clock_s + duration_s, self._submitted, event))
        self._submitted += 1

    def poll(self, timeout_s: float = 0.0) -> list[TrialEvent]:
        if not self._done:
            return []
        end_s, _, event = heapq.heappop(self._done)  # the run in flight that ends first
        self.clock_s = max(self.clock_s, end_s)
        return [event]

    def cancel(self, trial: int) -> None:
        """Nothing runs between calls: a trial is finished before `submit` returns."""

    def shutdown(self) -> None:
        self.backend.close()
