"""StudyOptions: every study option and its default, written once.

The CLI's flag defaults, `create_study` and the controller all read them from here; a study stores
its options as JSON (`autotune_studies.options`) and the controller reads them back through
`StudyOptions.from_stored`, so a study created by an older version (fewer keys) gets today's defaults.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any

from autotune.errors import ConfigError

# a controller writes its heartbeat (study and running trials) this often; silent for STALE_AFTER_HEARTBEATS
# of them, it is taken for dead: its trials are adopted (controller/loop.py) and readers say so (leaderboard)
def _heartbeat_s(default: float = 5.0) -> float:
    """$AUTOTUNE_HEARTBEAT_S (tests shorten it) when it is a positive finite number of seconds, else the
    default: read at import by every command, a typo there must not break `autotune models`."""
    try:
        value = float(os.environ.get("AUTOTUNE_HEARTBEAT_S", default))
    except ValueError:
        return default
    return value if math.isfinite(value) and value > 0 else default


HEARTBEAT_S = _heartbeat_s()
STALE_AFTER_HEARTBEATS = 3


@dataclass(frozen=True)
class StudyOptions:
    seed: int | None = None
    trial_timeout_s: float = 3600.0  # a trial is a short profiling run; past this it is TIMEOUT
    warmup_steps: int = 3  # steps excluded from the measurement (compilation, allocator warm-up)
    measured_steps: int = 5  # steps whose mean is the trial's step time (the launcher reports it)
    prune_slow: bool = True  # stop a trial whose measured steps are clearly slower than the best so far
    slow_margin: float = 0.25  # "clearly": this much slower than the best step time (a share)
    validate_steps: int = 0  # after the study, run the winner again with this many steps (0: no)
    # no run starts once the study's runs have held this many GPU-hours (None: no cap); runs in flight finish
    max_gpu_hours: float | None = None
    memory_headroom_gib: float | None = None  # None: derived from the GPU (recommend.default_headroom_gib)
    # share of the budget spent tuning performance knobs at the leading layouts (controller/knobs.py);
    # 0: layout only. Only where the model's space declares perf_knobs.
    knob_share: float = 0.1  # benchmarks/knob_tuning.py: 0.1 beat layout-only on 3 of 5 seeds, 0.2 on 1
    # benchmark-only settings (megatron/benchmark_only.py): name -> value, added to every trial's overrides
    benchmark_settings: dict[str, bool] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_stored(cls, stored: dict[str, Any] | None) -> "StudyOptions":
        """The options of a stored study; keys this version does not know are ignored, missing ones
        take the defaults above."""
        from autotune.megatron.benchmark_only import checked

        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in (stored or {}).items() if k in known and v is not None}
        values["benchmark_settings"] = checked(values.get("benchmark_settings"))
        return cls(**values)

    def to_stored(self) -> dict[str, Any]:
        """As stored in the study row (JSON): every number must be finite, NaN would be obeyed."""
        values = dataclasses.asdict(self)
        for key, value in values.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"option {key} must be a finite number, got {value}")
        return values


DEFAULTS = StudyOptions()
