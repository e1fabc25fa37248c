"""Granite 3: Llama with four multipliers (embedding, residual branch, attention scale in
place of head_dim^-0.5, and a divisor of the logits)."""

from __future__ import annotations

from worker.engine.models.spec import ArchSpec, base_spec


def granite(config) -> ArchSpec:
    return base_spec(
        config, "granite",
        embed_scale=float(config.embedding_multiplier),
        residual_scale=float(config.residual_multiplier),
        attn_scale=float(config.attention_multiplier),
        logits_divisor=float(config.logits_scaling),
    )
