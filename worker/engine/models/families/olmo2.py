"""OLMo 2: norms after each block instead of before (``x + norm(f(x))``), and RMSNorm over
all q heads together and all k heads together before rope."""

from __future__ import annotations

from worker.engine.models.spec import ArchSpec, base_spec


def olmo2(config) -> ArchSpec:
    return base_spec(config, "olmo2", layout="post", qk_norm="full")
