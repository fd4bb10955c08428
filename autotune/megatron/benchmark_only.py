"""Benchmark-only settings (issue 16): switches that make a measurement faster or steadier but change
what is trained, or drop a safety check. NVIDIA's published MoE numbers use some of them (forced router
load balancing in every Qwen3 / DeepSeek-V3 skill-card row), so a user reproducing them may turn them on
for a study; they are never part of a tuned result: off by default, named on every leaderboard of the
study, and refused by `export` unless the user insists (`--allow-benchmark-settings`).

Field paths read from Megatron-Core TransformerConfig (moe_router_force_load_balancing: "[Experimental]
... only for benchmark"), DistributedDataParallelConfig and Bridge's RerunStateMachineConfig.
"""

from __future__ import annotations

from typing import Any

from autotune.errors import ConfigError

# name -> (Bridge field path, what it changes)
SETTINGS: dict[str, tuple[str, str]] = {
    "moe_router_force_load_balancing": ("model.moe_router_force_load_balancing",
                                        "routes tokens evenly whatever the router says (changes training)"),
    "check_for_nan_in_loss": ("rerun_state_machine.check_for_nan_in_loss", "a safety check of the loss"),
    "check_for_nan_in_grad": ("ddp.check_for_nan_in_grad", "a safety check of the gradients"),
    "check_for_large_grads": ("ddp.check_for_large_grads", "a safety check of the gradients"),
}
# the value each setting has when it changes nothing (the recipes' value)
SAFE = {"moe_router_force_load_balancing": False, "check_for_nan_in_loss": True, "check_for_nan_in_grad": True,
        "check_for_large_grads": True}


def parse(items: list[str]) -> dict[str, bool]:
    """`NAME=true|false` items (repeatable flag) -> {name: value}; an unknown name is one line of error."""
    settings: dict[str, bool] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or name not in SETTINGS:
            raise ConfigError(f"--benchmark-setting takes NAME=true|false with NAME one of {', '.join(SETTINGS)}, "
                              f"got {item[:80]!r}")
        value = raw.strip().lower()
        if value not in ("true", "false"):
            raise ConfigError(f"--benchmark-setting {name} takes true or false, got {raw[:40]!r}")
        settings[name] = value == "true"
    return settings


def checked(stored: Any) -> dict[str, bool]:
    """The settings of a stored study, each checked (a study row is input like any other)."""
    if not stored:
        return {}
    if not isinstance(stored, dict) or not all(k in SETTINGS and isinstance(v, bool) for k, v in stored.items()):
        raise ConfigError("the study's benchmark settings are malformed")
    return dict(stored)


def of_study(study: Any) -> dict[str, bool]:
    """The checked settings a stored study ran with (its options' `benchmark_settings`)."""
    return checked((study.options or {}).get("benchmark_settings"))


def active(settings: dict[str, bool]) -> dict[str, bool]:
    """The settings that differ from the recipes' values: what makes a result benchmark-only."""
    return {k: v for k, v in settings.items() if v != SAFE[k]}


def overrides(settings: dict[str, bool]) -> list[str]:
    return [f"{SETTINGS[k][0]}={'true' if v else 'false'}" for k, v in settings.items()]


def label(settings: dict[str, bool]) -> str:
    """`benchmark-only: moe_router_force_load_balancing=true` (empty when none is active)."""
    on = active(settings)
    return ("benchmark-only: " + ", ".join(f"{k}={'true' if v else 'false'}" for k, v in on.items())) if on else ""
