"""JSON from outside read strictly: one parser for a launcher's result line, a `check` line and a run's record.

Python's json keeps the last of a key given twice without a word (`{"status": "oom", "status": "completed"}`
is a completed run), and raises ValueError on an integer of more than 4,300 digits, which readers that
catch "not JSON" turned into "no result at all". `loads_flagged` parses everything json does and says what
in it no honest writer produces, so that each boundary can refuse it in its own words.
"""

from __future__ import annotations

import json
from typing import Any

# No count, size or time a launcher or user gives has more digits; a longer literal is an attack or a bug
# (and Python's int() refuses more than 4,300 digits with a ValueError that reads like "not JSON").
MAX_INTEGER_DIGITS = 400


def loads_flagged(text: str) -> tuple[Any, str | None]:
    """(value, problem): the JSON value of `text` and the first thing in it that no honest writer produces
    (a key given twice in one object, an integer of more than MAX_INTEGER_DIGITS digits, read as 0), or None.
    Raises ValueError for text that is not JSON and RecursionError for brackets nested past the stack."""
    problems: list[str] = []

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                problems.append(f"key {key[:60]!r} is given twice")
            out[key] = value
        return out

    def integer(literal: str) -> int:
        if len(literal.lstrip("-")) > MAX_INTEGER_DIGITS:
            problems.append(f"an integer of {len(literal.lstrip('-'))} digits")
            return 0
        return int(literal)

    value = json.loads(text, object_pairs_hook=unique, parse_int=integer)
    return value, (problems[0] if problems else None)
