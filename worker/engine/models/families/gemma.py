"""Gemma 2 and Gemma 3 (text): GeGLU MLP, ``(1 + w)`` RMSNorm, a norm before and after each
block, embeddings scaled by sqrt(hidden), attention scaled by ``query_pre_attn_scalar``,
sliding and global layers interleaved. Gemma 2 soft-caps attention and final logits;
Gemma 3 normalises each q and k head and gives sliding and global layers their own rope."""

from __future__ import annotations

from worker.engine.models.spec import ArchSpec, RopeSpec, base_spec, head_dim_of, rope_parameters


def _gemma_common(config) -> dict:
    return dict(
        layout="sandwich",
        norm_offset=1.0,
        embed_scale=float(config.hidden_size) ** 0.5,
        attn_scale=float(config.query_pre_attn_scalar) ** -0.5,
        attn_softcap=float(getattr(config, "attn_logit_softcapping", None) or 0.0),
        final_softcap=float(getattr(config, "final_logit_softcapping", None) or 0.0),
    )


def gemma2(config) -> ArchSpec:
    return base_spec(config, "gemma2", **_gemma_common(config))


def gemma3(config) -> ArchSpec:
    head_dim = head_dim_of(config)
    types = tuple(config.layer_types)
    ropes = {t: RopeSpec(rope_parameters(config, t), head_dim, layer_type=t) for t in sorted(set(types))}
    return base_spec(config, "gemma3", qk_norm="head", layer_rope=types, ropes=ropes,
                     **_gemma_common(config))
