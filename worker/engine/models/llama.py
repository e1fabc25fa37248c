"""Llama-family decoder (Llama, Mistral, Qwen2, SmolLM) over a packed, padding-free batch.

One step's tokens of all sequences form a single 1-D ``input_ids``; attention reads and
writes the paged KV cache through ``kernels`` using an explicit AttentionMetadata.
Weights come from a Hugging Face state dict; q/k/v and gate/up projections are fused so
each weight is one matmul per step for all tokens.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from kernels import AttentionBackend
from kernels.cpu_fused import LayerOps, ops_for, torch_add_rms_norm
from worker.engine.attention_metadata import AttentionMetadata

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def rope_cos_sin(config, max_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``[max_positions, head_dim]`` computed as transformers does."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if rope_type == "default":
        base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        scaling = 1.0
    elif rope_type in ("linear", "llama3", "yarn", "longrope"):
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, None)
    else:
        raise ValueError(f"rope type {rope_type!r} is not supported (dynamic scaling changes per length)")
    positions = torch.arange(max_positions, dtype=torch.float)
    freqs = positions[:, None] * inv_freq[None, :].float()  # [max_positions, head_dim / 2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [max_positions, head_dim]
    return emb.cos() * scaling, emb.sin() * scaling


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in fp32 like the reference implementation (the
    decoder calls it through its LayerOps, fused with the residual add)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, H] -> [T, H]
        return torch_add_rms_norm(x, None, self.weight, self.eps)


class Attention(nn.Module):
    """Grouped-query attention over the paged KV cache."""

    def __init__(self, config) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        bias = bool(getattr(config, "attention_bias", False)) or config.model_type == "qwen2"
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=False)
        self.scale = self.head_dim**-0.5

    def forward(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden_size]
        cos: torch.Tensor,  # [num_tokens, head_dim]
        sin: torch.Tensor,  # [num_tokens, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        backend: AttentionBackend,
        ops: LayerOps,
    ) -> torch.Tensor:  # [num_tokens, hidden_size]
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)  # [num_tokens, q_size + 2 * kv_size]
        ops.rope_qk_(qkv, cos, sin, self.num_heads, self.num_kv_heads)  # q and k rotated in place
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # [num_tokens, H, D], strided rows
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # [num_tokens, Hkv, D]
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)  # [num_tokens, Hkv, D]
        backend.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)  # [num_tokens, num_heads, head_dim]
        nd = meta.num_decode_seqs  # decode sequences own the first nd tokens, one each
        if nd:
            out[:nd] = backend.decode_attention(
                q[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.context_lens[:nd], self.scale
            )
        if nd < meta.num_seqs:
            cu_q = meta.cu_seqlens_q[nd:] - nd  # [num_prefill_seqs + 1], rebased to 0
            out[nd:] = backend.prefill_attention(
                q[nd:], k_cache, v_cache, meta.block_tables[nd:], cu_q,
                meta.context_lens[nd:], self.scale,
            )
        return self.o_proj(out.view(num_tokens, self.q_size))


class MLP(nn.Module):
    """SwiGLU feed-forward with one fused gate/up matmul."""

    def __init__(self, config) -> None:
        super().__init__()
        self.intermediate = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * self.intermediate, bias=False)
        self.down_proj = nn.Linear(self.intermediate, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, ops: LayerOps) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        return self.down_proj(ops.silu_mul(self.gate_up_proj(x)))  # via [T, 2 * intermediate]


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP blocks with residuals."""

    def __init__(self, config) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)


class LlamaForPackedCausalLM(nn.Module):
    """The whole decoder; ``forward`` returns logits only for ``meta.logits_indices``."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, config, max_positions: int) -> None:
        super().__init__()
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model type {config.model_type!r} is not supported; expected one of {SUPPORTED_MODEL_TYPES}"
            )
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.decoder_layers: list[DecoderLayer] = [cast(DecoderLayer, m) for m in self.layers]
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        cos, sin = rope_cos_sin(config, max_positions)
        self.register_buffer("rope_cos", cos, persistent=False)  # [max_positions, head_dim]
        self.register_buffer("rope_sin", sin, persistent=False)  # [max_positions, head_dim]
        self.native_ops = True  # fused native element-wise ops where they exist (CPU fp32)

    @torch.inference_mode()
    def load_hf_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy Hugging Face weights in, fusing q/k/v and gate/up; every weight must be used."""
        used: set[str] = set()

        def take(name: str) -> torch.Tensor:
            used.add(name)
            return state_dict[name]

        self.embed_tokens.weight.copy_(take("model.embed_tokens.weight"))
        self.norm.weight.copy_(take("model.norm.weight"))
        head = "lm_head.weight"
        if head in state_dict and not self.tie_word_embeddings:
            self.lm_head.weight.copy_(take(head))
        else:
            used.add(head)
            self.lm_head.weight = self.embed_tokens.weight  # tied embeddings
        for i, layer in enumerate(self.decoder_layers):
            p = f"model.layers.{i}."
            attn = layer.self_attn
            attn.qkv_proj.weight.copy_(torch.cat([take(p + f"self_attn.{x}_proj.weight") for x in "qkv"]))
            if attn.qkv_proj.bias is not None:
                attn.qkv_proj.bias.copy_(torch.cat([take(p + f"self_attn.{x}_proj.bias") for x in "qkv"]))
            attn.o_proj.weight.copy_(take(p + "self_attn.o_proj.weight"))
            layer.mlp.gate_up_proj.weight.copy_(
                torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")])
            )
            layer.mlp.down_proj.weight.copy_(take(p + "mlp.down_proj.weight"))
            layer.input_layernorm.weight.copy_(take(p + "input_layernorm.weight"))
            layer.post_attention_layernorm.weight.copy_(take(p + "post_attention_layernorm.weight"))
        unused = sorted(set(state_dict) - used - {"lm_head.weight"})
        if unused:
            raise ValueError(f"checkpoint weights this model does not use: {unused[:5]}")

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer (k, v) caches
        backend: AttentionBackend,
    ) -> torch.Tensor:  # [num_sampled, vocab_size]
        """Run all layers over the packed step and return logits of the requested rows.

        The residual stream ``hidden`` is updated in place: each norm first adds the
        previous block's output (``delta``) to it, as one fused op where the device has it.
        """
        hidden = self.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        ops = ops_for(hidden.device, hidden.dtype, self.native_ops)
        cos = self.rope_cos[meta.positions].to(hidden.dtype)  # [num_tokens, head_dim]
        sin = self.rope_sin[meta.positions].to(hidden.dtype)  # [num_tokens, head_dim]
        delta: torch.Tensor | None = None  # the last block's output, not yet added
        for layer, (k_cache, v_cache) in zip(self.decoder_layers, kv_caches, strict=True):
            norm = layer.input_layernorm
            attn_in = ops.add_rms_norm(hidden, delta, norm.weight, norm.eps)
            attn = layer.self_attn(attn_in, cos, sin, k_cache, v_cache, meta, backend, ops)
            norm = layer.post_attention_layernorm
            delta = layer.mlp(ops.add_rms_norm(hidden, attn, norm.weight, norm.eps), ops)
        rows = meta.logits_indices
        last_delta = None if delta is None else delta[rows]
        last = ops.add_rms_norm(hidden[rows], last_delta, self.norm.weight, self.norm.eps)
        return self.lm_head(last).float()  # [num_sampled, vocab_size]
