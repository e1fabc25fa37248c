"""Rotary tables computed as transformers computes them, and the partial-rotary apply.

A table is ``cos, sin`` of shape ``[max_positions, rotary_dim]``; the decoder gathers the
rows of a step's positions once per table and every layer that uses the table reads them.
"""

from __future__ import annotations

import torch

from worker.engine.models.spec import RopeSpec

# Rope types whose frequencies do not depend on the sequence length (dynamic NTK does).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


def rope_table(config, rope: RopeSpec, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[max_positions, rotary_dim]`` of one rotary table.

    ``longrope`` (Phi-3/4) has a short and a long factor: positions below the config's
    ``original_max_position_embeddings`` use the short one and positions past it the long one
    (as vLLM does; transformers switches every position at once when the sequence crosses
    that length, which no paged cache can do).
    """
    params = rope.parameters
    rope_type = params.get("rope_type", "default")
    if rope_type not in STATIC_ROPE_TYPES:
        raise ValueError(f"rope type {rope_type!r} is not supported (dynamic scaling changes per length)")
    positions = torch.arange(max_positions, dtype=torch.float)  # [P]
    if rope_type == "default":
        dim = rope.rotary_dim
        base = params["rope_theta"]
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        return _cos_sin(positions, inv_freq, 1.0)
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    init = ROPE_INIT_FUNCTIONS[rope_type]
    kwargs = {"layer_type": rope.layer_type} if rope.layer_type is not None else {}
    inv_freq, scaling = init(config, None, **kwargs)
    cos, sin = _cos_sin(positions, inv_freq, scaling)
    if rope_type == "longrope":
        original = int(params.get("original_max_position_embeddings")
                       or getattr(config, "original_max_position_embeddings", 0) or max_positions)
        if original < max_positions:
            long_freq, long_scaling = init(config, None, seq_len=original + 1, **kwargs)
            long_cos, long_sin = _cos_sin(positions, long_freq, long_scaling)
            cos[original:], sin[original:] = long_cos[original:], long_sin[original:]
    return cos, sin


def _cos_sin(positions: torch.Tensor,  # [P]
             inv_freq: torch.Tensor,  # [rotary_dim / 2]
             scaling: float) -> tuple[torch.Tensor, torch.Tensor]:  # 2 x [P, rotary_dim]
    freqs = positions[:, None] * inv_freq[None, :].float()  # [P, rotary_dim / 2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [P, rotary_dim]
    return emb.cos() * scaling, emb.sin() * scaling


def rope_partial_(qkv: torch.Tensor,  # [T, (Hq + 2 Hkv) * D], q and k rotated in place
                  cos: torch.Tensor,  # [T, R], R = rotary_dim < D
                  sin: torch.Tensor,  # [T, R]
                  num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    """Rotate the first R dimensions of every q and k head (rotate_half within those R);
    the other D - R dimensions pass through, as transformers' partial rotary."""
    num_tokens, rotary_dim = cos.shape
    heads = num_heads + num_kv_heads
    x = qkv[:, : heads * head_dim].view(num_tokens, heads, head_dim)[..., :rotary_dim]  # [T, Hq + Hkv, R]
    half = rotary_dim // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # rotate_half, [T, Hq + Hkv, R]
    x.copy_(x * cos.unsqueeze(1) + turned * sin.unsqueeze(1))
