"""What a number from outside is: one definition for the launcher boundary and the storage boundary."""

from __future__ import annotations

import math
import numbers
from typing import Any


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
