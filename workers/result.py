"""Result files of a GPU run: written by workers.launcher, read by the megatron backend.

Pure Python (no torch, no megatron), so the same code is tested on CPU. A result is the command
backend's result JSON (status, step_time_s, tokens_per_s_per_gpu, tflops_per_gpu, mfu, peak_mem_gib,
error) plus per-iteration times and both memory peaks.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from autotune.megatron.logparse import classify_failure, merge_rank_failures  # noqa: F401 (the workers' name for it)


def write_json(path: str | os.PathLike, data: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)  # readers never see half a file


def spec_model(spec: dict[str, Any]):
    """The trial's model: from the study's own space text when the spec carries it (a user's space file,
    or the installed one as it was when the study began), else from the installed catalog."""
    from autotune.space import space_from_document

    options = spec.get("backend_options") or {}
    return space_from_document(options.get("space_document"), str(options.get("space_source") or spec["model"])).model


def runnable_model(spec: dict[str, Any]):
    """spec_model, refused (ConfigError) when its recipe lies outside the packages allowed to run
    (catalog.require_runnable_recipe; the controller forwards AUTOTUNE_RECIPE_PACKAGES in the launch
    environment): a spec file on a node is data, and this worker imports and calls what it names."""
    from autotune.catalog import require_runnable_recipe

    model = spec_model(spec)
    require_runnable_recipe(model)
    return model


def rank_result_path(result: str | os.PathLike, rank: int) -> Path:
    result = Path(result)
    return result.with_name(f"{result.stem}.rank{rank}{result.suffix}")


def success_result(spec: dict[str, Any], times_s: list[float], allocated_gib: float, reserved_gib: float) -> dict:
    """Throughput from the measured iterations (after the warm-up), MFU against the BF16 peak."""
    from autotune.catalog import get_gpu
    from autotune.cost.flops import measured_throughput

    warmup = int(spec["warmup_steps"])
    measured = times_s[warmup:] or times_s
    step = statistics.mean(measured)
    tokens, tflops, mfu = measured_throughput(
        spec_model(spec).architecture, get_gpu(spec["gpu"]).bf16_peak_tflops,
        global_batch_size=spec["global_batch_size"], seq_length=spec["seq_length"], gpus=spec["gpus"],
        tp=int(spec["config"].get("tp", 1)), step_time_s=step)
    return {"status": "completed", "step_time_s": step, "tokens_per_s_per_gpu": tokens, "tflops_per_gpu": tflops,
            "mfu": mfu, "peak_mem_gib": reserved_gib,
            "max_allocated_gib": allocated_gib, "max_reserved_gib": reserved_gib, "step_times_s": times_s}


def failure_result(spec: dict[str, Any], rank: int, text: str) -> dict:
    kind = classify_failure(text)
    return {"status": "oom" if kind == "oom" else "failed", "error": f"{kind} on rank {rank}: "
            + text.strip().splitlines()[-1][:500] if text.strip() else kind, "failure": kind, "rank": rank,
            "log_tail": text[-4000:]}


