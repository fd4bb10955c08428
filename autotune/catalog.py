"""The catalog: GPU types (a table in code) and models (one YAML file each in `search_spaces/`).

A model's architecture, Megatron-Bridge recipe, recipe defaults and knob domains are values, so
they live in `search_spaces/<model>.yaml` (house rule 5); this module holds the types and the
look-ups. Numbers are read from the Bridge providers and HF configs (see shared/docs/megatron-facts.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from autotune.errors import ConfigError

# An OOM's reported peak may be what the run needed rather than what it held; beyond this many times the
# GPU's memory it is no figure. The writers check each run against its GPU (backends/validation.py) and the
# store's read bounds allow it on the catalog's largest GPU (storage/_records.py): a fact both layers share.
OOM_MEMORY_FACTOR = 4.0


@dataclass(frozen=True)
class GpuType:
    """One GPU model as a DGX-class system exposes it. Bandwidths are per GPU, one direction."""

    name: str
    display_name: str
    generation: str  # ampere / hopper / blackwell: software efficiency is calibrated per generation
    memory_gib: float  # HBM usable by the framework (what torch.cuda reports as total)
    peak_tflops: dict[str, float]  # dense peak per precision; a precision the GPU lacks is absent
    hbm_tbps: float
    nvlink_gbps: float  # NVLink bandwidth per GPU inside the NVLink domain, GB/s one direction
    network_gbps: float  # scale-out (InfiniBand / RoCE) bandwidth per GPU, GB/s one direction
    nvlink_domain_gpus: int  # GPUs that reach each other over NVLink (8 for DGX, 72 for NVL72)
    default_gpus_per_node: int = 8

    @property
    def bf16_peak_tflops(self) -> float:
        return self.peak_tflops["bf16"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "display_name": self.display_name,
            "generation": self.generation,
            "memory_gib": self.memory_gib,
            "peak_tflops": dict(self.peak_tflops),
            "hbm_tbps": self.hbm_tbps,
            "nvlink_gbps": self.nvlink_gbps,
            "network_gbps": self.network_gbps,
            "nvlink_domain_gpus": self.nvlink_domain_gpus,
            "default_gpus_per_node": self.default_gpus_per_node,
        }


def _gpu(name, display, generation, memory_gib, peaks, hbm, nvlink, network, domain=8, per_node=8):
    return GpuType(name, display, generation, memory_gib, peaks, hbm, nvlink, network, domain, per_node)


# Peaks are NVIDIA's dense (non-sparse) figures; FP8 is twice BF16, FP4 twice FP8 (B300/GB300: 3x).
GPU_TYPES: dict[str, GpuType] = {
    g.name: g
    for g in (
        _gpu("a100", "A100 SXM 80GB", "ampere", 79.2, {"bf16": 312.0}, 2.04, 300.0, 25.0),
        _gpu("h100", "H100 SXM 80GB", "hopper", 79.6, {"bf16": 989.0, "fp8": 1979.0}, 3.35, 450.0, 50.0),
        _gpu("h200", "H200 SXM 141GB", "hopper", 139.8, {"bf16": 989.0, "fp8": 1979.0}, 4.8, 450.0, 50.0),
        _gpu("b200", "B200 180GB", "blackwell", 178.4,
             {"bf16": 2250.0, "fp8": 4500.0, "mxfp8": 4500.0, "nvfp4": 9000.0}, 8.0, 900.0, 50.0),
        _gpu("b300", "B300 288GB", "blackwell", 268.0,
             {"bf16": 2250.0, "fp8": 4500.0, "mxfp8": 4500.0, "nvfp4": 13500.0}, 8.0, 900.0, 100.0),
        _gpu("gb200", "GB200 NVL72", "blackwell", 184.0,
             {"bf16": 2500.0, "fp8": 5000.0, "mxfp8": 5000.0, "nvfp4": 10000.0}, 8.0, 900.0, 50.0, 72, 4),
        _gpu("gb300", "GB300 NVL72", "blackwell", 268.0,
             {"bf16": 2500.0, "fp8": 5000.0, "mxfp8": 5000.0, "nvfp4": 15000.0}, 8.0, 900.0, 100.0, 72, 4),
    )
}


def get_gpu(name: str) -> GpuType:
    try:
        return GPU_TYPES[name.lower()]
    except KeyError:
        raise ConfigError(f"unknown GPU type {name!r} (known: {', '.join(GPU_TYPES)})") from None


@dataclass(frozen=True)
class Architecture:
    """The numbers of a transformer that FLOPs, memory and legality need. MoE fields are 0 when dense."""

    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int
    vocab_size: int
    num_moe_experts: int = 0
    moe_router_topk: int = 0
    moe_ffn_hidden_size: int = 0
    moe_shared_expert_ffn_hidden_size: int = 0
    num_dense_layers: int = 0  # leading dense layers of an MoE model (DeepSeek-V3: 3)
    # Node-limited routing: a token goes to experts in at most this many groups (DeepSeek-V3: 4 of 8); 0 = no limit.
    moe_router_group_topk: int = 0
    gated_linear_unit: bool = True  # SwiGLU
    tie_embeddings: bool = False
    # Multi-latent attention (DeepSeek); 0 when the model uses ordinary (grouped-query) attention.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_head_dim: int = 0
    qk_pos_emb_head_dim: int = 0
    v_head_dim: int = 0
    mtp_num_layers: int = 0
    # Sliding-window attention (GPT-OSS): window in tokens (0 = none); every `window_attn_skip_freq`-th
    # layer keeps full attention (Megatron's window_attn_skip_freq).
    sliding_window: int = 0
    window_attn_skip_freq: int = 0

    @property
    def is_moe(self) -> bool:
        return self.num_moe_experts > 0

    @property
    def uses_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.is_moe else 0


@dataclass(frozen=True)
class RecipeDefaults:
    """What the model's Megatron-Bridge recipe sets: the cluster, batch, sequence and layout."""

    gpus: int
    gpus_per_node: int
    gpu: str
    global_batch_size: int
    seq_length: int
    precision: str
    layout: dict[str, Any] = field(default_factory=dict)
    # scale-out bandwidth per GPU (GB/s, one direction) of the cluster the space describes, when it is
    # not the GPU type's DGX figure (a node with fewer NICs); None keeps the GPU type's
    network_gbps: float | None = None


@dataclass(frozen=True)
class ModelSpec:
    """A catalog entry: name, Megatron-Bridge recipe, HF identity, architecture and defaults."""

    name: str
    display_name: str
    recipe_function: str  # exported by megatron.bridge.recipes
    recipe_target: str  # module:function of the recipe behind that alias
    hf_model_type: str
    hf_architecture: str
    architecture: Architecture
    defaults: RecipeDefaults
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    # (pp, vpp) pairs with a predefined pipeline layout; empty means "split layers evenly".
    pipeline_layouts: tuple[tuple[int, int], ...] = ()
    # module:function that recomputes the recipe's pipeline layout after PP/VPP change (DeepSeek-V3)
    pipeline_layout_function: str = ""
    hf_extra: dict = field(default_factory=dict)  # HF config values that are not architecture numbers
    # False for a model measured elsewhere (a public sweep) whose Bridge recipe is not its own: `export`
    # and the megatron backend refuse it, with `recipe_note` saying why.
    exportable: bool = True
    recipe_note: str = ""
    # the recipe's value of each performance knob the model's space declares (search_spaces `perf_knobs`)
    perf_defaults: dict = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "name": self.name,
            "display_name": self.display_name,
            "recipe_function": self.recipe_function,
            "recipe_target": self.recipe_target,
            "hf_model_type": self.hf_model_type,
            "hf_architecture": self.hf_architecture,
            "architecture": asdict(self.architecture),
            "defaults": asdict(self.defaults),
            "account_for_embedding_in_pipeline_split": self.account_for_embedding_in_pipeline_split,
            "account_for_loss_in_pipeline_split": self.account_for_loss_in_pipeline_split,
            "pipeline_layouts": [list(p) for p in self.pipeline_layouts],
            "pipeline_layout_function": self.pipeline_layout_function,
            "exportable": self.exportable,
            "recipe_note": self.recipe_note,
        }


# A space file is data, and yet its recipe target and pipeline layout function are imported and called on every GPU
# node of every trial the megatron backend runs (workers/launcher.build_config): a shared file naming `os:abort`, or
# a module that does harm on import, would run there. So to be run they must live in Megatron-Bridge's recipes, or in
# a package that whoever runs autotune names in this variable (comma-separated, e.g. a team's own recipes), never
# the file. `export --format recipe` writes a module that imports and calls them: the same packages. Reading,
# showing and the other exports of a stored study import nothing and are not limited.
RECIPE_PACKAGES = ("megatron.bridge.recipes",)
RECIPE_PACKAGES_ENV = "AUTOTUNE_RECIPE_PACKAGES"


def allowed_recipe_packages() -> tuple[str, ...]:
    """Megatron-Bridge's recipes and the packages RECIPE_PACKAGES_ENV names; ConfigError for an entry that is no
    dotted Python name (`team recipes` or `team.recipes:` would never match, silently)."""
    extra = tuple(p.strip() for p in os.environ.get(RECIPE_PACKAGES_ENV, "").split(",") if p.strip())
    for package in extra:
        if not all(part.isascii() and part.isidentifier() for part in package.split(".")):
            raise ConfigError(f"{RECIPE_PACKAGES_ENV} names {package[:80]!r}, which is no package name "
                              "(comma-separated dotted names: team.recipes,other.recipes)")
    return RECIPE_PACKAGES + extra


def require_runnable_recipe(model: ModelSpec) -> None:
    """ConfigError unless `model`'s recipe target and pipeline layout function lie in allowed_recipe_packages():
    checked where they are run (a study of a backend that runs the recipe starting or resuming, the GPU worker)."""
    allowed = allowed_recipe_packages()
    for key, target in (("recipe.target", model.recipe_target), ("pipeline.layout_function",
                                                                 model.pipeline_layout_function)):
        module = target.partition(":")[0]
        if target and not any(module == p or module.startswith(p + ".") for p in allowed):
            raise ConfigError(f"{model.name}'s {key} {target[:80]!r} is outside {', '.join(allowed)}: refusing to "
                              f"import and call it on the GPU nodes (whoever runs autotune may allow its package: "
                              f"{RECIPE_PACKAGES_ENV}=package)")


def require_exportable(model: ModelSpec, action: str) -> None:
    """ConfigError when `model` has no Megatron-Bridge recipe of its own to `action` with."""
    if not model.exportable:
        # the note may span lines (a YAML block scalar); an error is one line
        note = " ".join(model.recipe_note.split()) or "it has no Megatron-Bridge recipe"
        raise ConfigError(f"cannot {action} {model.name}: {note}")
