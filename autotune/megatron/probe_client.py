"""Driving shared/tools/megatron-probe: Megatron-Bridge's own override parser, runtime_config_update /
validate() and parallel-grid checks, run for real in a Python 3.12 side environment on a CPU.

Used by tests/test_probe.py to prove that the overrides autotune emits are accepted by the real code.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Iterable

from autotune.config import LayoutConfig, Workload
from autotune.megatron.hf_config import hf_config
from autotune.megatron.overrides import layout_overrides

# On a CPU, validate() with the flex dispatcher queries the GPU: use alltoall for the check.
CPU_OVERRIDES = ["model.moe_token_dispatcher_type=alltoall", "model.moe_flex_dispatcher_backend=null"]


def probe_dir() -> Path | None:
    if os.environ.get("AUTOTUNE_PROBE_DIR"):
        return Path(os.environ["AUTOTUNE_PROBE_DIR"])
    for parent in Path(__file__).resolve().parents:
        candidate = parent.parent / "shared" / "tools" / "megatron-probe"
        if (candidate / "probe.py").is_file():
            return candidate
    return None


def setup_probe(directory: Path, timeout_s: float = 1800) -> str:
    """Run the probe's setup.sh (reuses an existing environment) and return its python."""
    result = subprocess.run(["bash", str(directory / "setup.sh")], capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0:
        raise RuntimeError(f"megatron-probe setup failed: {result.stderr.strip()[-500:]}")
    return result.stdout.strip().splitlines()[-1]


def request(workload: Workload, layout: LayoutConfig) -> dict:
    overrides = layout_overrides(layout, workload)
    if workload.model.architecture.is_moe:
        overrides += CPU_OVERRIDES
    return {"recipe": workload.model.recipe_target, "hf_config": hf_config(workload.model),
            "world_size": workload.cluster.gpus, "overrides": overrides}


def run_probe(python: str, directory: Path, requests: Iterable[dict], timeout_s: float = 1800) -> list[dict]:
    lines = "".join(json.dumps(r) + "\n" for r in requests)
    result = subprocess.run([python, str(directory / "probe.py")], input=lines, capture_output=True, text=True,
                            timeout=timeout_s)
    if result.returncode != 0:
        raise RuntimeError(f"megatron-probe crashed: {result.stderr.strip()[-1000:]}")
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
