"""Phi-3 and Phi-4: Llama with q/k/v and gate/up already fused in the checkpoint (the
loader takes ``qkv_proj`` and ``gate_up_proj`` whole), ``longrope`` scaling, a partial
rotary factor (Phi-4-mini rotates 3/4 of each head) and a window on every layer when the
config has one."""

from __future__ import annotations

from worker.engine.models.spec import ArchSpec, RopeSpec, base_spec, head_dim_of, rope_parameters


def phi3(config) -> ArchSpec:
    params = rope_parameters(config)
    factor = float(params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)))
    rotary_dim = int(head_dim_of(config) * factor)
    return base_spec(config, "phi3", ropes={"default": RopeSpec(params, rotary_dim)})
