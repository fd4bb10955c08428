"""Hidden performance landscapes for benchmarks: what a cluster does that the cost model does not say.

A landscape multiplies the cost model's throughput and peak memory by factors fixed by a seed. The
controller never sees them (they live in the simulate backend's options). They are built to NOT share
the tuner's structure, so that a search that only fits its own correction cannot look good:

  knob        per-knob-value biases (+-12%): the shape a one-hot correction fits exactly (issue 8's
              landscape; kept for comparison).
  interact    pairwise interactions: every combination of values of TP x EP, PP x VPP, MBS x recompute,
              TP x CP, EP x ETP, PP x MBS, CP x recompute and dist_opt x PP has its own effect
              (+-12% each), so no single knob value is good or bad on its own.
  regime      regime changes the model does not predict: a TP x CP group or an expert group that leaves
              the NVLink domain makes the step communication-bound (-20..-40%, worse with span), and
              expert GEMMs fed with too few tokens fall off an efficiency cliff (-15..-30% below a
              seeded threshold); dense models get a micro-batch-size cliff instead.
  prior_wrong the optimum sits where the prior does not look: a seeded "sweet spot" of PP, MBS and
              recompute values gets +25..+45%, decaying with log2 distance, so the best layout is one
              the prior ranks low.
  mixed       interact + regime + prior_wrong, weaker each.
  knobs       mixed, plus true effects of the performance knobs (issue 16) drawn from the seed, not
              from the cost model: the simulate backend then starts from the layout's estimate with the
              recipe's knob values (cost/knobs.py never reaches the truth). Effects depend on the layout
              (EP overlap and the all-to-all dispatcher matter when the expert group leaves the node) and
              interact (EP overlap x CUDA graphs), with the signs a user would expect but magnitudes
              anywhere in wide ranges, some of them opposite to the model's (a scope that graphs more can
              be slower).

Every family except `knob` adds per-layout noise (+-2%) and a memory-model error of +-8% per
structural family (TP, PP, CP, EP, ETP); per-run measurement noise is the simulate backend's
`run_noise` option (+-5% in the benchmark), drawn anew for every run of a layout.
"""

from __future__ import annotations

import functools
import hashlib
import math

import numpy as np

from autotune.config import KNOBS, LayoutConfig, Workload

FAMILIES = ("knob", "interact", "regime", "prior_wrong", "mixed", "knobs")
INTERACTING_PAIRS = (("tp", "ep"), ("pp", "vpp"), ("mbs", "recompute"), ("tp", "cp"), ("ep", "etp"),
                     ("pp", "mbs"), ("cp", "recompute"), ("dist_opt", "pp"))


@functools.lru_cache(maxsize=1 << 16)
def unit_hash(*parts: object) -> float:
    """A deterministic number in [-1, 1) from the parts (stable across processes and runs)."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 63 - 1.0


def _between(seed: int, name: str, low: float, high: float) -> float:
    return low + (high - low) * (unit_hash(seed, "draw", name) + 1.0) / 2.0


class Landscape:
    """Seeded throughput and memory factors over the cost model (see the module docstring)."""

    def __init__(self, seed: int, family: str = "knob", *, knob_bias: float = 0.12, layout_noise: float = 0.02,
                 memory_error: float | None = None) -> None:
        if family not in FAMILIES:
            raise ValueError(f"unknown landscape {family!r} (known: {', '.join(FAMILIES)})")
        self.seed, self.family, self.knob_bias, self.layout_noise = seed, family, knob_bias, layout_noise
        self.memory_error = (0.05 if family == "knob" else 0.08) if memory_error is None else memory_error

    # --- throughput ----------------------------------------------------------------------------

    def speed_factor(self, config: LayoutConfig, workload: Workload) -> float:
        f = self.family
        factor = 1.0 + self.layout_noise * unit_hash(self.seed, "layout", config.key())
        if f == "knob":
            return factor * self._knob(config, self.knob_bias)
        if f == "knobs":
            return (Landscape(self.seed, "mixed", layout_noise=self.layout_noise).speed_factor(config.layout_only(), workload)
                    * (1.0 + 0.01 * unit_hash(self.seed, "variant", config.key())) * self._knob_truth(config, workload))
        strength = 0.6 if f == "mixed" else 1.0
        if f in ("interact", "mixed"):
            factor *= self._interact(config, 0.12 * strength)
        if f in ("regime", "mixed"):
            factor *= self._regime(config, workload, strength) * self._knob(config, 0.04)
        if f in ("prior_wrong", "mixed"):
            factor *= self._sweet_spot(config, strength) * self._knob(config, 0.04)
        return factor

    def speed_factors(self, configs: list[LayoutConfig], workload: Workload) -> np.ndarray:
        return np.array([self.speed_factor(c, workload) for c in configs])

    def _knob(self, config: LayoutConfig, bias: float) -> float:
        values = config.to_dict()
        return math.prod(1.0 + bias * unit_hash(self.seed, "knob", k, values[k]) for k in KNOBS)

    def _interact(self, config: LayoutConfig, bias: float) -> float:
        values = config.to_dict()
        values["recompute"] = (config.recompute, config.recompute_method, config.recompute_num_layers)
        return math.prod(1.0 + bias * unit_hash(self.seed, "pair", a, values[a], b, values[b])
                         for a, b in INTERACTING_PAIRS)

    def _regime(self, config: LayoutConfig, w: Workload, strength: float) -> float:
        # the hidden truth's own notion of the fast domain (the node), deliberately not the model's
        # (Cluster.nvlink_domain_gpus counts a whole NVL72 rack): a landscape must not share the tuner's structure
        domain = min(w.cluster.gpu.nvlink_domain_gpus, w.cluster.gpus_per_node)
        factor = 1.0
        tp_group = config.tp * config.cp
        if tp_group > domain:  # TP/CP traffic leaves NVLink: the step turns communication-bound
            factor /= 1.0 + strength * _between(self.seed, "tp_cliff", 0.25, 0.6) * math.log2(2 * tp_group / domain)
        expert_group = config.ep * config.etp
        a = w.model.architecture
        if a.num_moe_experts:
            if expert_group > domain:
                factor /= 1.0 + strength * _between(self.seed, "ep_cliff", 0.1, 0.3) * math.log2(expert_group / domain)
            # tokens each local expert gets per micro-batch: the EP group's tokens x top-k / experts
            tokens = config.mbs * w.seq_length / config.cp * a.moe_router_topk * config.ep / a.num_moe_experts
            if tokens < _between(self.seed, "gemm_cliff_tokens", 1024, 8192):
                factor *= 1.0 - strength * _between(self.seed, "gemm_cliff", 0.15, 0.3)
        elif config.mbs * w.seq_length / config.cp < _between(self.seed, "mbs_cliff_tokens", 2048, 8192):
            factor *= 1.0 - strength * _between(self.seed, "mbs_cliff", 0.1, 0.2)
        return factor

    def _sweet_spot(self, config: LayoutConfig, strength: float) -> float:
        """A bump around seeded PP, MBS and recompute values that the prior knows nothing about."""
        pp = (1, 2, 4, 8)[int((unit_hash(self.seed, "spot", "pp") + 1) * 2)]
        mbs = (1, 2, 4)[int((unit_hash(self.seed, "spot", "mbs") + 1) * 1.5)]
        recompute = ("none", "selective")[int(unit_hash(self.seed, "spot", "rc") > 0)]
        distance = (math.log2(config.pp) - math.log2(pp)) ** 2 + (math.log2(config.mbs) - math.log2(mbs)) ** 2 \
            + (config.recompute != recompute)
        height = strength * _between(self.seed, "spot_height", 0.25, 0.45)
        return 1.0 + height * math.exp(-distance / 1.5)

    @property
    def owns_knob_effects(self) -> bool:
        """True when the truth of the performance knobs is this landscape's, not the cost model's."""
        return self.family == "knobs"

    def _knob_truth(self, config: LayoutConfig, w: Workload) -> float:
        """True throughput factor of `config`'s performance knobs (1 with the recipe's values)."""
        def draw(name: str, low: float, high: float) -> float:
            return _between(self.seed, f"knob:{name}", low, high)

        knobs = config.perf()
        if not knobs:
            return 1.0
        node = min(w.cluster.gpu.nvlink_domain_gpus, w.cluster.gpus_per_node)
        leaves_node = config.ep * config.etp > node
        factor = 1.0
        dispatcher = knobs.get("dispatcher")
        if dispatcher == "alltoall":
            factor *= 1.0 - draw("alltoall", 0.10, 0.35) * (1.0 if leaves_node else 0.3)
        elif dispatcher == "flex_deepep":
            factor *= 1.0 + draw("deepep", -0.04, 0.04)
        if "dispatcher_sms" in knobs:
            factor *= 1.0 + 0.02 * unit_hash(self.seed, "sms", knobs["dispatcher_sms"])
        if knobs.get("ep_overlap"):
            factor *= 1.0 + draw("ep_overlap", 0.05, 0.25) * (1.0 if leaves_node else 0.4)
        graph = knobs.get("cuda_graph")
        if graph is not None:
            factor *= 1.0 + {"none": draw("cg_none", -0.06, 0.0), "te_router": 0.0,
                             "te_attn": draw("cg_attn", -0.04, 0.04), "te_attn_router": draw("cg_attn_router", -0.02, 0.08),
                             "te_attn_mlp": draw("cg_attn_mlp", -0.03, 0.06),
                             "full_iteration": draw("cg_full", -0.05, 0.12)}[graph]
            if knobs.get("ep_overlap"):
                factor *= 1.0 + 0.05 * unit_hash(self.seed, "overlap_x_graph", graph)
        modules = knobs.get("recompute_modules")
        if modules is not None:
            for module in modules.split("+"):
                if module != "core_attn":
                    factor *= 1.0 - (draw("rc_moe", 0.15, 0.3) if module == "moe" else draw(f"rc_{module}", 0.01, 0.06))
        if knobs.get("tp_comm_overlap") is False:
            factor *= 1.0 - draw("tp_overlap_off", 0.02, 0.10)
        for name in ("overlap_grad_reduce", "overlap_param_gather"):
            if knobs.get(name) is False:
                factor *= 1.0 - draw(f"{name}_off", 0.0, 0.05)
        if "cp_comm_type" in knobs:
            factor *= 1.0 + 0.08 * unit_hash(self.seed, "cp_comm", knobs["cp_comm_type"])
        if knobs.get("cpu_offload_layers"):
            factor *= 1.0 - draw("offload", 0.05, 0.2) * knobs["cpu_offload_layers"] / 8
        return factor

    # --- memory --------------------------------------------------------------------------------

    def memory_factor(self, config: LayoutConfig) -> float:
        structural = (config.tp, config.pp, config.cp, config.ep, config.etp)
        return 1.0 + self.memory_error * unit_hash(self.seed, "memory", structural)


def run_noise_factor(seed: int, trial: int, attempt: int, run_noise: float) -> float:
    """Per-run throughput noise (uniform within +-run_noise), new for every run of a layout."""
    if run_noise <= 0:
        return 1.0
    return 1.0 + run_noise * unit_hash(seed, "run", trial, attempt)


STRAGGLER_SLOWDOWN = (0.2, 0.4)  # a straggler's throughput is this much lower (uniform within)


def straggler_factor(seed: int, trial: int, attempt: int, rate: float) -> float:
    """A run that landed on a slow node (a throttled GPU, a congested link), a share `rate` of all runs:
    its throughput 20-40% lower, whatever its layout; 1.0 for the others."""
    if rate <= 0 or (unit_hash(seed, "straggler", trial, attempt) + 1.0) / 2.0 >= rate:
        return 1.0
    low, high = STRAGGLER_SLOWDOWN
    return 1.0 - (low + (high - low) * (unit_hash(seed, "straggler size", trial, attempt) + 1.0) / 2.0)
