"""A node that dies mid-trial: the trial is lost, retried once on other resources, the study finishes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_node_lost_mid_trial_is_retried_on_another_node(tmp_path):
    result = subprocess.run([sys.executable, os.path.join(HERE, "fixtures", "node_loss_study.py"),
                             f"sqlite:///{tmp_path / 'loss.db'}"], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["removed"] == 1
    assert data["counts"]["dispatched"] == 2 and data["counts"]["completed"] == 2
    first = data["trials"][0]
    assert first["worker_losses"] == 1 and first["attempt"] == 2 and first["status"] == "completed"
