"""Every dispatcher against the shared contract: in-process and dry-run without Ray, Ray on the session's cluster."""

from __future__ import annotations

import pytest

from autotune.backends import ResourceRequest
from autotune.backends.base import TrialStatus
from autotune.dispatch import DryRunDispatcher, InProcessDispatcher
from tests.dispatch.dispatcher_suite import DispatcherContract, drain
from tests.backends.backend_suite import make_spec


class TestInProcessDispatcher(DispatcherContract):
    def dispatcher(self, seconds_per_trial: float = 0.0):
        return InProcessDispatcher("simulate", {"seconds_per_trial": min(seconds_per_trial, 0.2)})


class TestInProcessDispatcherWithSlots(DispatcherContract):
    def dispatcher(self, seconds_per_trial: float = 0.0):
        return InProcessDispatcher("simulate", {"seconds_per_trial": min(seconds_per_trial, 0.2)}, concurrency=3)

    def test_results_are_held_back_until_the_oldest_run_ends(self):
        # equal-length runs (no step noise): the oldest ends first
        dispatcher = InProcessDispatcher("simulate", {"seconds_per_trial": 0.0, "noise": 0.0}, concurrency=3)
        try:
            for number in (1, 2, 3):
                dispatcher.submit(make_spec(trial=number))
            assert dispatcher.free_slots() == 0
            assert [e.trial for e in dispatcher.poll()] == [1] and dispatcher.free_slots() == 1
            dispatcher.submit(make_spec(trial=4))
            assert [e.trial for e in dispatcher.poll()] == [2]
            assert sorted(drain(dispatcher, {3, 4})) == [3, 4] and dispatcher.free_slots() == 3
        finally:
            dispatcher.shutdown()

    def test_a_short_run_reports_before_a_long_one_started_earlier_on_the_simulated_clock(self):
        """An OOM shows at start-up (90 s simulated); a completed run also runs its steps (~300 s): with two
        slots the OOM submitted second reports first, and the clock ends at the longest run's end."""
        dispatcher = InProcessDispatcher("simulate", {"seconds_per_trial": 0.0, "noise": 0.0}, concurrency=2)
        try:
            dispatcher.submit(make_spec(trial=1))  # fits: start-up + steps
            dispatcher.submit(make_spec(trial=2, config={"ep": 1, "dist_opt": False, "mbs": 1}))  # OOM
            first = dispatcher.poll()
            assert [e.trial for e in first] == [2] and first[0].outcome.status == TrialStatus.OOM
            assert dispatcher.clock_s == pytest.approx(90.0)
            dispatcher.submit(make_spec(trial=3))  # starts at 90 s
            second, third = dispatcher.poll(), dispatcher.poll()
            assert [second[0].trial, third[0].trial] == [1, 3]
            assert dispatcher.clock_s == pytest.approx(90.0 + third[0].outcome.wall_time_s)  # trial 3 ends last
            assert dispatcher.poll() == [] and dispatcher.free_slots() == 2
        finally:
            dispatcher.shutdown()

    @pytest.mark.parametrize("concurrency", [0, -1, True, 1.5, "2"])
    def test_a_slot_count_that_is_no_positive_integer_is_refused(self, concurrency):
        with pytest.raises(ValueError, match="concurrency"):
            InProcessDispatcher("simulate", {}, concurrency=concurrency)


class TestDryRunDispatcher(DispatcherContract):
    def dispatcher(self, seconds_per_trial: float = 0.0):
        self.lines: list[str] = []
        return DryRunDispatcher({}, emit=self.lines.append)

    def test_it_prints_what_it_would_launch(self):
        dispatcher = self.started()
        dispatcher.submit(make_spec(trial=4))
        drain(dispatcher, {4})
        assert any("model.tensor_model_parallel_size" in line or "torchrun" in line for line in self.lines)


@pytest.mark.ray
@pytest.mark.slow
class TestRayDispatcher(DispatcherContract):
    @pytest.fixture(autouse=True)
    def _ray(self, ray_session):
        yield

    def dispatcher(self, seconds_per_trial: float = 0.0):
        from autotune.dispatch import RayDispatcher

        return RayDispatcher("simulate", {"seconds_per_trial": seconds_per_trial},
                             ResourceRequest.for_workload(16, 8, False), max_concurrent=1)
