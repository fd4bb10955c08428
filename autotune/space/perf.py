"""The legal performance settings of one layout (issue 16), enumerated on demand.

The legal set the controller enumerates holds layouts only; a layout's performance settings are
enumerated here, conditionally: a child knob exists only under its parent (a flex SM count only with
flex, the CP communication type only with CP > 1, EP overlap only with EP > 1, ...), so the knobs never
multiply the layout space blindly. What each knob's value is on a layout: `perf_values`.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING
from collections.abc import Iterator

from autotune.config import LayoutConfig, Workload
from autotune.space.legality import violations
from autotune.space.perf_values import CUDA_GRAPHS, effective, exists

if TYPE_CHECKING:
    from autotune.space._files import SearchSpace

__all__ = ["CUDA_GRAPHS", "effective", "exists", "variants"]


def variants(config: LayoutConfig, space: SearchSpace, workload: Workload,
             max_changed: int = 2) -> Iterator[LayoutConfig]:
    """Legal settings of the space's performance knobs on `config`'s layout that change at most
    `max_changed` knobs from the recipe's values (the layout itself with the recipe's values excluded).

    Conditional: a child knob is tried only where its parent makes it exist, so the count stays small
    (tens per layout for qwen3_30b), not the product of every domain.
    """
    base = config.layout_only()
    names = [n for n in space.perf_domains if exists(n, base.to_dict(), workload)]
    for count in range(1, max_changed + 1):
        for chosen in itertools.combinations(names, count):
            options = [[v for v in space.perf_domains[n] if v != workload.model.perf_defaults.get(n)] for n in chosen]
            for values in itertools.product(*options):
                candidate = base.replace(**dict(zip(chosen, values)))
                if not violations(candidate, workload):
                    yield candidate


