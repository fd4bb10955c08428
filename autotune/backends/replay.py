"""The `replay` backend: answers trials from a table of measured layouts (CSV or Parquet).

One row per layout: the knob columns (tp, pp, vpp, cp, ep, etp, sp, mbs, recompute,
recompute_method, recompute_num_layers, dist_opt) and the command backend's result columns (status,
step_time_s, tokens_per_s_per_gpu, tflops_per_gpu, mfu, peak_mem_gib, error). A layout missing from
the table is a failed trial. `autotune export STUDY --format table` writes this format.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import threading
from pathlib import Path
from typing import Any

from autotune.backends.base import Backend, Reporter, TrialOutcome, TrialSpec, TrialStatus
from autotune._numbers import is_positive_finite
from autotune.backends.validation import parse_result
from autotune.config import ALL_KNOBS, KNOBS, LayoutConfig
from autotune.errors import ConfigError

ANSWERED_NOTHING = ("pruned", "timeout", "lost", "cancelled")  # statuses replayed as a failed run
# Rows of one layout are repeated runs, replayed as one (_merged; a straggler left out by the study's rule, see
# table_stragglers). Runs of one layout differ by a few percent,
# a slow node's run by up to a few times (a study stores and exports such a run: review found a factor e refusing
# a study's own table with a 3x straggler); rows a factor 10 apart measure different things (a typo, another
# layout, an impossible figure their mean would hide: found by review, 1e-300 s beside 30.6 s replayed as 15.3 s)
REPEAT_SPREAD_MAX = 10.0
RESULT_COLUMNS = ("status", "step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "peak_mem_gib", "error")


# pandas reads a compressed CSV by its suffix
CSV_SUFFIXES = (".csv", ".csv.gz", ".csv.bz2", ".csv.xz", ".csv.zst", ".csv.zip")
PARQUET_SUFFIXES = (".parquet", ".pq")


def table_kind(path: Path) -> str | None:
    """'csv' or 'parquet' by the file's name; None for a name that promises neither."""
    name = path.name.lower()
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    return "csv" if name.endswith(CSV_SUFFIXES) else None


def read_table(path: str | Path):
    import pandas as pd

    from autotune._paths import require_file

    path = require_file(path, "--replay file")
    kind = table_kind(path)
    if kind is None:  # found by a new-user pass: a .json table was read as CSV and "lacked column 'tp'"
        raise ConfigError(f"--replay file {path}: a replay table is CSV ({', '.join(CSV_SUFFIXES)}) or Parquet "
                          f"({', '.join(PARQUET_SUFFIXES)}), not {path.suffix or 'a file without a suffix'}")
    try:
        frame = pd.read_parquet(path) if kind == "parquet" else pd.read_csv(path)
    except UnicodeDecodeError as exc:  # Python's own words otherwise ("'utf-8' codec can't decode byte 0xff...")
        # (no offset: pandas decodes field by field, so the error's offset is within a field, not the file)
        raise ConfigError(f"--replay file {path} is not UTF-8 text (it holds the byte "
                          f"{exc.object[exc.start:exc.start + 1]!r})") from None
    except Exception as exc:  # pandas raises many types for a malformed file
        first = (str(exc).strip().splitlines() or [""])[0][:200]  # pandas messages span lines: one line only
        raise ConfigError(f"--replay file {path} cannot be read: {exc.__class__.__name__}: {first}") from None
    if kind == "csv":
        # pandas renames a second `status` column `status.1` and reads the first: which one did the table mean?
        header = [str(name) for name in pd.read_csv(path, header=None, nrows=1).iloc[0].tolist()]
        twice = sorted({name for name in header if header.count(name) > 1})
        if twice:
            raise ConfigError(f"--replay file {path}: column {twice[0][:40]!r} is given twice")
    # every layout knob is a column: a knob left out was read as LayoutConfig's default, so a table without its
    # `ep` column replayed every row as EP 1, stored under layouts that never ran (found by review)
    missing = [c for c in (*KNOBS, "status") if c not in frame.columns]
    if missing:
        listed = ", ".join(repr(c) for c in missing)
        raise ConfigError(f"--replay file {path} lacks column{'s' if len(missing) > 1 else ''} {listed}: a replay "
                          f"table names every layout knob of its rows ({', '.join(KNOBS)}; an empty cell where a knob "
                          "does not apply) and their status, as `autotune export STUDY --format table` writes it")
    if frame.empty:
        raise ConfigError(f"--replay file {path} has no rows: no layout to replay")
    return frame


def _clean(value: Any) -> Any:
    """A cell as a plain Python value: NaN (an empty cell) as None, a NumPy scalar as its number, a
    Parquet list or struct cell as a list or dict (which no check downstream accepts as a knob or metric)."""
    import numpy as np

    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def table_index(frame) -> dict[str, dict[str, Any]]:
    """Canonical layout key -> the result a run of it replays. A layout with several rows (a study's
    table holds repeated runs) replays them merged (_merged)."""
    return _index(table_rows(frame))


def _index(groups: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    left_out = table_stragglers(groups)
    # copies: the groups may be cached
    return {key: dict(_merged(rows, left_out.get(key, ()))) for key, rows in groups.items()}


def _log_speeds(rows: list[dict[str, Any]]) -> tuple[list[int], list[float]]:
    """(positions, log speeds) of a layout's completed rows, in one unit: the negative log step time, a row giving
    only a throughput converted by the tokens per step a row giving both implies (throughput x step time is the
    same for every run of a layout); without such a row, the rows of whichever figure more rows give (found by
    review: a layout whose rows gave different figures was not judged at all)."""
    completed = [i for i, r in enumerate(rows) if r["status"] == "completed"]
    step = {i: rows[i]["step_time_s"] for i in completed if rows[i].get("step_time_s") is not None}
    speed = {i: rows[i]["tokens_per_s_per_gpu"] for i in completed if rows[i].get("tokens_per_s_per_gpu") is not None}
    both = [step[i] * speed[i] for i in step if i in speed]
    if both:
        work = sorted(both)[len(both) // 2]  # tokens per step per GPU, as the rows giving both say
        step.update({i: work / speed[i] for i in speed if i not in step})
    elif len(speed) > len(step):
        step = {i: 1.0 / v for i, v in speed.items()}
    positions = sorted(step)
    return positions, [-math.log(step[i]) for i in positions]


# The study weighs at most _run_noise.STRAGGLER_MAX stragglers (it judges at every proposal); a table is judged
# once per file, and may join several sweeps with more (found by review: with 11 or more the cap kept them all)
TABLE_STRAGGLER_MAX = 200


def table_stragglers(groups: dict[str, list[dict[str, Any]]]) -> dict[str, list[int]]:
    """Per layout key, the positions of its completed rows left out as stragglers by the study's own rule
    (_run_noise.straggler_runs, over every layout the table holds more than one completed row of), so that a
    replayed study's table reads as the study read its runs (found by review: a 3x slow-node run was
    averaged in). A disputed pair (two rows that disagree: both out by the rule) stays merged, as the
    recommendation counts its average once: two runs cannot say which one strayed. As in a study, many far
    rows are read as a noisy cluster, not as stragglers (each straggler is a priori 1% likely)."""
    from autotune._run_noise import straggler_runs

    repeated = [(key, *speeds) for key, speeds in ((k, _log_speeds(rows)) for k, rows in groups.items())
                if len(speeds[0]) > 1]
    if not repeated:
        return {}
    out = {}
    left_out = straggler_runs([speeds for _, _, speeds in repeated], TABLE_STRAGGLER_MAX)
    for (key, positions, _), left in zip(repeated, left_out):
        if left and len(left) < len(positions):
            out[key] = [positions[j] for j in left]
    return out


def table_rows(frame) -> dict[str, list[dict[str, Any]]]:
    """Canonical layout key -> its rows (status and result columns). Every row is checked first (one line
    naming the row: a status other than completed / oom / failed, a metric that is not a finite number
    > 0; rows of a status that answered nothing, from older exports, are failed runs)."""
    from autotune.backends.validation import METRIC_KEYS, RESULT_STATUSES

    groups: dict[str, list[dict[str, Any]]] = {}
    lines: dict[str, list[int]] = {}  # the table's line of each row, per layout
    for number, row in enumerate(frame.to_dict(orient="records"), start=2):  # the CSV's line (header = 1)
        row = {k: _clean(v) for k, v in row.items()}
        if row.get("status") is None or not str(row["status"]).strip():
            raise ConfigError(f"--replay table, row {number}: the status is empty (must be one of "
                              "completed, oom, failed)")
        status = str(row.get("status")).lower()
        if status in ANSWERED_NOTHING:  # tables exported before 2026-11-24 held these: no result to replay
            status = "failed"
        if status not in RESULT_STATUSES:
            raise ConfigError(f"--replay table, row {number}: status {str(row.get('status'))[:40]!r} "
                              f"(must be one of {', '.join(RESULT_STATUSES)})")
        for key in METRIC_KEYS:
            value = row.get(key)
            if value is not None and not is_positive_finite(value):
                raise ConfigError(f"--replay table, row {number}: {key} = {str(value)[:40]!r} "
                                  "(must be a finite number > 0, or empty)")
        if status == "completed" and row.get("step_time_s") is None and row.get("tokens_per_s_per_gpu") is None:
            raise ConfigError(f"--replay table, row {number}: completed without a step_time_s or "
                              "tokens_per_s_per_gpu (an empty cell and NaN read alike)")
        try:
            config = LayoutConfig.from_mapping({k: row[k] for k in ALL_KNOBS if k in row and row[k] is not None})
        except (ConfigError, TypeError, ValueError) as exc:
            raise ConfigError(f"--replay table, row {number}: not a layout ({str(exc)[:120]})") from None
        groups.setdefault(config.key(), []).append({**{k: row.get(k) for k in RESULT_COLUMNS if k in row},
                                                    "status": status})
        lines.setdefault(config.key(), []).append(number)
    for key, rows in groups.items():
        _check_repeats(rows, lines[key])
    return groups


def _check_repeats(rows: list[dict[str, Any]], numbers: list[int]) -> None:
    """ConfigError when a layout's completed rows disagree beyond what repeated runs do (REPEAT_SPREAD_MAX)."""
    completed = [(n, r) for n, r in zip(numbers, rows) if r["status"] == "completed"]
    for metric in ("step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu"):
        values = [(r[metric], n) for n, r in completed if r.get(metric) is not None]
        if len(values) < 2:
            continue
        (low, low_row), (high, high_row) = min(values), max(values)
        if high >= REPEAT_SPREAD_MAX * low:
            raise ConfigError(f"--replay table, rows {low_row} and {high_row}: the same layout with {metric} "
                              f"{low:.4g} and {high:.4g}, a factor {high / low:.3g} apart; repeated runs differ by a "
                              f"few percent, so one of them is not this layout's measurement (fix or remove it)")


def table_groups(path: str | Path) -> dict[str, list[dict[str, Any]]]:
    """table_rows of the file at `path`, parsed once per version of the file: a `start` asks for a table
    five times (the option check, the search's restriction, the coverage line, the repeated rows, the
    backend), and a Parquet table of 10^5 rows takes seconds to check row by row. Keyed by the file's
    identity, size and modification time, so a file edited between two reads is read again. Callers must
    not change what it returns."""
    from autotune._paths import require_file

    stat = require_file(path, "--replay file").stat()
    return _groups(str(path), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _groups(path: str, _device: int, _inode: int, _size: int, _mtime_ns: int) -> dict[str, list[dict[str, Any]]]:
    return table_rows(read_table(path))


def repeated_rows(path: str | Path) -> tuple[int, int, int]:
    """(layouts with several rows, of them those whose rows disagree on the outcome, rows left out as
    stragglers): what `start` says of a table before replaying it merged (found by review: a layout that
    completed once and ran out of memory once replayed as completed, and nothing said so)."""
    groups = table_groups(path)
    repeated = [rows for rows in groups.values() if len(rows) > 1]
    # a layout with an OOM row replays as that row: nothing of it is left out (review)
    stragglers = sum(len(left) for key, left in table_stragglers(groups).items()
                     if not any(r["status"] == "oom" for r in groups[key]))
    return len(repeated), sum(len({r["status"] for r in rows}) > 1 for rows in repeated), stragglers


def _merged(rows: list[dict[str, Any]], stragglers=()) -> dict[str, Any]:
    """One result for a layout's rows: an OOM row when it has one (a layout that ran out of memory in one
    of its runs does not fit reliably, as recommend.recommend judges it; second review: a completed row
    outranked it, and a study's own risky layout replayed as safe), else the mean step time of its
    completed runs but the `stragglers` (positions: table_stragglers), and throughputs that agree with it
    (harmonic means: a throughput is work over the step time); else the first (a failure)."""
    oom = next((r for r in rows if r["status"] == "oom"), None)
    if oom is not None:
        return oom
    completed = [r for i, r in enumerate(rows) if r["status"] == "completed" and i not in stragglers]
    if len(completed) < 2:
        return completed[0] if completed else rows[0]
    merged = dict(completed[0])
    steps = [r["step_time_s"] for r in completed if r.get("step_time_s") is not None]
    merged["step_time_s"] = sum(steps) / len(steps) if steps else None
    for key in ("tokens_per_s_per_gpu", "tflops_per_gpu", "mfu"):
        values = [r[key] for r in completed if r.get(key) is not None]
        merged[key] = len(values) / sum(1 / v for v in values) if values else None
    peaks = [r["peak_mem_gib"] for r in completed if r.get("peak_mem_gib") is not None]
    merged["peak_mem_gib"] = max(peaks) if peaks else None
    return merged


def table_keys(path: str | Path) -> set[str]:
    """The layouts a replay table measured (their canonical keys)."""
    return set(table_groups(path))


class ReplayBackend(Backend):
    name = "replay"
    repeatable_results = True  # the table holds one measurement per layout
    cli_options = {**Backend.cli_options, "replay": "replay"}

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        from autotune.backends.simulate import NUMERIC_OPTIONS, check_numbers

        if not options.get("replay"):
            raise ConfigError("--backend replay needs --replay FILE (CSV or Parquet)")
        # a replayed run is charged the simulate backend's start-up (run below)
        check_numbers(options, {"startup_s": NUMERIC_OPTIONS["startup_s"]}, "replay")
        _index(table_groups(options["replay"]))  # every row checked, and merged as a run would be
        return options

    @classmethod
    def answerable_layouts(cls, options: dict[str, Any]) -> set[str]:
        return table_keys(options["replay"])

    @classmethod
    def startup_seconds(cls, options: dict[str, Any]) -> float:
        from autotune.backends.simulate import startup_seconds

        return startup_seconds(options)  # charged as a simulated run is (run below)

    @classmethod
    def held_seconds(cls, options: dict[str, Any], step_time_s: float, warmup_steps: int,
                     measured_steps: int) -> float:
        return cls.startup_seconds(options) + (warmup_steps + measured_steps) * step_time_s  # as run charges it

    @classmethod
    def known_step_seconds(cls, options: dict[str, Any], key: str) -> float | None:
        """The step time the table's row of this layout gives (a completed row), else None."""
        row = _index(table_groups(options["replay"])).get(key)
        if row is None or row.get("status") != "completed":
            return None
        step = row.get("step_time_s")
        return float(step) if is_positive_finite(step) else None

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self._index = _index(table_groups(self.options["replay"]))

    def run(self, spec: TrialSpec, report: Reporter, cancelled: threading.Event) -> TrialOutcome:
        key = LayoutConfig.from_mapping(spec.config).key()
        row = self._index.get(key)
        if row is None:
            return TrialOutcome(spec.trial, TrialStatus.FAILED, error="layout not in the replay table")
        result = {k: v for k, v in row.items() if v is not None}
        if result["status"] == "completed" and "step_time_s" not in result:
            # a table of throughputs alone (table_index lets it through, as tables are often published):
            # the step time they imply (found by review: every such run failed, "has no step_time_s")
            tokens_per_step = spec.global_batch_size * spec.seq_length
            result["step_time_s"] = tokens_per_step / (result["tokens_per_s_per_gpu"] * spec.gpus)
        outcome = parse_result(spec, result, [], 0.0)
        # what the run would have held its GPUs for, as a simulated run is charged (start-up, then the warm-up
        # and measured steps; a run that ended otherwise only the start-up): GPU-hours and the in-process
        # dispatcher's clock then mean the same for a replayed study as for a simulated one
        from autotune.backends.simulate import startup_seconds

        steps_s = (spec.warmup_steps + spec.measured_steps) * outcome.step_time_s \
            if outcome.status == TrialStatus.COMPLETED and is_positive_finite(outcome.step_time_s) else 0.0
        startup_s = startup_seconds({**self.options, **spec.backend_options})
        return dataclasses.replace(outcome, wall_time_s=startup_s + steps_s)
