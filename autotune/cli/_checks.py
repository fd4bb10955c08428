"""Argument types that check numbers before anything opens storage or starts Ray.

argparse reports a type's ArgumentTypeError as one line with exit code 2 (`OneLineParser`), so a
bad number never reaches a database (where NaN would be written and 2**70 would overflow a BIGINT)
or a socket (where port 70000 raises OverflowError).
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

from autotune._numbers import parse_float, parse_int
from autotune.errors import ConfigError
from autotune.config import MAX_SEED, MAX_WORKLOAD_COUNT

MAX_TRIAL_NUMBER = 2**31 - 1  # the INTEGER column trial numbers live in (32-bit on PostgreSQL)
MAX_PORT = 65535


def ascii_int(text: str) -> int:
    """An argparse type: an integer written in ASCII digits (checked further where it is used). A
    ValueError makes argparse say "invalid int value: 'abc'" (also for 4,301 digits, ２ and 1_6: parse_int)."""
    return parse_int(text)


ascii_int.__name__ = "int"  # argparse names the type in its error: "invalid int value: '２'"


def int_in(low: int, high: int, what: str = "") -> Callable[[str], int]:
    """An argparse type: an integer in [low, high]."""
    def parse(text: str) -> int:
        value = ascii_int(text)
        if value < low and low == 1:
            raise argparse.ArgumentTypeError(f"{what or 'value'} must be > 0, got {text[:40]}")
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{what or 'value'} must be in {low}..{high}, got {text[:40]}")
        return value

    parse.__name__ = "int"
    return parse


def float_in(low: float, high: float = math.inf, low_open: bool = False, what: str = "") -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high] (or (low, high] when `low_open`)."""
    def parse(text: str) -> float:
        value = parse_float(text)  # ValueError: argparse says "invalid float value: 'abc'"
        too_low = value <= low if low_open else value < low
        if not math.isfinite(value) or too_low or value > high:
            bound = f"{'>' if low_open else '>='} {low:g}" + (f" and <= {high:g}" if math.isfinite(high) else "")
            raise argparse.ArgumentTypeError(f"{what or 'value'} must be a finite number {bound}, got {text[:40]}")
        return value

    parse.__name__ = "float"
    return parse


trial_number = int_in(0, MAX_TRIAL_NUMBER, "a trial number")
seed = int_in(0, MAX_SEED, "the seed")


def knob_int(name: str) -> Callable[[str], int]:
    """An argparse type for a knob's integer: the knob's own rules judge it (0 and negatives included), but one
    beyond a billion is said here, cut (found by an adversarial pass: a 5,000-digit --tp was echoed whole inside
    the legality error)."""
    def parse(text: str) -> int:
        value = ascii_int(text)
        if abs(value) > MAX_WORKLOAD_COUNT:
            raise argparse.ArgumentTypeError(f"{name} must be at most {MAX_WORKLOAD_COUNT:,}, got {text[:40]}"
                                             f"{'...' if len(text) > 40 else ''}")
        return value

    parse.__name__ = "int"
    return parse


def positive(name: str) -> Callable[[str], int]:
    """An argparse type for a count option `name`: an integer > 0 (and below a billion)."""
    return int_in(1, MAX_WORKLOAD_COUNT, name)


port = int_in(1, MAX_PORT, "the port")
port_or_zero = int_in(0, MAX_PORT, "the port (0: any free one)")
seconds = float_in(0.0, 10 * 365 * 86400.0, low_open=True, what="seconds")


def check_port(name: str, value: int | None, allow_zero: bool = False) -> None:
    """For values set in code paths that bypass argparse types."""
    if value is not None and not (0 if allow_zero else 1) <= value <= MAX_PORT:
        raise ConfigError(f"{name} must be in {0 if allow_zero else 1}..{MAX_PORT}, got {value}")
