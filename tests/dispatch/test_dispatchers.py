"""Every dispatcher against the shared contract: in-process and dry-run without Ray, Ray on the session's cluster."""

from __future__ import annotations

import pytest

from autotune.backends import ResourceRequest
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
        dispatcher = self.started()
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
