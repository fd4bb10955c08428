"""Ranges and relations of a model architecture read from a search-space YAML.

The cost model divides by heads, layers and hidden sizes, and legality reasons about experts and
query groups; a file with `num_layers: 0`, no heads or a top-k above the expert count would crash
it (ZeroDivisionError) or be "measured" as a nonsense model. Each check returns the offending key
and a message (the reader turns that into a ConfigError naming the file).
"""

from __future__ import annotations

from autotune.catalog import Architecture

MAX_DIMENSION = 10**7  # no architecture number is this large (vocabularies are below 10**6)
MAX_LAYERS = 10_000
AT_LEAST_ONE = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                "kv_channels", "vocab_size")


def architecture_problem(a: Architecture) -> tuple[str, str] | None:
    """(key, message) of the first range or relation the architecture breaks, else None."""
    for name in AT_LEAST_ONE:
        if getattr(a, name) < 1:
            return name, "must be >= 1"
    for name, value in vars(a).items():
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_DIMENSION:
            return name, f"must be <= {MAX_DIMENSION:,}"
    if a.num_layers > MAX_LAYERS:
        return "num_layers", f"must be <= {MAX_LAYERS:,}"
    if a.num_query_groups > a.num_attention_heads or a.num_attention_heads % a.num_query_groups:
        return "num_query_groups", f"must divide num_attention_heads ({a.num_attention_heads})"
    return _moe_problem(a) or _window_problem(a)


def moe_field_rule(name: str, experts: int) -> str | None:
    """What an MoE model's field must be (None for a field without an MoE rule): one wording for a value out
    of range here and for a negative one refused while the file is read (space/_files.py)."""
    if experts > 0 and name == "moe_router_topk":
        return f"must be in 1..num_moe_experts ({experts})"
    if experts > 0 and name == "moe_ffn_hidden_size":
        return "must be >= 1 for an MoE model"
    return None


def _moe_problem(a: Architecture) -> tuple[str, str] | None:
    if not a.is_moe:
        if a.moe_router_topk or a.moe_ffn_hidden_size or a.num_dense_layers:
            return "num_moe_experts", "is 0 (a dense model), so the moe_* keys and num_dense_layers must be 0"
        return None
    if not 1 <= a.moe_router_topk <= a.num_moe_experts:
        return "moe_router_topk", moe_field_rule("moe_router_topk", a.num_moe_experts)
    if a.moe_ffn_hidden_size < 1:
        return "moe_ffn_hidden_size", moe_field_rule("moe_ffn_hidden_size", a.num_moe_experts)
    if a.num_dense_layers >= a.num_layers:
        return "num_dense_layers", f"must be below num_layers ({a.num_layers})"
    if a.moe_router_group_topk > a.moe_router_topk:
        return "moe_router_group_topk", f"must be <= moe_router_topk ({a.moe_router_topk})"
    return None


def _window_problem(a: Architecture) -> tuple[str, str] | None:
    if a.window_attn_skip_freq and not a.sliding_window:
        return "window_attn_skip_freq", "needs sliding_window > 0"
    return None
