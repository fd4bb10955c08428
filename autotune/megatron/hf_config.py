"""An HF `config.json` for each catalog model, built offline from the catalog.

Megatron-Bridge recipes build the model from a hub download; an offline GPU host (and the CPU
probe) builds it with `AutoBridge.from_hf_config(AutoConfig.for_model(model_type, **fields))`
instead. Architecture numbers come from the catalog (mapped to each model type's HF names here);
the other values (RoPE, norms, context length) from `hf.extra` in the model's YAML.
"""

from __future__ import annotations

from typing import Any

from autotune.catalog import ModelSpec

def hf_config(model: ModelSpec) -> dict[str, Any]:
    a = model.architecture
    fields: dict[str, Any] = {
        "model_type": model.hf_model_type, "architectures": [model.hf_architecture],
        "num_hidden_layers": a.num_layers, "hidden_size": a.hidden_size, "intermediate_size": a.ffn_hidden_size,
        "num_attention_heads": a.num_attention_heads, "num_key_value_heads": a.num_query_groups,
        "head_dim": a.kv_channels, "vocab_size": a.vocab_size,
    }
    kind = model.hf_model_type
    if kind == "qwen3_moe":
        fields.update(num_experts=a.num_moe_experts, num_experts_per_tok=a.moe_router_topk,
                      moe_intermediate_size=a.moe_ffn_hidden_size, decoder_sparse_step=1, mlp_only_layers=[])
    elif kind == "deepseek_v3":
        fields.pop("head_dim")
        fields.update(n_routed_experts=a.num_moe_experts, num_experts_per_tok=a.moe_router_topk,
                      moe_intermediate_size=a.moe_ffn_hidden_size,
                      n_shared_experts=a.moe_shared_expert_ffn_hidden_size // a.moe_ffn_hidden_size,
                      first_k_dense_replace=a.num_dense_layers, q_lora_rank=a.q_lora_rank,
                      kv_lora_rank=a.kv_lora_rank, qk_nope_head_dim=a.qk_head_dim,
                      qk_rope_head_dim=a.qk_pos_emb_head_dim, v_head_dim=a.v_head_dim,
                      n_group=8, topk_group=a.moe_router_group_topk, num_nextn_predict_layers=a.mtp_num_layers)
    elif kind == "gpt_oss":
        fields.update(num_local_experts=a.num_moe_experts, num_experts_per_tok=a.moe_router_topk,
                      sliding_window=a.sliding_window,
                      layer_types=["sliding_attention" if (i + 1) % a.window_attn_skip_freq else "full_attention"
                                   for i in range(a.num_layers)])
    fields.update(model.hf_extra)
    return fields
