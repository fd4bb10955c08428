"""Dispatching trials through Ray: placement groups and reusable runner actors.

Every trial of a study needs the same resources (the study's world size), so the dispatcher keeps
`capacity` slots, each a placement group shaped like one trial (`ResourceRequest.bundles()`,
gang-scheduled: a multi-node trial gets all of its nodes or none) with one runner actor placed in
it. A slot runs one trial at a time; reusing it avoids a process start per trial. A runner that
dies (RayActorError: the worker or its node died) yields a LOST outcome and the slot is rebuilt.
Ray is imported here only, when a study starts (house rule 6).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from typing import Any

from autotune import _signals
from autotune.backends.base import ResourceRequest, StepReport, TrialOutcome, TrialSpec, TrialStatus
from autotune.dispatch._base import Dispatcher, TrialEvent
from autotune.errors import AutotuneError, ConfigError

NAMESPACE = "autotune"
PLACEMENT_TIMEOUT_S = 60.0


class TrialRunner:
    """The Ray actor body: runs one trial at a time with a backend, in a thread, pollable."""

    def __init__(self, backend_name: str, options: dict[str, Any]) -> None:
        from autotune.backends import create_backend

        self.backend = create_backend(backend_name, options)
        self._lock = threading.Lock()
        self._trial: int | None = None
        self._reports: list[dict] = []
        self._outcome: dict | None = None
        self._cancel = threading.Event()

    def start(self, spec_dict: dict) -> int:
        spec = TrialSpec.from_dict(spec_dict)
        with self._lock:
            self._trial, self._reports, self._outcome = spec.trial, [], None
            self._cancel = threading.Event()
            cancel = self._cancel
        threading.Thread(target=self._run, args=(spec, cancel), daemon=True).start()
        return os.getpid()

    def _run(self, spec: TrialSpec, cancel: threading.Event) -> None:
        def report(step: StepReport) -> None:
            with self._lock:
                self._reports.append(step.to_dict())

        try:
            outcome = self.backend.run(spec, report, cancel)
        except Exception as exc:  # a backend bug must still end the trial with one outcome
            tail = traceback.format_exc()[-3000:]
            outcome = TrialOutcome(spec.trial, TrialStatus.FAILED, error=f"backend raised {exc!r}\n{tail}")
        with self._lock:
            self._outcome = outcome.to_dict()

    def poll(self) -> tuple[int | None, list[dict], dict | None]:
        with self._lock:
            reports, self._reports = self._reports, []
            return self._trial, reports, self._outcome

    def cancel(self) -> None:
        self._cancel.set()

    def pid(self) -> int:
        return os.getpid()


@dataclass
class _Slot:
    index: int
    placement_group: Any
    actor: Any
    trial: int | None = None
    spec: TrialSpec | None = None
    pending: Any = None  # the in-flight poll() ObjectRef


class RayDispatcher(Dispatcher):
    """Runs TrialSpecs on Ray with at most `capacity` trials at once (see module docstring)."""

    def __init__(self, backend_name: str, backend_options: dict[str, Any], resources: ResourceRequest, *,
                 address: str | None = None, local_gpus: int | None = None, max_concurrent: int | None = None) -> None:
        self.backend_name = backend_name
        self.backend_options = backend_options
        self.resources = resources
        self.address = address
        self.local_gpus = local_gpus
        self.max_concurrent = max_concurrent
        self.capacity = 0
        self._slots: list[_Slot] = []
        self._runner_cls = None
        self._owns_ray = False

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> int:
        import ray

        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            # ray.init installs a SIGTERM handler of its own that exits with code 15 at once (found by review:
            # no word, and a local Ray's agents outlived the controller): a start cut short is cleaned up
            # and stops as Ctrl-C does, and our handler is put back
            ours = signal.getsignal(signal.SIGTERM)
            main = threading.current_thread() is threading.main_thread()
            try:
                self._init_ray(ray)
            except BaseException as exc:
                terminated = isinstance(exc, SystemExit) and exc.code == signal.SIGTERM
                if terminated:
                    _signals.record_terminated()  # a second SIGTERM must not cut the clean-up short
                if main and ours is not None:
                    signal.signal(signal.SIGTERM, ours)
                with contextlib.suppress(Exception):
                    ray.shutdown()  # a local node's processes (its agents went with their group)
                if terminated:
                    raise _signals.Terminated() from None
                raise
            finally:
                if main and ours is _signals.SIGTERM_HANDLER:
                    # inside sigterm_as_interrupt (`start`): a SIGTERM from here on stops as Ctrl-C does
                    signal.signal(signal.SIGTERM, ours)
        total_gpus = int(ray.cluster_resources().get("GPU", 0))
        fits = total_gpus // self.resources.gpus
        if fits < 1:
            raise ConfigError(f"the Ray cluster has {total_gpus} GPUs; one trial needs {self.resources.gpus}")
        self.capacity = min(fits, self.max_concurrent) if self.max_concurrent else fits
        self._runner_cls = ray.remote(TrialRunner)
        self._slots = [self._new_slot(i) for i in range(self.capacity)]
        return self.capacity

    def _init_ray(self, ray) -> None:
        """Connect to the cluster at `address`, or start a local one with the logical GPUs asked for."""
        if self.address:
            try:
                with warnings.catch_warnings():  # Ray Client warns before it raises: the error says it
                    warnings.simplefilter("ignore")
                    ray.init(address=self.address, namespace=NAMESPACE, log_to_driver=False, logging_level="ERROR")
            except (ConnectionError, ValueError, RuntimeError, TimeoutError) as exc:
                # an address Ray cannot parse, `auto` with no cluster running here, a refused handshake
                reason = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0][:200]
                raise ConfigError(f"cannot connect to the Ray cluster at {self.address!r}: {reason}") from None
            return
        # address="local": always a new local cluster, never one that happens to run on this machine; its
        # processes get their own group, so a SIGTERM to ours does not kill them under us (and a start cut
        # short stops them all)
        with _signals.ray_outside_our_group():
            ray.init(address="local", num_cpus=os.cpu_count() or 2, num_gpus=self.local_gpus or self.resources.gpus,
                     namespace=NAMESPACE, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
        self._owns_ray = True

    def _new_slot(self, index: int, placement_group=None) -> _Slot:
        import ray
        from ray.util.placement_group import placement_group as make_pg
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if placement_group is None:
            placement_group = make_pg(self.resources.bundles(), strategy=self.resources.strategy)
            ready, _ = ray.wait([placement_group.ready()], timeout=PLACEMENT_TIMEOUT_S)
            if not ready:
                ray.util.remove_placement_group(placement_group)
                raise AutotuneError(f"Ray could not place {self.resources.bundles()} ({self.resources.strategy}) "
                                    f"within {PLACEMENT_TIMEOUT_S:g} s")
        strategy = PlacementGroupSchedulingStrategy(placement_group=placement_group, placement_group_bundle_index=0)
        actor = self._runner_cls.options(num_cpus=0, max_concurrency=4, scheduling_strategy=strategy,
                                         max_restarts=0).remote(self.backend_name, self.backend_options)
        return _Slot(index, placement_group, actor)

    def shutdown(self) -> None:
        """Cancel what runs, kill the runners and release every placement group."""
        import ray

        if not ray.is_initialized():
            return
        for slot in self._slots:
            if slot.trial is not None:
                try:
                    ray.get(slot.actor.cancel.remote(), timeout=5)
                except Exception:
                    pass
        for slot in self._slots:
            try:
                ray.kill(slot.actor)
            except Exception:
                pass
            try:
                ray.util.remove_placement_group(slot.placement_group)
            except Exception:
                pass
        self._slots = []
        if self._owns_ray:
            ray.shutdown()

    # --- trials --------------------------------------------------------------------------------

    def free_slots(self) -> int:
        return sum(1 for s in self._slots if s.trial is None)

    def submit(self, spec: TrialSpec) -> None:
        slot = next(s for s in self._slots if s.trial is None)
        slot.trial, slot.spec = spec.trial, spec
        slot.pending = slot.actor.start.remote(spec.to_dict())

    def cancel(self, trial: int) -> None:
        for slot in self._slots:
            if slot.trial == trial:
                slot.actor.cancel.remote()

    def poll(self, timeout_s: float = 0.2) -> list[TrialEvent]:
        """New step reports and finished outcomes of the running trials."""
        import ray

        busy = [s for s in self._slots if s.trial is not None]
        if not busy:
            time.sleep(min(timeout_s, 0.05))
            return []
        for slot in busy:
            if slot.pending is None:
                slot.pending = slot.actor.poll.remote()
        ray.wait([s.pending for s in busy], num_returns=len(busy), timeout=timeout_s)
        events = []
        for slot in busy:
            ready, _ = ray.wait([slot.pending], timeout=0)
            if not ready:
                continue
            events.extend(self._collect(slot))
        return events

    def _collect(self, slot: _Slot) -> list[TrialEvent]:
        import ray
        from ray.exceptions import RayActorError

        ref, slot.pending = slot.pending, None
        trial = slot.trial
        try:
            value = ray.get(ref)
        except RayActorError as exc:
            self._rebuild(slot)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
            return [TrialEvent(trial, [], TrialOutcome(trial, TrialStatus.LOST, error=f"worker died: {first}"))]
        if not isinstance(value, tuple):  # the start() call's return value: poll next time
            return []
        running, reports, outcome = value
        if running != trial:
            return []
        steps = [StepReport.from_dict(r) for r in reports]
        if outcome is None:
            return [TrialEvent(trial, steps, None)]
        slot.trial, slot.spec = None, None
        return [TrialEvent(trial, steps, TrialOutcome.from_dict(outcome))]

    def _rebuild(self, slot: _Slot) -> None:
        """Replace a dead runner; a new placement group when the old one lost its node."""
        import ray
        from ray.util import placement_group_table

        slot.trial, slot.spec, slot.pending = None, None, None
        state = placement_group_table(slot.placement_group).get("state")
        if state != "CREATED":
            try:
                ray.util.remove_placement_group(slot.placement_group)
            except Exception:
                pass
            fresh = self._new_slot(slot.index)
        else:
            fresh = self._new_slot(slot.index, slot.placement_group)
        slot.placement_group, slot.actor = fresh.placement_group, fresh.actor

    def runner_pids(self) -> dict[int, int]:
        """Process ids of the runners of running trials (trial -> pid), for fault-injection tests."""
        import ray

        return {s.trial: ray.get(s.actor.pid.remote(), timeout=10) for s in self._slots if s.trial is not None}
