"""The published ``config.json`` of one real model per supported family, and the same
structure at test size.

``REAL_CONFIGS`` copies what decides a model's structure (heads and KV heads, head_dim,
windows and which layers have them, rope type and bases, norms, soft-caps, multipliers,
tied heads, experts). :func:`scaled_down` keeps all of that and shrinks only the widths,
the depth (to one period of the layer pattern) and the windows (below the test prompts'
lengths), so a tiny random checkpoint exercises every code path of the real one.
"""

from __future__ import annotations

from typing import Any

REAL_CONFIGS: dict[str, dict[str, Any]] = {
    # meta-llama/Llama-3.1-8B-Instruct: llama3 rope scaling, untied head, GQA 4
    "llama3": {
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
    },
    # mistralai/Mistral-7B-v0.1: a 4096-key sliding window on every layer
    "mistral": {
        "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "sliding_window": 4096, "tie_word_embeddings": False,
    },
    # Qwen/Qwen3-0.6B: per-head q/k norm, head_dim 128 != 1024 / 16, tied head
    "qwen3": {
        "model_type": "qwen3", "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": True, "attention_bias": False,
        "use_sliding_window": False, "max_window_layers": 28,
    },
    # google/gemma-2-2b-it: sliding/global alternating, both soft-caps, head_dim 256
    "gemma2": {
        "model_type": "gemma2", "hidden_size": 2304, "intermediate_size": 9216,
        "num_hidden_layers": 26, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096,
        "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True,
    },
    # google/gemma-3-4b-it (text): 5 sliding layers per global one, local rope base 10k,
    # global base 1M with linear scaling x8, q/k norms
    "gemma3": {
        "model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
        "num_hidden_layers": 34, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 1024,
        "sliding_window_pattern": 6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    },
    # microsoft/Phi-3-mini-4k-instruct: fused qkv and gate_up, a 2047-key window, MHA
    "phi3": {
        "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
        "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
        "sliding_window": 2047, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    },
    # microsoft/Phi-4-mini-instruct: longrope, 3/4 of each head rotated, GQA 3, tied head
    "phi4mini": {
        "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192,
        "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
        "partial_rotary_factor": 0.75, "sliding_window": 262144, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": True,
        "rope_scaling": {"type": "longrope", "long_factor": [1.0] * 48, "short_factor": [1.0] * 48},
    },
    # allenai/OLMo-2-0425-1B: norms after the blocks, q/k norm over all heads
    "olmo2": {
        "model_type": "olmo2", "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 16,
        "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 500000.0,
        "tie_word_embeddings": False, "attention_bias": False,
    },
    # ibm-granite/granite-3.1-2b-instruct: the four multipliers, tied head
    "granite": {
        "model_type": "granite", "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 5000000.0,
        "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
        "attention_multiplier": 0.015625, "logits_scaling": 8.0, "tie_word_embeddings": True,
    },
    # HuggingFaceTB/SmolLM3-3B: every 4th layer without rope
    "smollm3": {
        "model_type": "smollm3", "hidden_size": 2048, "intermediate_size": 11008,
        "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 4,
        "no_rope_layer_interval": 4, "max_position_embeddings": 65536, "rms_norm_eps": 1e-6,
        "rope_theta": 5000000.0, "tie_word_embeddings": True, "use_sliding_window": False,
    },
    # Qwen/Qwen3-30B-A3B: 128 experts, 8 per token, renormalised; Qwen3 attention
    "qwen3moe": {
        "model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
        "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
        "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
    },
    # mistralai/Mixtral-8x7B-Instruct-v0.1: 8 experts, 2 per token, every layer sparse
    "mixtral": {
        "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
        "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "sliding_window": None,
        "tie_word_embeddings": False,
    },
}

# Windows at test size: shorter than the parity tests' prompts, some not a block multiple.
TINY_WINDOWS = {"mistral": 16, "gemma2": 9, "gemma3": 12, "phi3": 15, "phi4mini": 40}
# Layers at test size: one whole period of each layer pattern.
TINY_LAYERS = {"gemma2": 2, "gemma3": 6, "smollm3": 4}


def scaled_down(arch: str) -> dict[str, Any]:
    """``REAL_CONFIGS[arch]`` at test size with its structure kept: the same GQA ratio,
    head_dim != hidden / heads where the real model has it, windows and pattern periods,
    rope types (longrope's factor lists cut to the smaller rotary width), experts (8, top-k
    kept below the count)."""
    real = dict(REAL_CONFIGS[arch])
    ratio = real["num_attention_heads"] // real["num_key_value_heads"]
    heads = max(4, ratio)
    hidden = 64
    small = dict(real, hidden_size=hidden, intermediate_size=128,
                 num_hidden_layers=TINY_LAYERS.get(arch, 2), num_attention_heads=heads,
                 num_key_value_heads=heads // ratio, max_position_embeddings=1024)
    if "head_dim" in real:  # keep head_dim independent of hidden / heads
        small["head_dim"] = 32 if hidden // heads != 32 else 24
        if "query_pre_attn_scalar" in real:
            small["query_pre_attn_scalar"] = small["head_dim"]
    if arch in TINY_WINDOWS:
        small["sliding_window"] = TINY_WINDOWS[arch]
    if "rope_scaling" in real:
        scaling = dict(real["rope_scaling"])
        if "original_max_position_embeddings" in scaling:
            scaling["original_max_position_embeddings"] = 256
        if "long_factor" in scaling:  # one factor per rotated pair of dimensions
            pairs = int(hidden // heads * real["partial_rotary_factor"]) // 2
            scaling["long_factor"] = [1.0 + 0.25 * i for i in range(pairs)]
            scaling["short_factor"] = [1.0 + 0.05 * i for i in range(pairs)]
        small["rope_scaling"] = scaling
    if "original_max_position_embeddings" in real:
        small["original_max_position_embeddings"] = 1024
    if "num_experts" in real:
        small.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)
    if "num_local_experts" in real:
        small.update(num_local_experts=8, num_experts_per_tok=2)
    return small
