"""The dispatcher contract: how the controller hands trials to whatever runs them.

The controller process owns one dispatcher per study. Backends run a trial (backends/base.py); a
dispatcher decides where and when: on Ray placement groups (`RayDispatcher`), in the caller's thread
(`InProcessDispatcher`, the reference implementation, like Optuna's InMemoryStorage), or not at all
(`DryRunDispatcher`, which prints what it would launch).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

from autotune.backends.base import StepReport, TrialOutcome, TrialSpec


class TrialEvent(NamedTuple):
    """What `poll` reports about one trial: new step reports and, once it has ended, its outcome."""

    trial: int
    steps: list[StepReport]
    outcome: TrialOutcome | None  # None while the trial still runs


class Dispatcher(ABC):
    """Runs TrialSpecs with at most `capacity` trials at once.

    Contract (tests/dispatch/dispatcher_suite.py checks it for every implementation):
    - `start()` acquires what the dispatcher needs and returns `capacity` (>= 1); it is called once,
      before any other method. Resources it cannot get raise ConfigError with one clear line.
    - `free_slots()` is how many more trials `submit` accepts now (0 .. capacity).
    - `submit(spec)` starts one trial; it is only called when `free_slots() > 0`. It never raises for
      the trial's own failure: that arrives as an outcome.
    - `poll(timeout_s)` waits at most `timeout_s` and returns TrialEvents; every submitted trial ends
      with exactly one event whose outcome is not None (LOST when its worker died), after which its
      slot is free again. Step reports arrive in step order, each at most once.
    - `cancel(trial)` asks a running trial to stop; it still ends with one event (PRUNED normally).
      Cancelling a trial that is not running does nothing.
    - `shutdown()` stops what runs and releases every resource (processes, placement groups, a
      Ray cluster it started itself); it may be called more than once.
    """

    capacity: int = 1

    def start(self) -> int:
        return self.capacity

    @abstractmethod
    def free_slots(self) -> int: ...

    @abstractmethod
    def submit(self, spec: TrialSpec) -> None: ...

    @abstractmethod
    def poll(self, timeout_s: float = 0.2) -> list[TrialEvent]: ...

    @abstractmethod
    def cancel(self, trial: int) -> None: ...

    @abstractmethod
    def shutdown(self) -> None: ...
