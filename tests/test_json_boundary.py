"""autotune._json: what the strict reader flags, and what it lets through, at its bounds."""

from __future__ import annotations

import math

import pytest

from autotune._json import MAX_INTEGER_DIGITS, loads_flagged


@pytest.mark.parametrize("text,problem", [
    ('{"a": 1, "a": 1}', "key 'a' is given twice"),  # even with equal values: which was meant is unknowable
    ('{"a": 1, "\\u0061": 2}', "key 'a' is given twice"),  # an escape is the same key
    ('{"x": [{"m": {"k": 1, "k": 2}}]}', "key 'k' is given twice"),  # nested anywhere
    ('{"n": ' + "9" * (MAX_INTEGER_DIGITS + 1) + "}", f"an integer of {MAX_INTEGER_DIGITS + 1} digits"),
    ('{"n": -' + "9" * (MAX_INTEGER_DIGITS + 1) + "}", f"an integer of {MAX_INTEGER_DIGITS + 1} digits"),
    ('{"n": ' + "9" * 4301 + "}", "an integer of 4301 digits"),  # Python's own int() limit raised ValueError
])
def test_what_no_honest_writer_produces_is_flagged(text, problem):
    value, found = loads_flagged(text)
    assert found == problem and isinstance(value, dict)


def test_ordinary_json_passes_as_json_reads_it():
    value, problem = loads_flagged('{"n": ' + "9" * MAX_INTEGER_DIGITS + ', "f": 1' + "0" * 5000 + '.5, "e": 1e999, '
                                   '"s": "x", "l": [1, 2], "k": NaN}')
    assert problem is None and value["n"] == int("9" * MAX_INTEGER_DIGITS) and value["l"] == [1, 2]
    assert math.isinf(value["f"]) and math.isinf(value["e"]) and math.isnan(value["k"])  # finite checks come later
    assert loads_flagged("[1, 2]") == ([1, 2], None)


@pytest.mark.parametrize("text,error", [("{not json", ValueError), ("[" * 100_000, RecursionError)])
def test_what_is_no_json_raises_as_json_does(text, error):
    with pytest.raises(error):
        loads_flagged(text)
