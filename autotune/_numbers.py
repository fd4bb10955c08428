"""What a number from outside is: one definition for the launcher boundary and the storage boundary."""

from __future__ import annotations

import math
import numbers
import re
from typing import Any

_ASCII_INT = re.compile(r"\s*[+-]?[0-9]+\s*")


def parse_int(text: str) -> int:
    """An integer written as a person writes one: ASCII digits, an optional sign. Python's int() also
    reads other scripts' digits (fullwidth ２, Arabic-Indic ١٦) and underscores (1_6 is 16), which no
    launcher, space file or user means; ValueError for those (as int() raises for 'abc')."""
    if not _ASCII_INT.fullmatch(text):
        raise ValueError(f"not an integer: {text[:40]!r}")
    return int(text)


def parse_float(text: str) -> float:
    """A number as float() reads it, in ASCII and without underscores (see parse_int); ValueError otherwise."""
    if not text.isascii() or "_" in text:
        raise ValueError(f"not a number: {text[:40]!r}")
    return float(text)


def is_number(value: Any) -> bool:
    """A real number (int, float, a numpy scalar a backend computed), not a bool: bool is an int
    subclass, and True is no measurement."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """A number within float range: JSON reads a 400-digit literal as an int that no float holds (and
    math.isfinite raises on it), as impossible as infinity for anything autotune measures."""
    if not is_number(value):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def is_positive_finite(value: Any) -> bool:
    """A finite number > 0: what a measurement (seconds, tokens/s, GiB) is."""
    return is_finite_number(value) and bool(value > 0)


# The parts of a step a trace measures (seconds per step on a traced rank): time in compute kernels and
# communication not hidden behind them (megatron/trace.py). The calibration fits the model's terms to them.
MEASURED_TERMS = ("compute", "exposed_communication")


def measured_terms(value: Any, step_time_s: float | None = None) -> dict[str, float] | None:
    """`value` as a measured breakdown ({term: seconds per step}, terms of MEASURED_TERMS, each finite and
    >= 0, together within the step time when it is known), or None when it is not one (a launcher's or a hand
    edit's: an advisory measurement is left out rather than trusted or refused whole)."""
    if not isinstance(value, dict) or not value or not set(value) <= set(MEASURED_TERMS):
        return None
    if not all(is_finite_number(v) and v >= 0 for v in value.values()):
        return None
    if step_time_s is not None and sum(value.values()) > step_time_s * 1.05:
        # compute and exposed communication never overlap (exposed: not hidden behind compute), so together
        # they fit in the step (5% for two clocks); more was not measured on this run's steps
        return None
    return {key: float(v) for key, v in value.items()}
