"""What a stored row may hold, checked where rows become records (the storage boundary).

autotune writes only checked values (launcher numbers are finite and positive, statuses are enum
values, configs are JSON objects), but SQLite is dynamically typed and a store is a file a person
can edit: a text in a Float column, a negative throughput or an unknown status would otherwise
surface far away as a TypeError in the ranking or a KeyError in a count. Every row read is checked
here against the same rules the writers follow, and a row that breaks one is a one-line
StorageError naming the row, the column and the value, never a traceback and never a silent guess.

`predicted` (the cost model's advisory prediction stored with a trial) is not checked here: it is
validated where it is used, run by run, and a run whose prediction is unusable is left out of the
pooling rather than making the whole study unreadable.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from autotune._numbers import is_finite_number, is_positive_finite
from autotune.config import MAX_GPU_HOURS
from autotune.errors import StorageError
from autotune.storage.models import StudyStatus, TrialNumbering, TrialOrigin, TrialRecordStatus

Check = Callable[[Any], bool]
MAX_STUDY_NAME = 200  # autotune_studies.name is String(200)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and is_finite_number(value)  # not a bool, within float range


def _count(value: Any) -> bool:
    return _integer(value) and value >= 0


def _text(value: Any) -> bool:
    return isinstance(value, str)


def _printable(limit: int) -> Check:
    """1..limit printable characters: a name printed by `status`, the leaderboard and `compare`, where an
    escape sequence or a line break edited into the store would reach the terminal."""
    return lambda value: isinstance(value, str) and 0 < len(value) <= limit and value.isprintable()


# what `start` takes as a study name (controller.session.check_study_name asks this, too)
is_study_name = _printable(MAX_STUDY_NAME)


def _mapping(value: Any) -> bool:
    return isinstance(value, dict)


def _one_of(values: type) -> Check:
    allowed = frozenset(v.value for v in values)
    return lambda value: isinstance(value, str) and value in allowed


def _optional(check: Check) -> Check:
    return lambda value: value is None or check(value)


def _knob_values(value: Any) -> bool:
    """A config: a JSON object of knob values, each a text, a bool, null or a number within float range
    (the cost model's arrays hold them as floats: a 400-digit integer would end in an OverflowError),
    that makes a configuration (known knobs, each of its type: `"tp": "abc"` is refused here, where the
    message names the store, the row and the column, not later in whichever command reads it).
    Legality is not checked: a stored layout may break a rule a newer autotune added."""
    from autotune.config import LayoutConfig
    from autotune.errors import ConfigError

    if not (isinstance(value, dict) and all(
            v is None or isinstance(v, (str, bool)) or is_finite_number(v) for v in value.values())):
        return False
    try:
        LayoutConfig.from_mapping(value)
    except (ConfigError, TypeError, ValueError):
        return False
    return True


def _step_times(value: Any) -> bool:
    return isinstance(value, list) and all(is_positive_finite(t) for t in value)


def _positive_count(value: Any) -> bool:
    from autotune.config import MAX_WORKLOAD_COUNT

    return _integer(value) and 0 < value <= MAX_WORKLOAD_COUNT


# What a study's workload holds (space._workload.study_space_and_workload reads every key; so does the
# read side, e.g. recommend's GPU memory): checked here, so no reader meets a missing key.
WORKLOAD_KEYS: dict[str, Check] = {"gpus": _positive_count, "gpus_per_node": _positive_count, "gpu": _text,
                                   "global_batch_size": _positive_count, "seq_length": _positive_count,
                                   "precision": _text}


def _workload(value: Any) -> bool:
    from autotune.config import is_network_gbps

    return (isinstance(value, dict) and all(key in value and check(value[key]) for key, check in WORKLOAD_KEYS.items())
            # a cluster's own scale-out bandwidth, only when it has one (config.Cluster.to_dict)
            and _optional(is_network_gbps)(value.get("network_gbps")))


def _domains(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, list) for k, v in value.items())


def _space(value: Any) -> bool:
    return (isinstance(value, dict) and _domains(value.get("domains"))
            and _domains(value.get("perf_domains", {})) and isinstance(value.get("policy", {}), dict)
            and _optional(_text)(value.get("source")) and _optional(_text)(value.get("document")))


MAX_GPU_SECONDS_READ = 1e15  # a trial's GPU time over all its attempts (30 million GPU-years)


def _physical_bounds() -> dict[str, float]:
    """Upper bounds no run on any GPU of the catalog can exceed, whatever its study: the writers check each
    run against its own GPU and model (backends/validation.py); a row read back past these was edited by
    hand (review: 1e12 tokens/s/GPU was shown, exported and ranked first)."""
    from autotune.catalog import GPU_TYPES, OOM_MEMORY_FACTOR

    # with a margin of MARGIN over the catalog's largest figures, so that a later correction of a catalog
    # figure never makes a store written before it unreadable (second review); a hand edit to 1e12 is refused
    peak_tflops = max(max(g.peak_tflops.values()) for g in GPU_TYPES.values())
    return {
        "tflops_per_gpu": MARGIN * peak_tflops,
        "mfu": MARGIN * max(max(g.peak_tflops.values()) / g.bf16_peak_tflops for g in GPU_TYPES.values()),
        "peak_mem_gib": MARGIN * max(g.memory_gib for g in GPU_TYPES.values()) * OOM_MEMORY_FACTOR,
        # ~6 FLOPs per parameter and token: a model of 10,000 parameters at the largest peak (a space file
        # may describe a tiny model; the writers check each run against its own model's FLOPs); margin enough
        "tokens_per_s_per_gpu": peak_tflops * 1e12 / 6e4,
    }


MARGIN = 4.0


PHYSICAL = _physical_bounds()


def _metric(name: str) -> tuple[Check, str]:
    bound = PHYSICAL[name]
    return (_optional(lambda v: is_positive_finite(v) and v <= bound),
            f"a positive number at most {bound:.4g} (beyond any GPU of the catalog)")

# Columns of a trial row and what autotune writes into them. Metrics are positive when present, the
# rule the backends' outcome validation applies before anything is stored (backends/validation.py).
TRIAL_RULES: dict[str, tuple[Check, str]] = {
    "number": (_integer, "an integer"),
    "optuna_trial_number": (_optional(_integer), "an integer"),
    "config": (_knob_values, "a JSON object of knob values"),
    "config_key": (_text, "a text"),
    "dispatched": (lambda v: isinstance(v, bool), "true or false"),
    "status": (_one_of(TrialRecordStatus), "a trial status"),
    "reason": (_optional(_text), "a text"),
    "message": (_optional(_text), "a text"),
    "implied_by_trial": (_optional(_integer), "an integer"),
    "strategy_note": (_optional(_text), "a text"),
    "origin": (_one_of(TrialOrigin), "a trial origin"),
    "worker_losses": (_count, "a count"),
    "attempt": (_count, "a count"),
    "step_time_s": (_optional(is_positive_finite), "a positive finite number"),
    "tokens_per_s_per_gpu": _metric("tokens_per_s_per_gpu"),
    "tflops_per_gpu": _metric("tflops_per_gpu"),
    "mfu": _metric("mfu"),
    "peak_mem_gib": _metric("peak_mem_gib"),
    "step_times_s": (_step_times, "a list of positive finite numbers"),
    # bounded so that a study's sum stays finite (review: two hand-edited 1e308 printed inf and JSON Infinity);
    # the store adds at most 1e10 per attempt (repository.MAX_GPU_SECONDS_PER_ATTEMPT)
    "gpu_seconds": (lambda v: is_finite_number(v) and 0 <= v <= MAX_GPU_SECONDS_READ,
                    f"a number within 0..{MAX_GPU_SECONDS_READ:g}"),
    "artifacts": (_mapping, "a JSON object"),
    "controller_id": (_optional(_text), "a text"),
}

STUDY_RULES: dict[str, tuple[Check, str]] = {
    "name": (is_study_name, f"1..{MAX_STUDY_NAME} printable characters"),
    "model": (_printable(100), "1..100 printable characters"),
    "workload": (_workload, "a workload (gpus, gpus_per_node, gpu, global_batch_size, seq_length, precision; "
                             "network_gbps when the cluster has its own)"),
    "space": (_space, "a space (knob domains as lists)"),
    "budget": (lambda v: _count(v) and v >= 1, "a count of at least 1"),  # every study was created with one
    "sampler": (_printable(100), "1..100 printable characters"),
    "backend": (_printable(100), "1..100 printable characters"),
    "backend_options": (_mapping, "a JSON object"),
    "options": (lambda v: _options(v), "a JSON object of study options, each of its type and range"),
    "optuna_study_name": (_text, "a text"),
    "status": (_one_of(StudyStatus), "a study status"),
    "controller_id": (_optional(_text), "a text"),
    "numbering": (_one_of(TrialNumbering), "a numbering"),
}


def _short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _refuse(what: str, column: str, value: Any, expected: str) -> StorageError:
    shown = _short(value)
    return StorageError(f"{what} holds {column} = {shown}, not {expected}: autotune does not write that "
                        f"(was the database edited by hand, or written by a version that did not yet "
                        f"validate launcher results?); nothing was changed")


def _check(rules: dict[str, tuple[Check, str]], values: dict[str, Any], what: str) -> dict[str, Any]:
    for column, (check, expected) in rules.items():
        if column in values and not check(values[column]):
            raise _refuse(what, column, values[column], expected)
    return values


def check_trial_values(values: dict[str, Any]) -> dict[str, Any]:
    """`values` (a trial row's columns by name), unchanged when every column holds what autotune writes;
    otherwise a StorageError naming the row, the first offending column and its value."""
    return _check(TRIAL_RULES, values, f"trial {_short(values.get('number'))} of study {_short(values.get('study_id'))}")


def _options(value: Any) -> bool:
    """A study's options as autotune writes them (controller/options.StudyOptions): each known key of its type
    and range (found by an adversarial pass: a hand-edited `trial_timeout_s: "abc"` made `resume` fail with a
    traceback and leave the study running, -5 timed out every run, `seed: "x"` failed inside numpy)."""
    if not _mapping(value):
        return False

    def number(v, low=0.0, high=math.inf, low_open=True):
        return is_finite_number(v) and not isinstance(v, bool) and (v > low if low_open else v >= low) and v <= high

    def integer(v, low=0):
        return isinstance(v, int) and not isinstance(v, bool) and low <= v <= 10 ** 9

    checks = {"seed": lambda v: v is None or isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2 ** 63,
              "trial_timeout_s": lambda v: number(v, 0.0, 10 ** 9),
              "warmup_steps": integer, "measured_steps": lambda v: integer(v, 1), "validate_steps": integer,
              "prune_slow": lambda v: isinstance(v, bool),
              "slow_margin": lambda v: number(v, 0.0, 100.0, low_open=False),
              "memory_headroom_gib": lambda v: v is None or number(v, 0.0, 10 ** 6, low_open=False),
              "knob_share": lambda v: number(v, 0.0, 1.0, low_open=False),
              "max_gpu_hours": lambda v: v is None or number(v, 0.0, MAX_GPU_HOURS),
              "benchmark_settings": lambda v: v is None or _mapping(v)}
    return all(check(value[key]) for key, check in checks.items() if key in value)


def check_study_values(values: dict[str, Any]) -> dict[str, Any]:
    """The same for a study row; and its Optuna study must be its own (named as the study, or `autotune:NAME`,
    as create_study names it): a hand edit naming another study's made `resume` and `import-log` write into
    that study's Optuna study (found by an adversarial pass)."""
    what = f"study {_short(values.get('name'))}"  # the name may be what is wrong
    values = _check(STUDY_RULES, values, what)
    name, optuna_name = values.get("name"), values.get("optuna_study_name")
    if "name" in values and "optuna_study_name" in values and optuna_name not in (name, f"autotune:{name}"):
        raise _refuse(what, "optuna_study_name", optuna_name, "the study's own name (or autotune:NAME)")
    return values
