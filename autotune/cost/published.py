"""Megatron-Bridge's published throughput as (workload, layout, measured) cases for validating the model.

Reads shared/data/published_bridge_perf_calibration.csv (or any file of that format). Only the
latest container release of each model/system/precision is used by default: throughput of the same
layout rose 2-3x across releases, so older rows describe older software. LoRA rows are left out by
default: frozen base weights skip the weight-gradient GEMMs, the optimizer and the gradient
reduction, which the cost model (pretraining and full fine-tuning) does not model; their published
TFLOP/s are also counted on a smaller FLOP basis. Rows run with Megatron FSDP (a non-zero fsdp
column) are left out too: FSDP is not a knob of the tuner, so the model has no layout for them. The Qwen3 rows of the published tables are not in
the CSV on purpose (they measure transfer to an unseen family) and are never added here.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from autotune.config import LayoutConfig, Workload
from autotune.cost.memory import PERF_RECIPE_SETTINGS, TrainingSettings
from autotune.space import load_space, make_workload

MODEL_NAMES = {"LLAMA3_8B": "llama3_8b", "LLAMA3_70B": "llama3_70b", "LLAMA3.1_405B": "llama31_405b",
               "DeepSeekV3": "deepseek_v3", "GPT OSS 120B": "gpt_oss_120b"}
SYSTEM_GPUS = {"DGX-H100": "h100", "DGX-B200": "b200", "DGX-B300": "b300", "DGX-GB200": "gb200", "DGX-GB300": "gb300"}
DEFAULT_CSV_ENV = "AUTOTUNE_PUBLISHED_CSV"
# What each published MoE row's recipe ran, at the row's own release (Megatron-Bridge's release tags:
# 26.08 = v0.6.0, 26.06.01 = v0.5.1, 26.06 = v0.5.0, 26.04.01 = v0.4.2, 26.04 = v0.4.0, 25.09 = r0.1.0;
# the workload base configs whose layout matches the row's). The fused MoE path
# (TrainingSettings.moe_fused_path: Transformer Engine's op fuser, full-iteration CUDA graph, paged stash,
# EP overlap) first ran in 26.06, on GB200 / GB300 MXFP8 of both MoE models (r0.5.0 #4187, #4241;
# 067f987 perf_recipes: _enable_deepseek_full_iteration_mxfp8, _apply_gpt_oss_120b_full_iter_fp8mx_configs).
# B300's DeepSeek-V3 recipe took it after its 26.06 row (#4498), GPT-OSS-120B's B300 recipe never did.
FUSED_MOE_RECIPES = {(release, model, system, "mxfp8") for release in ("26.06", "26.06.01", "26.08")
                     for model in ("deepseek_v3", "gpt_oss_120b") for system in ("DGX-GB200", "DGX-GB300")}
# Rows whose recipe overlapped EP communication (moe_a2a_overlap: overlap_moe_expert_parallel_comm) without
# the fused path, where a config of the row's release tag matches its layout: v0.4.2
# DEEPSEEK_V3_PRETRAIN_CONFIG_B200_FP8_MX_V2, GPT_OSS_120B_PRETRAIN_CONFIG_GB200_BF16_V2 (v0.4.0, v0.4.2).
# Left out: r0.1.0's DeepSeek-V3 dropless H100 run (25.09) likely overlapped too, but its settings come from
# run_script.py's hard-coded logic, not a config matching the row; with it the fit moves Hopper's
# efficiency 0.67 -> 0.60 and the H100 FP8 rows' in-sample error 1% -> 11% (README).
EP_OVERLAP_RECIPES = {("26.04.01", "deepseek_v3", "DGX-B200", "mxfp8"), ("26.04.01", "gpt_oss_120b", "DGX-GB200", "bf16"),
                      ("26.04", "gpt_oss_120b", "DGX-GB200", "bf16")}


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
    kind: str = "pretrain"  # the CSV's workload column: pretrain, sft or lora
    # the published runs use Megatron-Bridge's performance recipes (gradients reduced in BF16)
    settings: TrainingSettings = PERF_RECIPE_SETTINGS

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


def load_cases(path: Path | None = None, latest_only: bool = True, lora: bool = False) -> list[PublishedCase]:
    """Published rows as cases: by default the latest release of each (workload, model, system,
    precision); never LoRA (unless asked) or FSDP rows (see the module docstring)."""
    with open(path or default_csv_path(), newline="", encoding="utf-8") as handle:
        rows = [r for r in csv.DictReader(handle)
                if (lora or r["workload"] != "lora") and _int(r.get("fsdp", ""), 0) == 0]

    def key(r: dict[str, str]) -> tuple[str, ...]:
        return r["workload"], r["model"], r["system"], _precision(r["precision"], SYSTEM_GPUS[r["system"]])

    latest: dict[tuple[str, ...], tuple[int, ...]] = {}
    for r in rows:
        latest[key(r)] = max(latest.get(key(r), ()), _release_key(r["container_release"]))
    return [_case(r) for r in rows
            if not latest_only or _release_key(r["container_release"]) == latest[key(r)]]


def same_run_groups(cases: list[PublishedCase], by_layout: bool = False) -> list[list[PublishedCase]]:
    """Cases published together: one release, workload, model, system and GPU count (and, with
    `by_layout`, one layout: the same run in several precisions). Rows of one group were measured on
    the same software, so their order is a fact about layouts or precisions, not about releases."""
    groups: dict[tuple, list[PublishedCase]] = {}
    for c in cases:
        key = (c.release, c.kind, c.model, c.system, c.workload.cluster.gpus) + ((c.layout,) if by_layout else ())
        groups.setdefault(key, []).append(c)
    return list(groups.values())


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
    key = (r["container_release"], MODEL_NAMES[r["model"]], r["system"], precision)
    fused = key in FUSED_MOE_RECIPES
    overlap = fused or key in EP_OVERLAP_RECIPES
    return PublishedCase(r["container_release"], MODEL_NAMES[r["model"]], r["system"], precision, workload, layout,
                         float(r["tokens_per_sec_per_gpu"]), float(r["model_tflops_per_gpu"]), r["variant"],
                         r.get("workload") or "pretrain",
                         dataclasses.replace(PERF_RECIPE_SETTINGS, moe_fused_path=fused, moe_ep_overlap=overlap))
