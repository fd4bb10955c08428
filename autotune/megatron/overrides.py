"""The one mapping from a trial's knobs to Megatron-Bridge ConfigContainer fields.

Used by the command and megatron backends (the `overrides` of a TrialSpec), by the GPU worker, and
by export. Strings are Hydra-style `path=value` overrides, as
`megatron.bridge.training.utils.omegaconf_utils.process_config_with_overrides` and
`scripts/training/run_recipe.py` accept them. Field names are those of Megatron-Bridge 0.6.x
(ConfigContainer in training/config.py); `tests/test_overrides.py` pins them.
"""

from __future__ import annotations

from typing import Any

from autotune.config import LayoutConfig, Workload

# precision -> Bridge mixed-precision recipe name (training/mixed_precision.py)
MIXED_PRECISION = {
    "bf16": "bf16_mixed",
    "fp8": "bf16_with_fp8_current_scaling_mixed",
    "mxfp8": "bf16_with_mxfp8_mixed",
    "nvfp4": "bf16_with_nvfp4_mixed",
}


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def layout_fields(config: LayoutConfig, workload: Workload) -> dict[str, Any]:
    """ConfigContainer field path -> value for every tuned knob of `config` on `workload`."""
    fields: dict[str, Any] = {
        "model.tensor_model_parallel_size": config.tp,
        "model.pipeline_model_parallel_size": config.pp,
        "model.virtual_pipeline_model_parallel_size": config.vpp if config.vpp > 1 else None,
        "model.context_parallel_size": config.cp,
        "model.sequence_parallel": config.sp,
    }
    if workload.model.architecture.is_moe:
        fields["model.expert_model_parallel_size"] = config.ep
        fields["model.expert_tensor_parallel_size"] = config.etp
    fields.update({
        "train.micro_batch_size": config.mbs,
        "train.global_batch_size": workload.global_batch_size,
        "model.seq_length": workload.seq_length,
        "dataset.seq_length": workload.seq_length,
        "model.recompute_granularity": None if config.recompute == "none" else config.recompute,
        "model.recompute_method": config.recompute_method,
        "model.recompute_num_layers": config.recompute_num_layers,
        # Either field forces both in Bridge; set both so the intent is explicit.
        "ddp.use_distributed_optimizer": config.dist_opt,
        "optimizer.use_distributed_optimizer": config.dist_opt,
        "mixed_precision": MIXED_PRECISION[workload.precision],
    })
    if not config.dist_opt:
        # Recipes that enable the precision-aware optimizer (Qwen3-30B-A3B) fail validate() without
        # the distributed optimizer ("only supported with distributed optimizer", seen with megatron-probe).
        fields["optimizer.use_precision_aware_optimizer"] = False
    if config.recompute == "full":
        # validate() rejects full recompute under Transformer Engine CUDA graphs (which the
        # Qwen3-30B-A3B recipe enables) unless the graph covers the full iteration.
        fields["model.cuda_graph_impl"] = "none"
    return fields


def layout_overrides(config: LayoutConfig, workload: Workload) -> list[str]:
    return [f"{path}={_value(value)}" for path, value in layout_fields(config, workload).items()]


def parse_overrides(lines: list[str]) -> dict[str, str]:
    """`path=value` strings back to a mapping (for round-trip checks and import)."""
    parsed: dict[str, str] = {}
    for line in lines:
        path, sep, value = line.partition("=")
        if not sep or not path.strip():
            raise ValueError(f"not an override: {line!r}")
        parsed[path.strip()] = value.strip()
    return parsed


def config_from_overrides(lines: list[str]) -> LayoutConfig:
    """The layout an override list sets (inverse of layout_overrides for the tuned knobs)."""
    o = parse_overrides(lines)

    def number(path: str, default: int = 1) -> int:
        text = o.get(path, "null")
        return default if text == "null" else int(text)

    def optional(path: str) -> str | None:
        text = o.get(path, "null")
        return None if text == "null" else text

    granularity = optional("model.recompute_granularity") or "none"
    layers = optional("model.recompute_num_layers")
    return LayoutConfig(
        tp=number("model.tensor_model_parallel_size"), pp=number("model.pipeline_model_parallel_size"),
        vpp=number("model.virtual_pipeline_model_parallel_size"), cp=number("model.context_parallel_size"),
        ep=number("model.expert_model_parallel_size"), etp=number("model.expert_tensor_parallel_size"),
        sp=o.get("model.sequence_parallel", "false") == "true", mbs=number("train.micro_batch_size"),
        recompute=granularity, recompute_method=optional("model.recompute_method"),
        recompute_num_layers=int(layers) if layers else None,
        dist_opt=o.get("ddp.use_distributed_optimizer", "false") == "true",
    )
