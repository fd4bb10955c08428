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

What an nsys trace of a run would show (the simulate backend's `traced` option): each effect's time lands in
one part of the step (compute, communication, idle): where its cause says (a group leaving the node is
communication, a starved GEMM compute, CUDA graphs idle launch gaps), else drawn from the seed. The
split starts from the cost model's predicted terms, as the truth's speed does; the calibration reads it
through the trace's two measured parts only (Landscape.step_parts).
"""

from __future__ import annotations

import functools
import hashlib
import math

import numpy as np

from autotune.config import KNOBS, LayoutConfig, Workload

# the cost model's terms (cost/step_time.py) behind each part of a step a trace tells apart: compute kernels,
# communication not hidden behind them, and idle GPU time (launch gaps, the pipeline bubble)
TRACE_PARTS = {"compute": ("compute", "recompute", "optimizer"), "communication": ("tp", "cp", "ep", "pp", "dp"),
               "idle": ("overhead", "bubble")}


def model_parts(predicted_s: dict[str, float]) -> dict[str, float]:
    """The cost model's predicted seconds of each part of a step (TRACE_PARTS) from its term seconds."""
    return {name: sum(predicted_s.get(term, 0.0) for term in terms) for name, terms in TRACE_PARTS.items()}


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
        return math.prod(factor for factor, _ in self.effects(config, workload))

    def effects(self, config: LayoutConfig, workload: Workload) -> list[tuple[float, str]]:
        """Every throughput factor of `config` (their product is speed_factor) with the part of the step
        its time lands in on a trace: "compute", "communication" or "idle" (launch gaps, bubble). Where
        the family says nothing physical (an interaction, a per-layout deviation) the part is drawn from
        the seed, so a trace tells the truth without the truth taking the cost model's terms' shape."""
        f = self.family
        noise = [(1.0 + self.layout_noise * unit_hash(self.seed, "layout", config.key()),
                  self._part("layout", config.key()))]
        if f == "knob":
            return noise + self._knob(config, self.knob_bias)
        if f == "knobs":
            return (Landscape(self.seed, "mixed", layout_noise=self.layout_noise).effects(config.layout_only(), workload)
                    + [(1.0 + 0.01 * unit_hash(self.seed, "variant", config.key()), "idle")]
                    + self._knob_truth(config, workload))
        strength = 0.6 if f == "mixed" else 1.0
        out = noise
        if f in ("interact", "mixed"):
            out += self._interact(config, 0.12 * strength)
        if f in ("regime", "mixed"):
            out += self._regime(config, workload, strength) + self._knob(config, 0.04)
        if f in ("prior_wrong", "mixed"):
            out += self._sweet_spot(config, strength) + self._knob(config, 0.04)
        return out

    def _part(self, *parts: object) -> str:
        """A seeded part of the step for an effect with no physical home (half compute, a third
        communication, the rest idle)."""
        u = (unit_hash(self.seed, "part", *parts) + 1.0) / 2.0
        return "compute" if u < 0.5 else ("communication" if u < 0.85 else "idle")

    def speed_factors(self, configs: list[LayoutConfig], workload: Workload) -> np.ndarray:
        return np.array([self.speed_factor(c, workload) for c in configs])

    def _knob(self, config: LayoutConfig, bias: float) -> list[tuple[float, str]]:
        values = config.to_dict()
        return [(1.0 + bias * unit_hash(self.seed, "knob", k, values[k]), self._part("knob", k, values[k]))
                for k in KNOBS]

    def _interact(self, config: LayoutConfig, bias: float) -> list[tuple[float, str]]:
        values = config.to_dict()
        values["recompute"] = (config.recompute, config.recompute_method, config.recompute_num_layers)
        return [(1.0 + bias * unit_hash(self.seed, "pair", a, values[a], b, values[b]),
                 self._part("pair", a, values[a], b, values[b])) for a, b in INTERACTING_PAIRS]

    def _regime(self, config: LayoutConfig, w: Workload, strength: float) -> list[tuple[float, str]]:
        # the hidden truth's own notion of the fast domain (the node), deliberately not the model's
        # (Cluster.nvlink_domain_gpus counts a whole NVL72 rack): a landscape must not share the tuner's structure
        domain = min(w.cluster.gpu.nvlink_domain_gpus, w.cluster.gpus_per_node)
        out = []
        tp_group = config.tp * config.cp
        if tp_group > domain:  # TP/CP traffic leaves NVLink: the step turns communication-bound
            out.append((1.0 / (1.0 + strength * _between(self.seed, "tp_cliff", 0.25, 0.6)
                               * math.log2(2 * tp_group / domain)), "communication"))
        expert_group = config.ep * config.etp
        a = w.model.architecture
        if a.num_moe_experts:
            if expert_group > domain:
                out.append((1.0 / (1.0 + strength * _between(self.seed, "ep_cliff", 0.1, 0.3)
                                   * math.log2(expert_group / domain)), "communication"))
            # tokens each local expert gets per micro-batch: the EP group's tokens x top-k / experts
            tokens = config.mbs * w.seq_length / config.cp * a.moe_router_topk * config.ep / a.num_moe_experts
            if tokens < _between(self.seed, "gemm_cliff_tokens", 1024, 8192):  # small GEMMs: slow kernels
                out.append((1.0 - strength * _between(self.seed, "gemm_cliff", 0.15, 0.3), "compute"))
        elif config.mbs * w.seq_length / config.cp < _between(self.seed, "mbs_cliff_tokens", 2048, 8192):
            out.append((1.0 - strength * _between(self.seed, "mbs_cliff", 0.1, 0.2), "compute"))
        return out

    def _sweet_spot(self, config: LayoutConfig, strength: float) -> list[tuple[float, str]]:
        """A bump around seeded PP, MBS and recompute values that the prior knows nothing about."""
        pp = (1, 2, 4, 8)[int((unit_hash(self.seed, "spot", "pp") + 1) * 2)]
        mbs = (1, 2, 4)[int((unit_hash(self.seed, "spot", "mbs") + 1) * 1.5)]
        recompute = ("none", "selective")[int(unit_hash(self.seed, "spot", "rc") > 0)]
        distance = (math.log2(config.pp) - math.log2(pp)) ** 2 + (math.log2(config.mbs) - math.log2(mbs)) ** 2 \
            + (config.recompute != recompute)
        height = strength * _between(self.seed, "spot_height", 0.25, 0.45)
        return [(1.0 + height * math.exp(-distance / 1.5), self._part("spot"))]

    @property
    def owns_knob_effects(self) -> bool:
        """True when the truth of the performance knobs is this landscape's, not the cost model's."""
        return self.family == "knobs"

    def _knob_truth(self, config: LayoutConfig, w: Workload) -> list[tuple[float, str]]:
        """True throughput factors of `config`'s performance knobs (none with the recipe's values), each with
        the part of the step it acts on."""
        def draw(name: str, low: float, high: float) -> float:
            return _between(self.seed, f"knob:{name}", low, high)

        knobs = config.perf()
        if not knobs:
            return []
        node = min(w.cluster.gpu.nvlink_domain_gpus, w.cluster.gpus_per_node)
        leaves_node = config.ep * config.etp > node
        out = []
        dispatcher = knobs.get("dispatcher")
        if dispatcher == "alltoall":
            out.append((1.0 - draw("alltoall", 0.10, 0.35) * (1.0 if leaves_node else 0.3), "communication"))
        elif dispatcher == "flex_deepep":
            out.append((1.0 + draw("deepep", -0.04, 0.04), "communication"))
        if "dispatcher_sms" in knobs:
            out.append((1.0 + 0.02 * unit_hash(self.seed, "sms", knobs["dispatcher_sms"]), "communication"))
        if knobs.get("ep_overlap"):
            out.append((1.0 + draw("ep_overlap", 0.05, 0.25) * (1.0 if leaves_node else 0.4), "communication"))
        graph = knobs.get("cuda_graph")
        if graph is not None:  # graphs remove launch gaps: idle time
            out.append((1.0 + {"none": draw("cg_none", -0.06, 0.0), "te_router": 0.0,
                               "te_attn": draw("cg_attn", -0.04, 0.04), "te_attn_router": draw("cg_attn_router", -0.02, 0.08),
                               "te_attn_mlp": draw("cg_attn_mlp", -0.03, 0.06),
                               "full_iteration": draw("cg_full", -0.05, 0.12)}[graph], "idle"))
            if knobs.get("ep_overlap"):
                out.append((1.0 + 0.05 * unit_hash(self.seed, "overlap_x_graph", graph), "idle"))
        modules = knobs.get("recompute_modules")
        if modules is not None:
            for module in modules.split("+"):
                if module != "core_attn":
                    out.append((1.0 - (draw("rc_moe", 0.15, 0.3) if module == "moe" else draw(f"rc_{module}", 0.01, 0.06)),
                                "compute"))
        if knobs.get("tp_comm_overlap") is False:
            out.append((1.0 - draw("tp_overlap_off", 0.02, 0.10), "communication"))
        for name in ("overlap_grad_reduce", "overlap_param_gather"):
            if knobs.get(name) is False:
                out.append((1.0 - draw(f"{name}_off", 0.0, 0.05), "communication"))
        if "cp_comm_type" in knobs:
            out.append((1.0 + 0.08 * unit_hash(self.seed, "cp_comm", knobs["cp_comm_type"]), "communication"))
        if knobs.get("cpu_offload_layers"):  # the GPU waits on host copies
            # saturating: offloading more than 8 layers costs no more (a factor must stay positive)
            out.append((1.0 - draw("offload", 0.05, 0.2) * min(knobs["cpu_offload_layers"], 8) / 8, "idle"))
        return out

    # --- what a trace of the true step shows ---------------------------------------------------

    def step_parts(self, config: LayoutConfig, workload: Workload, predicted_s: dict[str, float]) -> dict[str, float]:
        """The true step's seconds per part ("compute", "communication", "idle"), from the cost model's
        predicted term seconds of the layout the truth starts from: each effect's extra (or saved) time lands
        in its part. Their sum is the true step (predicted / speed_factor); a saving larger than half its
        part spills over all parts, so none turns negative."""
        parts = model_parts(predicted_s)
        total = sum(parts.values())
        for factor, part in self.effects(config, workload):
            delta = total / factor - total
            if parts[part] + delta < 0.5 * parts[part]:  # more saved than this part could give
                rest = delta + 0.5 * parts[part]
                parts[part] *= 0.5
                spread = 1.0 + rest / sum(parts.values())
                parts = {name: seconds * spread for name, seconds in parts.items()}
            else:
                parts[part] += delta
            total /= factor
        return parts

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
