"""Megatron-Bridge's published throughput as (workload, layout, measured) cases for validating the model.

Reads shared/data/published_bridge_perf_calibration.csv (or any file of that format). Only the
latest container release of each model/system is used by default: throughput of the same layout
rose 2-3x across releases, so older rows describe older software.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path

from autotune.config import LayoutConfig, Workload
from autotune.space import load_space, make_workload

MODEL_NAMES = {"LLAMA3_8B": "llama3_8b", "LLAMA3_70B": "llama3_70b", "LLAMA3.1_405B": "llama31_405b",
               "DeepSeekV3": "deepseek_v3", "GPT OSS 120B": "gpt_oss_120b"}
SYSTEM_GPUS = {"DGX-H100": "h100", "DGX-B200": "b200", "DGX-B300": "b300", "DGX-GB200": "gb200", "DGX-GB300": "gb300"}
DEFAULT_CSV_ENV = "AUTOTUNE_PUBLISHED_CSV"


@dataclass(frozen=True)
class PublishedCase:
    release: str
    model: str
    system: str
    precision: str
    workload: Workload
    layout: LayoutConfig
    tokens_per_s_per_gpu: float
    tflops_per_gpu: float
    variant: str

    @property
    def label(self) -> str:
        return f"{self.model} {self.system} {self.workload.cluster.gpus}g {self.precision} {self.layout.short()}"


def default_csv_path() -> Path:
    if os.environ.get(DEFAULT_CSV_ENV):
        return Path(os.environ[DEFAULT_CSV_ENV])
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent.parent / "shared" / "data" / "published_bridge_perf_calibration.csv"
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("published_bridge_perf_calibration.csv not found; set " + DEFAULT_CSV_ENV)


def _precision(text: str, gpu: str) -> str:
    upper = text.upper()
    hopper = gpu in ("h100", "h200")
    if "NVFP4" in upper:
        return "nvfp4"
    if "MX" in upper or "ALT QUANTIZATION" in upper:
        return "fp8" if hopper else "mxfp8"
    if "FP8" in upper:
        return "fp8"
    return "bf16"


def _int(text: str, default: int = 1) -> int:
    text = (text or "").strip()
    return int(text) if text.isdigit() else default


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split(".") if p.isdigit())


# Published figures that are not in the CSV, with where they come from.
EXTRA_ROWS = [
    {"container_release": "facts", "model": "Qwen3-30B-A3B", "system": "DGX-H100", "num_gpus": "16",
     "precision": "BF16", "gbs": "1024", "mbs": "1", "seq_len": "4096", "tp": "1", "pp": "1", "cp": "1", "vp": "",
     "ep": "16", "etp": "1", "tokens_per_sec_per_gpu": "8826", "model_tflops_per_gpu": "203",
     "variant": "primary", "source": "shared/docs/megatron-facts.md (recipe default layout)"},
]
MODEL_NAMES["Qwen3-30B-A3B"] = "qwen3_30b"


def load_cases(path: Path | None = None, latest_only: bool = True, extra: bool = True) -> list[PublishedCase]:
    with open(path or default_csv_path(), newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    if extra:
        rows += EXTRA_ROWS
    latest: dict[tuple[str, str], tuple[int, ...]] = {}
    for r in rows:
        key = (r["model"], r["system"])
        latest[key] = max(latest.get(key, ()), _release_key(r["container_release"]))
    cases = []
    for r in rows:
        if latest_only and _release_key(r["container_release"]) != latest[(r["model"], r["system"])]:
            continue
        cases.append(_case(r))
    return cases


def _case(r: dict[str, str]) -> PublishedCase:
    gpu = SYSTEM_GPUS[r["system"]]
    precision = _precision(r["precision"], gpu)
    space = load_space(MODEL_NAMES[r["model"]])
    gpus = int(r["num_gpus"])
    per_node = 4 if gpu.startswith("gb") else 8
    workload = make_workload(space, gpus=gpus, gpus_per_node=min(per_node, gpus), gpu=gpu,
                             global_batch_size=int(r["gbs"]), seq_length=int(r["seq_len"]), precision=precision)
    tp = _int(r["tp"])
    ep = _int(r["ep"])
    layout = LayoutConfig(tp=tp, pp=_int(r["pp"]), vpp=_int(r["vp"]), cp=_int(r["cp"]), ep=ep, etp=_int(r["etp"]),
                          sp=tp > 1, mbs=_int(r["mbs"]), dist_opt=True)
    return PublishedCase(r["container_release"], MODEL_NAMES[r["model"]], r["system"], precision, workload, layout,
                         float(r["tokens_per_sec_per_gpu"]), float(r["model_tflops_per_gpu"]), r["variant"])
