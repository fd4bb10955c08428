"""The `replay` backend: answers trials from a table of measured layouts (CSV or Parquet).

One row per layout: the knob columns (tp, pp, vpp, cp, ep, etp, sp, mbs, recompute,
recompute_method, recompute_num_layers, dist_opt) and the command backend's result columns (status,
step_time_s, tokens_per_s_per_gpu, tflops_per_gpu, mfu, peak_mem_gib, error). A layout missing from
the table is a failed trial. `autotune export STUDY --format table` writes this format.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any

from autotune.backends.base import Backend, Reporter, TrialOutcome, TrialSpec, TrialStatus
from autotune.backends.validation import parse_result
from autotune.config import ALL_KNOBS, LayoutConfig
from autotune.errors import ConfigError

RESULT_COLUMNS = ("status", "step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "peak_mem_gib", "error")


def read_table(path: str | Path):
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--replay file {path} does not exist")
    try:
        frame = pd.read_parquet(path) if path.suffix in (".parquet", ".pq") else pd.read_csv(path)
    except Exception as exc:  # pandas raises many types for a malformed file
        first = (str(exc).strip().splitlines() or [""])[0][:200]  # pandas messages span lines: one line only
        raise ConfigError(f"--replay file {path} cannot be read: {exc.__class__.__name__}: {first}") from None
    missing = [c for c in ("tp", "pp", "status") if c not in frame.columns]
    if missing:
        raise ConfigError(f"--replay file {path} lacks column {missing[0]!r}")
    return frame


def _clean(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def table_index(frame) -> dict[str, dict[str, Any]]:
    index: dict[str, dict[str, Any]] = {}
    for row in frame.to_dict(orient="records"):
        row = {k: _clean(v) for k, v in row.items()}
        config = LayoutConfig.from_mapping({k: row[k] for k in ALL_KNOBS if k in row and row[k] is not None})
        index[config.key()] = {k: row.get(k) for k in RESULT_COLUMNS if k in row}
    return index


def table_keys(path: str | Path) -> set[str]:
    """The layouts a replay table measured (their canonical keys)."""
    return set(table_index(read_table(path)))


class ReplayBackend(Backend):
    name = "replay"
    repeatable_results = True  # the table holds one measurement per layout
    cli_options = {**Backend.cli_options, "replay": "replay"}

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        if not options.get("replay"):
            raise ConfigError("--backend replay needs --replay FILE (CSV or Parquet)")
        table_index(read_table(options["replay"]))
        return options

    @classmethod
    def answerable_layouts(cls, options: dict[str, Any]) -> set[str]:
        return table_keys(options["replay"])

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self._index = table_index(read_table(self.options["replay"]))

    def run(self, spec: TrialSpec, report: Reporter, cancelled: threading.Event) -> TrialOutcome:
        key = LayoutConfig.from_mapping(spec.config).key()
        row = self._index.get(key)
        if row is None:
            return TrialOutcome(spec.trial, TrialStatus.FAILED, error="layout not in the replay table")
        return parse_result(spec, {k: v for k, v in row.items() if v is not None}, [], 0.0)
