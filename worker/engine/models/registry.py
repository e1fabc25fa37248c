"""Which ``model_type`` is which family, and building a model for a config.

The model is made on the ``meta`` device (no memory, no random init), cast, then given
uninitialised storage on the target device, so the only copy of the weights is the one
the loader writes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from worker.engine.models.decoder import PackedCausalLM
from worker.engine.models.families import gemma, granite, llama, moe, olmo2, phi3, smollm3
from worker.engine.models.spec import ArchSpec
from worker.protocol.request_error import InvalidRequestError

FAMILIES: dict[str, Callable[..., ArchSpec]] = {
    "llama": llama.llama,
    "mistral": llama.llama,
    "qwen2": llama.qwen2,
    "qwen3": llama.qwen3,
    "granite": granite.granite,
    "smollm3": smollm3.smollm3,
    "olmo2": olmo2.olmo2,
    "phi3": phi3.phi3,
    "gemma2": gemma.gemma2,
    "gemma3_text": gemma.gemma3,
    "mixtral": moe.mixtral,
    "qwen3_moe": moe.qwen3_moe,
}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)


class UnsupportedModelError(InvalidRequestError):
    """The checkpoint's architecture is not one this engine runs."""


def unsupported(model_type: object) -> UnsupportedModelError:
    """The error for a ``model_type`` no family reads: it names itself and the supported list."""
    return UnsupportedModelError(
        f"model type {model_type!r} is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")


def arch_spec(config) -> ArchSpec:
    """The ArchSpec of ``config``; an unknown ``model_type`` is refused by name."""
    model_type = getattr(config, "model_type", None)
    family = FAMILIES.get(str(model_type))
    if family is None:
        raise unsupported(model_type)
    return family(config)


def build_model(config, max_positions: int, device: torch.device, dtype: torch.dtype) -> PackedCausalLM:
    """An uninitialised model for ``config`` on ``device`` in ``dtype``, rotary tables
    computed; fill it with :func:`worker.engine.models.weights.load_weights`."""
    spec = arch_spec(config)
    # The device is passed to each layer, not set by a `with torch.device(...)` block, and
    # nothing is randomly initialised: either imports torch._dynamo and sympy on meta
    # tensors (~150 MB resident).
    model = PackedCausalLM(config, spec, device=torch.device("meta"))
    model = model.to(dtype=dtype).to_empty(device=device)
    if spec.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.eval()
    model.init_rope(max_positions, device)
    return model
