"""The shared test suite every dispatcher passes (the contract in autotune/dispatch/_base.py).

A dispatcher's test module subclasses DispatcherContract and provides `dispatcher(seconds_per_trial)`,
a started-or-startable dispatcher running the simulate backend.
"""

from __future__ import annotations

import time

from autotune.backends import TrialStatus
from autotune.dispatch import Dispatcher, TrialEvent
from tests.backends.backend_suite import make_spec

POLL_DEADLINE_S = 120.0


def drain(dispatcher: Dispatcher, trials: set[int]) -> dict[int, list[TrialEvent]]:
    """Every event of `trials` until each has ended (or the deadline passes)."""
    events: dict[int, list[TrialEvent]] = {t: [] for t in trials}
    ended: set[int] = set()
    deadline = time.monotonic() + POLL_DEADLINE_S
    while ended != trials and time.monotonic() < deadline:
        for event in dispatcher.poll(timeout_s=0.2):
            assert isinstance(event, TrialEvent)
            assert event.trial in trials, f"an event for trial {event.trial}, never submitted"
            assert event.trial not in ended, f"trial {event.trial} reported after its outcome"
            events[event.trial].append(event)
            if event.outcome is not None:
                ended.add(event.trial)
    assert ended == trials, f"trials {sorted(trials - ended)} never ended"
    return events


class DispatcherContract:
    def dispatcher(self, seconds_per_trial: float = 0.0) -> Dispatcher:
        raise NotImplementedError

    def started(self, seconds_per_trial: float = 0.0) -> Dispatcher:
        dispatcher = self.dispatcher(seconds_per_trial)
        capacity = dispatcher.start()
        assert capacity >= 1 and capacity == dispatcher.capacity
        assert dispatcher.free_slots() == capacity
        return dispatcher

    def test_each_trial_ends_with_exactly_one_outcome_and_frees_its_slot(self):
        dispatcher = self.started()
        try:
            submitted = set()
            for number in range(1, dispatcher.capacity + 1):
                dispatcher.submit(make_spec(trial=number))
                submitted.add(number)
                if dispatcher.free_slots() == 0:
                    break
            events = drain(dispatcher, submitted)
            for number, trial_events in events.items():
                outcomes = [e.outcome for e in trial_events if e.outcome is not None]
                assert len(outcomes) == 1 and outcomes[0].trial == number
                assert outcomes[0].status == TrialStatus.COMPLETED and outcomes[0].step_time_s > 0
            assert dispatcher.free_slots() == dispatcher.capacity
        finally:
            dispatcher.shutdown()

    def test_step_reports_arrive_in_order_once(self):
        dispatcher = self.started()
        try:
            dispatcher.submit(make_spec(trial=7))
            steps = [s for e in drain(dispatcher, {7})[7] for s in e.steps]
            numbers = [s.step for s in steps]
            assert numbers == sorted(numbers) and len(numbers) == len(set(numbers))
            assert all(s.trial == 7 and s.step_time_s > 0 for s in steps)
        finally:
            dispatcher.shutdown()

    def test_a_cancelled_trial_still_ends_with_one_outcome(self):
        dispatcher = self.started(seconds_per_trial=5.0)
        try:
            dispatcher.submit(make_spec(trial=3))
            dispatcher.cancel(3)
            events = drain(dispatcher, {3})[3]
            outcomes = [e.outcome for e in events if e.outcome is not None]
            # a dispatcher that runs trials to the end inside submit() may finish before the cancel
            assert len(outcomes) == 1 and outcomes[0].status in (TrialStatus.PRUNED, TrialStatus.COMPLETED)
            assert dispatcher.free_slots() == dispatcher.capacity
        finally:
            dispatcher.shutdown()

    def test_cancel_of_an_unknown_trial_and_a_second_shutdown_do_nothing(self):
        dispatcher = self.started()
        dispatcher.cancel(999)
        assert dispatcher.poll(timeout_s=0.0) == []
        dispatcher.shutdown()
        dispatcher.shutdown()
