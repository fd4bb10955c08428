"""Shared fixtures. Ray is started once per session (it costs seconds and memory), never per test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def run_cli(*args: str, stdin: str | None = None, env: dict | None = None, timeout: float = 120):
    """Run the real `autotune` command in a subprocess; returns the CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "autotune", *args], input=stdin, capture_output=True,
                          text=True, env=full_env, timeout=timeout)


def json_lines(text: str) -> list:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def cli():
    return run_cli
