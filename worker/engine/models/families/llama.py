"""Llama 2/3.x (rope scaling ``llama3``, tied or untied heads), Mistral (its sliding window
on every layer), Qwen2/2.5 (q/k/v bias; windows on the layers ``layer_types`` names) and
Qwen3 (per-head q/k RMSNorm, no bias): Llama with small differences."""

from __future__ import annotations

from worker.engine.models.spec import ArchSpec, base_spec


def llama(config) -> ArchSpec:
    """Llama as it is; a ``sliding_window`` in the config (Mistral) windows every layer."""
    return base_spec(config, config.model_type)


def qwen2(config) -> ArchSpec:
    """Llama with a bias on q, k and v (not on o)."""
    return base_spec(config, "qwen2", qkv_bias=True, o_bias=False)


def qwen3(config) -> ArchSpec:
    """Llama with RMSNorm over each q and k head before rope."""
    return base_spec(config, "qwen3", qk_norm="head")
