"""Tiny random checkpoints of every supported family, built offline, for tests and demos.

``build_tiny_checkpoint(path, arch)`` writes a normal Hugging Face directory (config,
safetensors weights, tokenizer) so every loading path is the real one. Weights come from
a fixed seed and are scaled up so logits are well separated: greedy ties, which would make
parity tests depend on float rounding, are then vanishingly rare.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from worker.engine.models.checkpoint_dirs import TINY_ARCHS, tiny_checkpoint_version
from worker.engine.models.tiny_archs import REAL_CONFIGS, scaled_down

__all__ = ["TINY_ARCHS", "build_tiny_checkpoint", "tiny_checkpoint_version"]

# tiny-llama and tiny-qwen2 keep their original small configs; the others are a real
# model's config scaled down (tiny_archs.py).

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A continuous batching engine schedules one token per running sequence each step.",
    "Paged attention keeps keys and values in fixed-size blocks of sixteen tokens.",
    "Redis streams carry jobs to workers; SQL keeps results and traces.",
    "def main():\n    print('hello, world')\n",
    "0123456789 + - * / = ( ) [ ] { } < > ! ? , . ; :",
    "Once upon a time there was a small model that generated text very quickly.",
]
_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _build_tokenizer(vocab_size: int):  # -> PreTrainedTokenizerFast
    """A byte-level BPE trained in memory on a fixed corpus: deterministic, no network."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        chat_template=_CHAT_TEMPLATE,
    )


def _build_config(arch: str, vocab_size: int, eos_id: int, pad_id: int):
    from transformers import AutoConfig, LlamaConfig, Qwen2Config

    ids = dict(vocab_size=vocab_size, eos_token_id=eos_id, bos_token_id=eos_id, pad_token_id=pad_id)
    if arch in REAL_CONFIGS:
        small = scaled_down(arch)
        return AutoConfig.for_model(small.pop("model_type"), **small, **ids)

    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-6,
        eos_token_id=eos_id,
        bos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    if arch == "llama":
        return LlamaConfig(**common, head_dim=16, tie_word_embeddings=True)
    if arch == "qwen2":
        return Qwen2Config(**common, tie_word_embeddings=False, use_sliding_window=False)
    raise ValueError(f"unknown tiny architecture {arch!r}; expected one of {TINY_ARCHS}")


def build_tiny_checkpoint(path: str | Path, arch: str = "llama", seed: int = 0,
                          overrides: dict[str, Any] | None = None) -> Path:
    """Write a tiny random ``arch`` checkpoint (HF format) into ``path`` and return it.
    ``overrides`` replace fields of its config (widths, depth, a vocabulary larger than the
    tokenizer's, whose extra ids no text decodes to)."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    tokenizer = _build_tokenizer(vocab_size=384)
    vocab_size = len(tokenizer)
    config = _build_config(arch, vocab_size, tokenizer.eos_token_id, tokenizer.pad_token_id)
    for key, value in (overrides or {}).items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Gemma's norms multiply by (1 + w): their weights sit around 0, the others' around 1.
    # Gemma scales embeddings by sqrt(hidden): its table is drawn that much smaller, or the
    # current token's own embedding would swamp the residual stream and the (tied) logits.
    gemma = config.model_type.startswith("gemma")
    norm_centre = 0.0 if gemma else 1.0
    embed_std = 0.2 / config.hidden_size**0.5 if gemma else 0.2
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(norm_centre - 0.2, norm_centre + 0.2)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.1)
            elif name.endswith("embed_tokens.weight"):
                param.normal_(0.0, embed_std)
            else:
                # std 0.2 instead of the 0.02 init: logits spread over several units.
                param.normal_(0.0, 0.2)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
