"""Mixture-of-experts families: Mixtral (every layer sparse, top-k weights always
renormalised, Llama attention with an optional window) and Qwen3-MoE (Qwen3 attention;
sparse layers chosen by ``decoder_sparse_step`` and ``mlp_only_layers``, renormalised when
``norm_topk_prob``)."""

from __future__ import annotations

from worker.engine.models.spec import ArchSpec, MoESpec, base_spec


def mixtral(config) -> ArchSpec:
    moe = MoESpec(
        num_experts=config.num_local_experts,
        top_k=config.num_experts_per_tok,
        intermediate_size=config.intermediate_size,
        renormalize=True,
        sparse_layers=frozenset(range(config.num_hidden_layers)),
    )
    return base_spec(config, "mixtral", moe=moe)


def qwen3_moe(config) -> ArchSpec:
    step = config.decoder_sparse_step
    dense = set(config.mlp_only_layers or ())
    sparse = frozenset(i for i in range(config.num_hidden_layers)
                       if i not in dense and config.num_experts > 0 and (i + 1) % step == 0)
    moe = MoESpec(
        num_experts=config.num_experts,
        top_k=config.num_experts_per_tok,
        intermediate_size=config.moe_intermediate_size,
        renormalize=bool(config.norm_topk_prob),
        sparse_layers=sparse,
    )
    return base_spec(config, "qwen3_moe", qk_norm="head", moe=moe)
