"""A 16-GPU trial on a simulated Ray cluster of two 8-GPU nodes: all of its nodes or none."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow
HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_sixteen_gpu_trial_spans_both_nodes(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    torchrun = bin_dir / "torchrun"
    torchrun.write_text(open(os.path.join(HERE, "fixtures", "fake_torchrun.py")).read())
    torchrun.chmod(0o755)
    argv_log = tmp_path / "argv.jsonl"
    fake_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": os.path.dirname(HERE),
                "FAKE_TORCHRUN_ARGS": str(argv_log)}
    result = subprocess.run([sys.executable, os.path.join(HERE, "fixtures", "two_node_study.py"),
                             f"sqlite:///{tmp_path / 'two.db'}", json.dumps(fake_env), str(tmp_path / "runs")],
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout.strip().splitlines()[-1])
    assert data["capacity"] == 1  # 16 GPUs in the cluster, 16 per trial
    assert len(data["bundle_nodes"]) == 2  # STRICT_SPREAD: one bundle per node
    assert data["counts"]["dispatched"] == 2 and data["counts"]["completed"] == 2
    calls = [json.loads(line) for line in argv_log.read_text().splitlines()]
    ranks = sorted(a for c in calls for a in c if a.startswith("--node-rank"))
    assert ranks == ["--node-rank=0", "--node-rank=0", "--node-rank=1", "--node-rank=1"]


def test_a_local_study_ignores_a_ray_cluster_already_running_on_the_machine(tmp_path):
    """ray.init() without an address would join a running cluster; local studies start their own."""
    script = f"""
import subprocess, sys
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, head_node_args={{"num_cpus": 1, "num_gpus": 0}})
try:
    result = subprocess.run([sys.executable, "-m", "autotune", "start", "--model", "llama3_8b", "--gpus", "8",
                             "--budget", "2", "--storage", "sqlite:///{tmp_path / 'other.db'}", "--json"],
                            capture_output=True, text=True, timeout=300)
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    sys.exit(result.returncode)
finally:
    cluster.shutdown()
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout)["dispatched"] == 2
