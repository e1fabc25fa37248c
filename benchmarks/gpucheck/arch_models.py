"""Checkpoints of real architectures' shapes with seeded random weights (no download).

The configs below copy the published ``config.json`` of each model (shapes, RoPE, tied
embeddings, biases). ``build_random_checkpoint`` writes a normal Hugging Face directory
(config, one safetensors file in bf16, the tiny test tokenizer), so both this engine and
transformers load it through their real loaders. ``quick_shape`` keeps a config's
structure (RoPE scaling, GQA, ties, biases) at tiny sizes, for the CPU run.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

LLAMA_3_2_1B: dict[str, Any] = {
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048,
    "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 64, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu",
    "attention_bias": False, "mlp_bias": False,
}
QWEN2_5_0_5B: dict[str, Any] = {
    "model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
    "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
    "num_key_value_heads": 2, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "tie_word_embeddings": True, "use_sliding_window": False,
    "sliding_window": 32768, "max_window_layers": 21, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu",
}
QWEN3_0_6B: dict[str, Any] = {
    "model_type": "qwen3", "vocab_size": 151936, "hidden_size": 1024,
    "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
    "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True,
    "attention_bias": False, "use_sliding_window": False, "max_window_layers": 28,
    "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
}
# Qwen3-30B-A3B's widths and experts (hidden 2048, 32 query / 4 KV heads of 128, experts of
# 768 picked 8 at a time, renormalised), cut to 6 of its 48 layers and 32 of its 128 experts
# so that it fits (and runs in minutes on) a 2-core 24 GiB machine in fp32: 8.0 GB.
QWEN3_MOE_SMALL: dict[str, Any] = {
    "model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 6,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
    "num_experts": 32, "num_experts_per_tok": 8, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
}
# The same with 12 of its 48 layers (10.7 GB in fp32): the experts, not the 151,936-token
# head, take most of a wide step (the 6-layer cut is bound by the head).
QWEN3_MOE_12_LAYERS: dict[str, Any] = {**QWEN3_MOE_SMALL, "num_hidden_layers": 12}
ARCHS = {"llama-3.2-1b": LLAMA_3_2_1B, "qwen2.5-0.5b": QWEN2_5_0_5B}
# Real-shape checkpoints for `benchmarks/make_arch_checkpoint.py` (the CPU comparison with vLLM).
BENCH_ARCHS = {**ARCHS, "qwen3-0.6b": QWEN3_0_6B, "qwen3-moe-small": QWEN3_MOE_SMALL,
               "qwen3-moe-12l": QWEN3_MOE_12_LAYERS}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja")


def quick_shape(config: dict[str, Any]) -> dict[str, Any]:
    """The same architecture at test size: 2 layers, hidden 64, 4 heads over 2 KV heads."""
    small = dict(config, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                 max_position_embeddings=1024, bos_token_id=1, eos_token_id=2)
    if "rope_scaling" in config:
        small["rope_scaling"] = dict(config["rope_scaling"], original_max_position_embeddings=256)
    if "head_dim" in config:
        small["head_dim"] = 16
    if "max_window_layers" in config:
        small["max_window_layers"] = 2
    return small


def _init_tensor(name: str, shape: torch.Size, gen: torch.Generator,
                 device: torch.device) -> torch.Tensor:
    """Seeded values that keep activations O(1) at any depth and logits well separated."""
    if name.endswith("norm.weight"):
        return torch.rand(shape, generator=gen, device=device) * 0.4 + 0.8
    if name.endswith("bias"):
        return torch.randn(shape, generator=gen, device=device) * 0.1
    if name.endswith(("embed_tokens.weight", "lm_head.weight")):
        # Small next to the layers' unit-gain outputs, so the last token's own embedding
        # does not dominate the (tied) logits; logits std ~0.1 * sqrt(hidden).
        return torch.randn(shape, generator=gen, device=device) * 0.1
    return torch.randn(shape, generator=gen, device=device) / shape[-1] ** 0.5  # unit gain


def _hub_names(name: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """transformers keeps a MoE layer's experts stacked (``mlp.experts.gate_up_proj``
    ``[E, 2I, H]``, ``mlp.experts.down_proj`` ``[E, H, I]``); published checkpoints, and
    the loaders of other engines, name each expert's projections: write those."""
    prefix, _, last = name.rpartition(".")
    if not prefix.endswith(".experts") or last not in ("gate_up_proj", "down_proj"):
        return {name: tensor}
    out = {}
    for e, expert in enumerate(tensor):
        if last == "down_proj":
            out[f"{prefix}.{e}.down_proj.weight"] = expert.clone()
        else:
            gate, up = expert.chunk(2, dim=0)
            out[f"{prefix}.{e}.gate_proj.weight"] = gate.clone()
            out[f"{prefix}.{e}.up_proj.weight"] = up.clone()
    return out


def build_random_checkpoint(directory: Path, config: dict[str, Any], *, seed: int,
                            device: torch.device) -> Path:
    """Write a random-weight checkpoint of ``config`` into ``directory`` and return it."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    from worker.engine.models.loader import resolve_checkpoint_dir

    hf_config = AutoConfig.for_model(**config)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(hf_config)
    shapes = {name: t.shape for name, t in skeleton.state_dict().items()}
    if hf_config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in sorted(shapes.items()):
        tensor = _init_tensor(name, shape, gen, device).to(torch.bfloat16).cpu()
        tensors.update(_hub_names(name, tensor))
    directory.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    hf_config.architectures = [type(skeleton).__name__]  # other engines pick their model class by it
    hf_config.save_pretrained(directory)
    tokenizer_dir = Path(resolve_checkpoint_dir("tiny-llama"))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, directory / name)
    return directory


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters (a tied embedding counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())
