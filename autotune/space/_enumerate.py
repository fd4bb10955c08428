"""Enumeration of the legal set: a depth-first walk that fixes knobs level by level.

Each rule is checked at the first level where all the knobs it reads are fixed. A rule that fails
there rejects the whole subtree below, counted at once (the product of the remaining domain sizes)
without visiting it, so the walk only visits partial layouts that are still legal. Rejections are
attributed to the first failing rule in level order. Policy filters do not prune: a layout that
passes every Megatron rule but fails a policy is counted as `policy`-filtered, so the Megatron-legal
count is `legal + filtered_by_policy`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from autotune.config import KNOBS, LayoutConfig, Workload
from autotune.space._files import SearchSpace
from autotune.space.legality import POLICIES, RULES, Rule

RECOMPUTE_KNOBS = ("recompute", "recompute_method", "recompute_num_layers")
LEVEL_ORDER: tuple[tuple[str, ...], ...] = (
    ("tp",), ("cp",), ("pp",), ("vpp",), ("ep",), ("etp",), ("sp",), ("mbs",), RECOMPUTE_KNOBS, ("dist_opt",),
)


@dataclass
class LegalSet:
    """The result of enumerating a space on a workload."""

    configs: list[LayoutConfig]
    candidates: int
    rejected_by_rule: Counter = field(default_factory=Counter)
    filtered_by_policy: Counter = field(default_factory=Counter)

    @property
    def megatron_legal(self) -> int:
        return len(self.configs) + sum(self.filtered_by_policy.values())

    def emptiest_rule(self) -> str | None:
        """The rule that rejected most candidates: the likely reason when the set is empty."""
        merged = self.rejected_by_rule + self.filtered_by_policy
        return merged.most_common(1)[0][0] if merged else None


def _recompute_variants(domains: dict[str, tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """(granularity, method, num_layers) triples: method and layers only vary under full recompute."""
    variants: list[tuple[Any, ...]] = []
    for granularity in domains["recompute"]:
        if granularity == "full":
            methods = [m for m in domains["recompute_method"] if m is not None] or [None]
            layers = [n for n in domains["recompute_num_layers"] if n is not None] or [None]
            variants.extend(("full", m, n) for m in methods for n in layers)
        else:
            variants.append((granularity, None, None))
    return variants


def _levels(space: SearchSpace) -> list[tuple[tuple[str, ...], list[tuple[Any, ...]]]]:
    levels = []
    for knobs in LEVEL_ORDER:
        if knobs == RECOMPUTE_KNOBS:
            levels.append((knobs, _recompute_variants(space.domains)))
        else:
            levels.append((knobs, [(v,) for v in space.domains[knobs[0]]]))
    return levels


def _rules_by_level(rules: list[Rule], levels) -> list[list[Rule]]:
    placed: list[list[Rule]] = [[] for _ in levels]
    for r in rules:
        fixed: set[str] = set()
        for index, (knobs, _) in enumerate(levels):
            fixed.update(knobs)
            if r.knobs <= fixed:
                placed[index].append(r)
                break
    return placed


# the last enumeration, by the repr of its space and workload (frozen dataclasses whose repr shows every
# field): a study's creation checks the legal set and its controller builds on it, in one process, and
# each walk takes seconds at 64 GPUs (~180,000 layouts)
_LAST: tuple[tuple[str, str], "LegalSet"] | None = None


def enumerate_legal(space: SearchSpace, workload: Workload) -> LegalSet:
    """Every layout of `space` that Megatron accepts on `workload` and the enabled policies allow.

    The caller owns what it gets: a copy of the last result when asked again for the same space and
    workload."""
    global _LAST
    key = (repr(space), repr(workload))
    if _LAST is None or _LAST[0] != key:
        _LAST = (key, _enumerate(space, workload))
    last = _LAST[1]
    return LegalSet(list(last.configs), last.candidates, Counter(last.rejected_by_rule),
                    Counter(last.filtered_by_policy))


def _enumerate(space: SearchSpace, workload: Workload) -> LegalSet:
    levels = _levels(space)
    hard = _rules_by_level(RULES, levels)
    policies = _rules_by_level([p for p in POLICIES if space.policy.get(p.name, True)], levels)
    sizes = [len(values) for _, values in levels]
    below = [math.prod(sizes[i + 1:]) for i in range(len(levels))]
    result = LegalSet(configs=[], candidates=math.prod(sizes))
    values: dict[str, Any] = {}
    # the layout knobs are the dataclass's leading fields; performance knobs stay at the recipe's value (None)
    field_order = tuple(n for n in LayoutConfig.__dataclass_fields__ if n in KNOBS)

    def walk(depth: int, policy_failure: str | None) -> None:
        knobs, options = levels[depth]
        for option in options:
            for name, value in zip(knobs, option):
                values[name] = value
            failed = next((r.name for r in hard[depth] if r.check(values, workload)), None)
            if failed is not None:
                result.rejected_by_rule[failed] += below[depth]
                continue
            failure = policy_failure or next(
                (p.name for p in policies[depth] if p.check(values, workload)), None)
            if depth + 1 < len(levels):
                walk(depth + 1, failure)
            elif failure is not None:
                result.filtered_by_policy[failure] += 1
            else:
                result.configs.append(LayoutConfig(*(values[n] for n in field_order)))

    walk(0, None)
    return result
