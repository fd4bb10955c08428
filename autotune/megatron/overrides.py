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


class TorchDtype(str):
    """A torch dtype field value: `torch.float32` in an override, the expression torch.float32 in a recipe."""

    def __repr__(self) -> str:
        return f"torch.{str.__str__(self)}"

    def __str__(self) -> str:
        return f"torch.{str.__str__(self)}"


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        # a Hydra list literal, no spaces: Bridge iterates a scalar recompute_modules character by character
        return "[" + ",".join(_value(v) for v in value) + "]"
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
    })
    if workload.precision != workload.model.defaults.precision:
        # only a precision the recipe does not train in: the named recipe replaces the recipe's whole
        # MixedPrecisionConfig, whose setup() then writes its own grad_reduce_in_fp32 onto ddp (a review with
        # megatron-probe: `mixed_precision=bf16_mixed` on the Qwen3-30B-A3B recipe, which reduces gradients in
        # bf16, turned on fp32 gradient reduction in every trial and every export: twice the gradient buffers)
        fields["mixed_precision"] = MIXED_PRECISION[workload.precision]
    if not config.dist_opt:
        # Recipes that enable the precision-aware optimizer (Qwen3-30B-A3B) fail validate() without
        # the distributed optimizer ("only supported with distributed optimizer", seen with megatron-probe).
        fields["optimizer.use_precision_aware_optimizer"] = False
        # ...and then every optimizer-state dtype must be fp32 (DeepSeek-V3's recipe keeps them in bf16:
        # "main_grads_dtype / exp_avg_dtype can only be fp32 when not using precision-aware optimizer", probe)
        for state in ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
            fields[f"optimizer.{state}"] = TorchDtype("float32")
    if config.recompute == "full" and config.cuda_graph is None:
        # validate() rejects full recompute under Transformer Engine CUDA graphs (which the
        # Qwen3-30B-A3B recipe enables) unless the graph covers the full iteration.
        fields["model.cuda_graph_impl"] = "none"
    fields.update(perf_fields(config))
    return fields


# performance knobs whose value is the Bridge field's value, as is
DIRECT_FIELDS = {
    "dispatcher_sms": "model.moe_flex_dispatcher_num_sms",
    "ep_overlap": "comm_overlap.overlap_moe_expert_parallel_comm",
    "shared_expert_overlap": "model.moe_shared_expert_overlap",
    "tp_comm_overlap": "comm_overlap.tp_comm_overlap",
    "overlap_grad_reduce": "comm_overlap.overlap_grad_reduce",
    "overlap_param_gather": "comm_overlap.overlap_param_gather",
    "cp_comm_type": "model.cp_comm_type",
}


def perf_fields(config: LayoutConfig) -> dict[str, Any]:
    """Bridge fields of the performance knobs `config` sets (a knob left at None emits nothing).

    Overlap switches go through `comm_overlap.*`: Bridge's CommOverlapConfig.setup() copies its own
    values onto model / ddp before validate(), silently undoing `model.overlap_moe_expert_parallel_comm`
    or `ddp.overlap_grad_reduce` overrides whenever the recipe has a comm_overlap config (both MoE recipes do;
    seen with megatron-probe).
    """
    from autotune.space.perf_values import CUDA_GRAPHS

    fields: dict[str, Any] = {}
    if config.dispatcher is not None:
        kind, _, backend = config.dispatcher.partition("_")
        fields["model.moe_token_dispatcher_type"] = kind
        fields["model.moe_flex_dispatcher_backend"] = backend or None
    fields.update({path: getattr(config, knob) for knob, path in DIRECT_FIELDS.items()
                   if getattr(config, knob) is not None})
    if config.cuda_graph is not None:
        impl, scope = CUDA_GRAPHS[config.cuda_graph]
        fields["model.cuda_graph_impl"] = impl
        # the recipes set the deprecated cuda_graph_scope; setting cuda_graph_modules too is an error
        fields["model.cuda_graph_scope"] = list(scope)
        if impl != "none":
            # graphs need Transformer Engine's RNG tracker (checked only at model build, gpt_provider.py)
            fields["model.use_te_rng_tracker"] = True
            fields["rng.te_rng_tracker"] = True
        if impl == "full_iteration":
            # required by validate() for full-iteration graphs (a safety check, tagged, not benchmark-only)
            fields["rerun_state_machine.check_for_nan_in_loss"] = False
    if config.recompute_modules is not None:
        fields["model.recompute_modules"] = config.recompute_modules.split("+")
    if config.cpu_offload_layers is not None:
        fields["model.cpu_offloading"] = config.cpu_offload_layers > 0
        if config.cpu_offload_layers > 0:
            fields["model.cpu_offloading_num_layers"] = config.cpu_offload_layers
            fields["model.cpu_offloading_activations"] = True
            fields["model.cpu_offloading_weights"] = False
    return fields


def dispatcher_forced(backend: str, backend_options: dict[str, Any] | None) -> bool:
    """Whether every run of a study runs the all-to-all MoE dispatcher, whatever its layout says: the megatron
    backend's `dispatcher: alltoall` option (for a container without the flex backends). A study stored before
    that option was written explicitly (when all-to-all was the default) has none, and ran all-to-all."""
    return backend == "megatron" and (backend_options or {}).get("dispatcher", "alltoall") == "alltoall"


def as_run(config: LayoutConfig, workload: Workload, backend: str, backend_options: dict[str, Any] | None) -> LayoutConfig:
    """`config` with the dispatcher its runs ran (dispatcher_forced: all-to-all whatever the layout says, as the worker
    runs it; a study stored before the option was written ran its flex trials all-to-all too), without a flex SM count
    that all-to-all ignores: what an export must write and `show` must list, so that the exported recipe runs what was
    measured (review: the worker ran all-to-all and the export left the recipe's flex)."""
    if workload.model.architecture.is_moe and dispatcher_forced(backend, backend_options):
        return config.replace(dispatcher="alltoall", dispatcher_sms=None)
    return config


def safety_checks_off(config: LayoutConfig) -> list[str]:
    """What the layout's overrides switch off of Megatron's run-time safety checks because a knob requires it
    (not a benchmark-only setting, which export refuses unless told): said by `export` (found by a new-user pass:
    the recipe of a full-iteration CUDA graph winner turned the NaN-loss check off without a word)."""
    from autotune.space.perf_values import CUDA_GRAPHS

    if config.cuda_graph is not None and CUDA_GRAPHS[config.cuda_graph][0] == "full_iteration":
        return ["rerun_state_machine.check_for_nan_in_loss=False: full-iteration CUDA graphs require it (Megatron's "
                "validate()), so a NaN loss will not stop the run; export --trial a layout without cuda_graph="
                f"{config.cuda_graph} to keep the check"]
    return []


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
