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
