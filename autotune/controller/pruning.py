"""Stopping slow branches early from intermediate step times.

After the warm-up steps, once `min_measured` steps are in, a trial whose median step time is more
than `margin` slower than the best completed trial's is cancelled: it cannot win, and every further
step burns a multi-node allocation. OOM is not pruning: OOM trials are infeasible (see the controller).
"""

from __future__ import annotations

import statistics


class SlowBranchPruner:
    def __init__(self, warmup_steps: int, min_measured: int = 2, margin: float = 0.25, enabled: bool = True) -> None:
        self.warmup_steps = warmup_steps
        self.min_measured = min_measured
        self.margin = margin
        self.enabled = enabled

    def should_prune(self, step_times_s: list[float], best_step_time_s: float | None) -> bool:
        if not self.enabled or best_step_time_s is None:
            return False
        measured = step_times_s[self.warmup_steps:]
        if len(measured) < self.min_measured:
            return False
        return statistics.median(measured) > best_step_time_s * (1 + self.margin)

    def why(self, step_times_s: list[float], best_step_time_s: float) -> str:
        """What a pruned run's record says (found by a new-user pass: "cancelled by the controller", no figure)."""
        measured = step_times_s[self.warmup_steps:]
        return (f"pruned as a slow branch: its median measured step, {statistics.median(measured):,.3g} s over "
                f"{len(measured)} step(s) after {self.warmup_steps} warm-up, is over {1 + self.margin:g}x the best "
                f"completed run's {best_step_time_s:,.3g} s, so it cannot win")
