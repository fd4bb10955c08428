"""Megatron's legality rules, one small pure function each, plus the policy filters.

Every rule reads a config (a mapping of knob -> value; during enumeration a partial one holding at
least the knobs the rule declares) and the workload, and returns a message when the config breaks
it, else None. `where` records where Megatron-Bridge / Megatron-Core enforce the check, so a
rejection can be traced to the real code. Policy filters are not Megatron rules (Megatron would
run the layout) but layouts no one should spend GPU time on; they are reported separately.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from autotune.config import LayoutConfig, Workload

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
    if dp < 1:
        return None  # the grid rule reports this layout
    if w.global_batch_size % (c["mbs"] * dp):
        return (f"global batch {w.global_batch_size} is not divisible by MBS*DP = "
                f"{c['mbs']}*{dp} = {c['mbs'] * dp}")


@rule("vpp_microbatches_divisible_by_pp", "tp pp cp vpp mbs", "interleaved 1F1B schedule")
def _vpp_mb(c, w):
    if c["vpp"] == 1 or c["pp"] == 1:
        return None
    dp = data_parallel_size(c, w)
    if dp < 1 or w.global_batch_size % (c["mbs"] * dp):
        return None
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


# --- policy filters (not Megatron rules) -----------------------------------------------------

@rule("tp_within_nvlink_domain", "tp", "policy: TP traffic is per layer and needs NVLink", policy=True)
def _tp_node(c, w):
    if c["tp"] > w.cluster.nvlink_domain_gpus:
        return f"TP={c['tp']} spans more than one NVLink domain ({w.cluster.nvlink_domain_gpus} GPUs)"


@rule("etp_within_nvlink_domain", "etp", "policy: expert TP traffic needs NVLink", policy=True)
def _etp_node(c, w):
    if c["etp"] > w.cluster.nvlink_domain_gpus:
        return f"ETP={c['etp']} spans more than one NVLink domain ({w.cluster.nvlink_domain_gpus} GPUs)"


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
