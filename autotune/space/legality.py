"""Megatron's legality rules, one small pure function each, plus the policy filters.

Every rule reads a config (a mapping of knob -> value; during enumeration a partial one holding at
least the knobs the rule declares) and the workload, and returns a message when the config breaks
it, else None. `where` records where Megatron-Bridge / Megatron-Core enforce the check, so a
rejection can be traced to the real code. Policy filters are not Megatron rules (Megatron would
run the layout) but layouts no one should spend GPU time on; they are reported separately.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from autotune.config import LayoutConfig, Workload
from autotune.space.perf_values import CUDA_GRAPHS, effective, exists

Check = Callable[[Mapping[str, Any], Workload], "str | None"]


@dataclass(frozen=True)
class Violation:
    rule: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "message": self.message}


@dataclass(frozen=True)
class Rule:
    name: str
    knobs: frozenset[str]
    check: Check
    where: str
    policy: bool = False


RULES: list[Rule] = []
POLICIES: list[Rule] = []


def rule(name: str, knobs: str, where: str, policy: bool = False) -> Callable[[Check], Check]:
    """Register `check` as the rule `name` reading the space-separated `knobs`."""

    def register(check: Check) -> Check:
        (POLICIES if policy else RULES).append(Rule(name, frozenset(knobs.split()), check, where, policy))
        return check

    return register


def _world(w: Workload) -> int:
    return w.cluster.gpus


def stage_layers(w: Workload) -> int:
    """Layers the pipeline split divides: decoder layers, plus embedding / loss when they count as one."""
    m = w.model
    return (m.architecture.num_layers + int(m.account_for_embedding_in_pipeline_split)
            + int(m.account_for_loss_in_pipeline_split))


def data_parallel_size(c: Mapping[str, Any], w: Workload) -> int:
    return _world(w) // (c["tp"] * c["pp"] * c["cp"])


# --- tensor parallel -------------------------------------------------------------------------

@rule("heads_divisible_by_tp", "tp", "TransformerConfig.__post_init__ (num_attention_heads % TP)")
def _heads(c, w):
    heads = w.model.architecture.num_attention_heads
    if heads % c["tp"]:
        return f"{heads} attention heads are not divisible by TP={c['tp']}"


@rule("query_groups_compatible_with_tp", "tp", "TransformerConfig.__post_init__ (num_query_groups vs TP)")
def _groups(c, w):
    a = w.model.architecture
    if a.uses_mla:
        return None
    g, tp = a.num_query_groups, c["tp"]
    if g % tp and tp % g:
        return f"{g} KV groups and TP={tp}: neither divides the other"


@rule("ffn_divisible_by_tp", "tp", "ColumnParallelLinear (ffn_hidden_size % TP)")
def _ffn(c, w):
    a = w.model.architecture
    has_dense = not a.is_moe or a.num_dense_layers > 0
    if has_dense and a.ffn_hidden_size % c["tp"]:
        return f"FFN hidden size {a.ffn_hidden_size} is not divisible by TP={c['tp']}"


# --- the data-parallel grid ------------------------------------------------------------------

@rule("world_divisible_by_tp_pp_cp", "tp pp cp", "parallel_state.initialize_model_parallel")
def _grid(c, w):
    size = c["tp"] * c["pp"] * c["cp"]
    if _world(w) % size:
        return f"{_world(w)} GPUs are not divisible by TP*PP*CP = {c['tp']}*{c['pp']}*{c['cp']} = {size}"


@rule("cp_divides_sequence", "cp", "ConfigContainer.validate (seq_length % (2*CP))")
def _cp_seq(c, w):
    if c["cp"] > 1 and w.seq_length % (2 * c["cp"]):
        return f"sequence length {w.seq_length} is not divisible by 2*CP = {2 * c['cp']}"


# --- pipeline --------------------------------------------------------------------------------

@rule("vpp_needs_pp", "pp vpp", "parallel_state.initialize_model_parallel")
def _vpp_pp(c, w):
    if c["vpp"] > 1 and c["pp"] == 1:
        return f"VPP={c['vpp']} (interleaving) needs PP > 1"


@rule("pipeline_layout_known", "pp vpp", "recipe's pipeline layout table (DeepSeek-V3)")
def _layout_known(c, w):
    layouts = w.model.pipeline_layouts
    if layouts and (c["pp"], c["vpp"]) not in layouts:
        known = ", ".join(f"PP{p}/VPP{v}" for p, v in layouts)
        return f"the recipe has no pipeline layout for PP={c['pp']} VPP={c['vpp']} (known: {known})"


@rule("layers_divisible_by_pp", "pp", "model build (layers split evenly over PP stages)")
def _layers_pp(c, w):
    if w.model.pipeline_layouts:
        return None
    layers = stage_layers(w)
    if layers % c["pp"]:
        return f"{layers} layers (with embedding/loss as configured) do not split evenly over PP={c['pp']}"


@rule("stage_layers_divisible_by_vpp", "pp vpp", "model build ((layers / PP) % VPP)")
def _layers_vpp(c, w):
    if w.model.pipeline_layouts or c["vpp"] == 1:
        return None
    layers = stage_layers(w)
    per_stage = layers // c["pp"]
    if per_stage % c["vpp"]:
        return f"{per_stage} layers per PP stage are not divisible by VPP={c['vpp']}"


# --- experts ---------------------------------------------------------------------------------

@rule("ep_needs_moe", "ep", "MoE layer build (EP > 1 on a dense model)")
def _ep_moe(c, w):
    if c["ep"] > 1 and not w.model.architecture.is_moe:
        return f"EP={c['ep']} needs an MoE model; {w.model.name} is dense"


@rule("etp_needs_moe", "etp", "MoE layer build (ETP > 1 on a dense model)")
def _etp_moe(c, w):
    if c["etp"] > 1 and not w.model.architecture.is_moe:
        return f"ETP={c['etp']} needs an MoE model; {w.model.name} is dense"


@rule("experts_divisible_by_ep", "ep", "MoELayer (num_moe_experts % EP)")
def _experts_ep(c, w):
    experts = w.model.architecture.num_moe_experts
    if experts and experts % c["ep"]:
        return f"{experts} experts are not divisible by EP={c['ep']}"


@rule("expert_ffn_divisible_by_etp", "etp", "expert GroupedMLP (moe_ffn_hidden_size % ETP)")
def _expert_ffn(c, w):
    ffn = w.model.architecture.moe_ffn_hidden_size
    if ffn and ffn % c["etp"]:
        return f"expert FFN size {ffn} is not divisible by ETP={c['etp']}"


@rule("world_divisible_by_etp_ep_pp", "pp ep etp", "parallel_state.initialize_model_parallel (expert grid)")
def _expert_grid(c, w):
    size = c["etp"] * c["ep"] * c["pp"]
    if w.model.architecture.is_moe and _world(w) % size:
        return f"{_world(w)} GPUs are not divisible by ETP*EP*PP = {c['etp']}*{c['ep']}*{c['pp']} = {size}"


# --- sequence parallel -----------------------------------------------------------------------

@rule("sp_needs_tp", "tp sp", "Megatron-Core asserts; Bridge silently turns SP off at TP=1")
def _sp_tp(c, w):
    if c["sp"] and c["tp"] == 1:
        return "sequence parallelism needs TP > 1 (Bridge would silently switch it off)"


@rule("ep_with_tp_needs_sp", "tp ep sp", "Megatron-LM arguments (EP>1 with TP>1 must use SP)")
def _ep_tp_sp(c, w):
    if c["ep"] > 1 and c["tp"] > 1 and not c["sp"]:
        return f"EP={c['ep']} with TP={c['tp']} needs sequence parallelism"


# --- batch -----------------------------------------------------------------------------------

@rule("global_batch_divisible", "tp pp cp mbs", "ConfigContainer.validate / microbatch calculator")
def _gbs(c, w):
    dp = data_parallel_size(c, w)
    if dp < 1 or _world(w) % (c["tp"] * c["pp"] * c["cp"]):
        return None  # the grid rule reports this layout (DP is no whole number: "MBS*DP = 1*5" misled)
    if w.global_batch_size % (c["mbs"] * dp):
        return (f"global batch {w.global_batch_size} is not divisible by MBS*DP = "
                f"{c['mbs']}*{dp} = {c['mbs'] * dp}")


@rule("vpp_microbatches_divisible_by_pp", "tp pp cp vpp mbs", "interleaved 1F1B schedule")
def _vpp_mb(c, w):
    if c["vpp"] == 1 or c["pp"] == 1:
        return None
    dp = data_parallel_size(c, w)
    if dp < 1 or _world(w) % (c["tp"] * c["pp"] * c["cp"]) or w.global_batch_size % (c["mbs"] * dp):
        return None  # the grid and batch rules report these
    microbatches = w.global_batch_size // (c["mbs"] * dp)
    if microbatches < c["pp"] or microbatches % c["pp"]:
        return f"the interleaved schedule needs microbatches ({microbatches}) to be a multiple of PP={c['pp']}"


# --- recompute -------------------------------------------------------------------------------

@rule("recompute_method_matches_granularity", "recompute", "ConfigContainer.validate (recompute_method)")
def _rc_method(c, w):
    if c["recompute"] == "full":
        if c["recompute_method"] is None or c["recompute_num_layers"] is None:
            return "full recompute needs recompute_method (uniform/block) and recompute_num_layers"
    elif c["recompute_method"] is not None or c["recompute_num_layers"] is not None:
        return f"recompute={c['recompute']} takes no recompute_method or recompute_num_layers"


@rule("recompute_num_layers_within_stage", "pp recompute", "ConfigContainer.validate (1 <= n <= layers/PP)")
def _rc_layers(c, w):
    n = c["recompute_num_layers"]
    if c["recompute"] != "full" or n is None:
        return None
    per_stage = w.model.architecture.num_layers // c["pp"]
    if not 1 <= n <= per_stage:
        return f"recompute_num_layers={n} must be between 1 and layers/PP = {per_stage}"


# --- performance knobs (issue 16; read from Megatron-Core 2a75ac1 / Megatron-Bridge 067f987) ------
# Each reads the explicit values (c.get) and the effective ones (space.perf.effective: the recipe's
# values where the layout leaves a knob at None). Enumeration of the layout-only legal set never
# evaluates them (their knobs are never fixed there): every layout with the recipe's values passes.

def _perf(c, w):
    return effective(c, w)


def _modules(e) -> set[str]:
    return set((e.get("recompute_modules") or "").split("+")) - {""}


def _scope(e) -> tuple[str, tuple[str, ...]]:
    return CUDA_GRAPHS[e.get("cuda_graph") or "none"]


@rule("perf_knob_declared", "dispatcher ep_overlap cuda_graph", "search_spaces/<model>.yaml perf_knobs")
def _perf_declared(c, w):
    from autotune.config import PERF_KNOBS

    for name in PERF_KNOBS:
        if c.get(name) is not None and name not in w.model.perf_defaults:
            return f"{w.model.name}'s recipe does not expose the performance knob {name} (its space's perf_knobs)"


@rule("perf_knob_needs_its_parent", "dispatcher ep_overlap cuda_graph",
      "Bridge comm_overlap.py:442-463,576-583 (silent no-ops); TransformerConfig (knobs read only under a parent)")
def _perf_parent(c, w):
    parents = {"dispatcher_sms": "the flex dispatcher", "ep_overlap": "EP > 1", "dispatcher": "an MoE model",
               "shared_expert_overlap": "shared experts", "recompute_modules": "recompute=selective",
               "tp_comm_overlap": "TP >= 2 with sequence parallelism",
               "overlap_grad_reduce": "the distributed optimizer and DP > 1",
               "overlap_param_gather": "the distributed optimizer and DP > 1", "cp_comm_type": "CP > 1",
               "cpu_offload_layers": "PP = 1 and no recompute"}
    for name, parent in parents.items():
        if c.get(name) is not None and name in w.model.perf_defaults and not exists(name, c, w):
            return f"{name} exists only with {parent}: set here it would be ignored or refused"


@rule("ep_overlap_needs_vpp_with_pp", "ep_overlap pp vpp", "Bridge comm_overlap.py:494-497; TransformerConfig:2766-2770")
def _epov_vpp(c, w):
    if _perf(c, w).get("ep_overlap") and c["pp"] > 1 and c["vpp"] == 1:
        return ("EP communication overlap needs virtual_pipeline_model_parallel_size when "
                f"pipeline_model_parallel_size > 1 (PP={c['pp']}, no VPP)")


@rule("ep_overlap_without_full_recompute", "ep_overlap recompute", "Bridge comm_overlap.py:499-507; TransformerConfig:2780-2788")
def _epov_full(c, w):
    if _perf(c, w).get("ep_overlap") and c["recompute"] == "full":
        return "disable full recomputation when enabling overlap_moe_expert_parallel_comm"


@rule("ep_overlap_without_moe_recompute", "ep_overlap recompute_modules", "Bridge comm_overlap.py:510-512; TransformerConfig:2789-2791")
def _epov_moe(c, w):
    e = _perf(c, w)
    if e.get("ep_overlap") and c["recompute"] == "selective" and "moe" in _modules(e):
        return "disable moe in recompute_modules when enabling overlap_moe_expert_parallel_comm"


@rule("ep_overlap_without_shared_expert_overlap", "ep_overlap shared_expert_overlap",
      "Bridge comm_overlap.py:513-515; TransformerConfig:2797-2800")
def _epov_shared(c, w):
    e = _perf(c, w)
    if e.get("ep_overlap") and e.get("shared_expert_overlap"):
        return "disable moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm"


@rule("ep_overlap_mtp_at_most_one_layer", "ep_overlap", "Bridge comm_overlap.py:516-518; TransformerConfig:2801-2805")
def _epov_mtp(c, w):
    if _perf(c, w).get("ep_overlap") and w.model.architecture.mtp_num_layers > 1:
        return "MTP supports at most one layer when enabling overlap_moe_expert_parallel_comm"


@rule("ep_overlap_graph_scope_without_moe_mlp", "ep_overlap cuda_graph", "TransformerConfig:2822-2830")
def _epov_scope(c, w):
    e = _perf(c, w)
    impl, scope = _scope(e)
    if e.get("ep_overlap") and impl == "transformer_engine" and {"moe", "mlp"} & set(scope):
        return "CUDA graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm"


@rule("shared_experts_recompute_without_shared_expert_overlap", "recompute_modules shared_expert_overlap",
      "TransformerConfig.__post_init__:1869-1876")
def _shared_rc(c, w):
    e = _perf(c, w)
    if (c["recompute"] == "selective" and "shared_experts" in _modules(e) and e.get("shared_expert_overlap")
            and w.model.architecture.moe_shared_expert_ffn_hidden_size > 0):
        return "shared_experts recompute cannot work with --moe-shared-expert-overlap"


@rule("recompute_module_exists_in_model", "recompute_modules", "TransformerConfig.__post_init__:1847-1851 (mla_up_proj)")
def _rc_module_model(c, w):
    a = w.model.architecture
    modules = _modules(_perf(c, w)) if c["recompute"] == "selective" else set()
    if "mla_up_proj" in modules and not a.uses_mla:
        return "mla_up_proj in recompute_modules is only supported with multi_latent_attention"
    if {"moe", "moe_act"} & modules and not a.is_moe:
        return "moe / moe_act recompute needs an MoE model"
    if "shared_experts" in modules and not a.moe_shared_expert_ffn_hidden_size:
        return "shared_experts recompute needs shared experts (this model has none)"


@rule("full_recompute_needs_full_iteration_graph", "recompute cuda_graph", "TransformerConfig:2613-2617")
def _full_graph(c, w):
    impl, _ = _scope(_perf(c, w))
    if c["recompute"] == "full" and impl not in ("none", "full_iteration"):
        return "full recompute is only supported with full iteration CUDA graph"


@rule("moe_recompute_without_router_graph", "recompute_modules cuda_graph", "TransformerConfig:2621-2628")
def _moe_rc_graph(c, w):
    e = _perf(c, w)
    impl, scope = _scope(e)
    if c["recompute"] == "selective" and "moe" in _modules(e) and impl == "transformer_engine" and "moe_router" in scope:
        return "moe recompute is not supported with moe_router CUDA graph"


@rule("mlp_graph_needs_dense_layers", "cuda_graph", "TransformerConfig:2589-2596")
def _mlp_graph(c, w):
    a = w.model.architecture
    _, scope = _scope(_perf(c, w))
    if "mlp" in scope and a.is_moe and a.num_dense_layers == 0:
        return "mlp cuda graph is only supported for dense layers, but not found in the model"


@rule("cpu_offload_needs_pp1", "cpu_offload_layers pp", "TransformerConfig.__post_init__:1772-1775")
def _off_pp(c, w):
    if (c.get("cpu_offload_layers") or 0) > 0 and c["pp"] > 1:
        return "Currently there is no support for Pipeline parallelism with CPU offloading"


@rule("cpu_offload_without_recompute", "cpu_offload_layers recompute", "TransformerConfig.__post_init__:1777-1780")
def _off_rc(c, w):
    if (c.get("cpu_offload_layers") or 0) > 0 and c["recompute"] != "none":
        return "CPU offloading does not work when activation recomputation is enabled"


@rule("cpu_offload_layers_below_num_layers", "cpu_offload_layers", "TransformerConfig.__post_init__:1765-1770")
def _off_layers(c, w):
    layers = w.model.architecture.num_layers
    if (c.get("cpu_offload_layers") or 0) >= layers:
        return f"CPU offloading can be done only for layers less than {layers}"


@rule("cpu_offload_with_graphs_only_full_iteration", "cpu_offload_layers cuda_graph", "TransformerConfig:2557-2560")
def _off_graph(c, w):
    impl, _ = _scope(_perf(c, w))
    if (c.get("cpu_offload_layers") or 0) > 0 and impl not in ("none", "full_iteration"):
        return "CUDA graphs not supported with CPU offloading (only none or full_iteration)"


@rule("cp_a2a_heads_divisible_by_cp", "cp_comm_type tp cp",
      "TE DotProductAttention (cp_comm_type a2a); Bridge docs/performance-guide.md:410 (GPU-only check)")
def _cp_a2a(c, w):
    a = w.model.architecture
    if _perf(c, w).get("cp_comm_type") == "a2a" and c["cp"] > 1:
        heads, groups = a.num_attention_heads // c["tp"], max(1, a.num_query_groups // c["tp"])
        if heads % c["cp"] or groups % c["cp"]:
            return (f"a2a context parallelism needs attention heads ({heads}) and KV heads ({groups}) per TP rank "
                    f"divisible by CP={c['cp']}")


@rule("flex_backend_supports_gpu", "dispatcher", "Bridge flex_dispatcher_backend.py:88-109 (GPU-only check)")
def _flex_gpu(c, w):
    dispatcher = _perf(c, w).get("dispatcher") or ""
    gpu = w.cluster.gpu
    if dispatcher == "flex_deepep" and gpu.name in ("gb200", "gb300"):
        return "DeepEP is supported for Ampere, Hopper, B200 and B300 only"
    if dispatcher.startswith("flex") and gpu.generation not in ("ampere", "hopper", "blackwell"):
        return f"{dispatcher} needs an Ampere, Hopper or Blackwell GPU"


# --- policy filters (not Megatron rules) -----------------------------------------------------

@rule("tp_within_nvlink_domain", "tp", "policy: TP traffic is per layer and needs NVLink", policy=True)
def _tp_node(c, w):
    if c["tp"] > w.cluster.nvlink_domain_gpus:
        return f"TP={c['tp']} spans more than one NVLink domain ({w.cluster.nvlink_domain_gpus} GPUs)"


@rule("etp_within_nvlink_domain", "etp", "policy: expert TP traffic needs NVLink", policy=True)
def _etp_node(c, w):
    if c["etp"] > w.cluster.nvlink_domain_gpus:
        return f"ETP={c['etp']} spans more than one NVLink domain ({w.cluster.nvlink_domain_gpus} GPUs)"


@rule("recompute_num_layers_within_chunk", "pp vpp recompute",
      "policy: Megatron recomputes per model chunk (TransformerBlock._checkpointed_forward, one block per VPP "
      "chunk): a larger n is the same run as n = the chunk's layers", policy=True)
def _rc_chunk(c, w):
    n = c["recompute_num_layers"]
    if c["recompute"] != "full" or n is None or c["vpp"] == 1 or w.model.pipeline_layouts:
        return None  # without VPP the chunk is the stage (recompute_num_layers_within_stage)
    chunk = math.ceil(math.ceil(stage_layers(w) / c["pp"]) / c["vpp"])  # the largest chunk of any stage
    if n > chunk:
        return (f"recompute_num_layers={n} acts as {chunk} with PP={c['pp']} VPP={c['vpp']}: full recompute "
                f"works per model chunk of at most {chunk} layers, so this is the same run as {chunk}")


RULE_NAMES = tuple(r.name for r in RULES)
POLICY_NAMES = tuple(r.name for r in POLICIES)


def violations(config: LayoutConfig, workload: Workload) -> list[Violation]:
    """Every Megatron rule `config` breaks on `workload` (empty when legal)."""
    values = config.to_dict()
    return [Violation(r.name, msg) for r in RULES if (msg := r.check(values, workload))]


def policy_violations(config: LayoutConfig, workload: Workload,
                      enabled: Mapping[str, bool] | None = None) -> list[Violation]:
    """The policy filters `config` fails; `enabled` switches filters off by name."""
    values = config.to_dict()
    return [Violation(r.name, msg) for r in POLICIES
            if (enabled is None or enabled.get(r.name, True)) and (msg := r.check(values, workload))]


def is_legal(config: LayoutConfig, workload: Workload) -> bool:
    return not violations(config, workload)
