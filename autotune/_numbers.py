"""What a number from outside is: one definition for the launcher boundary and the storage boundary."""

from __future__ import annotations

import math
from typing import Any


def is_number(value: Any) -> bool:
    """An int or float, not a bool (bool is an int subclass, and True is no measurement)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_positive_finite(value: Any) -> bool:
    """A finite number > 0: what a measurement (seconds, tokens/s, GiB) is."""
    return is_number(value) and math.isfinite(value) and value > 0
