"""The blocks of the shared decoder: attention over the paged KV cache, the dense gated MLP,
the mixture-of-experts MLP and the decoder layer that holds them with its norms.

Every block reads its family's choices from an :class:`ArchSpec`; none knows a family by
name. Parameter names follow the Hugging Face checkpoints (``self_attn``, ``mlp``,
``input_layernorm``, ...) except for the fused projections ``qkv_proj`` and
``gate_up_proj``, so loading is a rename and a slice (``weights.py``).
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn

from kernels import AttentionBackend
from kernels.cpu_fused import LayerOps
from worker.engine.attention_metadata import AttentionMetadata
from worker.engine.models.cpu_linear import GroupedPanelMatmul, PackedMatmul, Packer, group_experts
from worker.engine.models.rope import rope_partial_
from worker.engine.models.spec import ArchSpec, MoESpec


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in fp32 (the decoder calls it through its LayerOps,
    fused with the residual add). Gemma's ``(1 + w)`` form is loaded as ``w + 1``, which is
    the same product in fp32."""

    def __init__(self, width: int, eps: float, device: torch.device | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width, device=device))
        self.eps = eps


def gated_activation(gate_up: torch.Tensor, activation: str, ops: LayerOps) -> torch.Tensor:
    """``act(gate) * up`` of a fused gate/up output ``[T, 2 I]`` -> ``[T, I]``."""
    if activation == "silu":
        return ops.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)  # 2 x [T, I]
    return F.gelu(gate, approximate="tanh") * up


class Attention(nn.Module):
    """Grouped-query attention of one layer: fused q/k/v projection, optional q/k RMSNorm
    (per head or over all heads), rope (full, partial or none), the layer's sliding window
    and logit soft-cap, and the output projection."""

    def __init__(self, spec: ArchSpec, layer: int, device: torch.device | None = None) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.q_size, self.kv_size = spec.q_size, spec.kv_size
        self.qkv_proj = nn.Linear(spec.hidden_size, self.q_size + 2 * self.kv_size,
                                  bias=spec.qkv_bias, device=device)
        self.o_proj = nn.Linear(self.q_size, spec.hidden_size, bias=spec.o_bias, device=device)
        self.qk_norm = spec.qk_norm
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if spec.qk_norm != "none":
            per_head = spec.qk_norm == "head"
            self.q_norm = RMSNorm(self.head_dim if per_head else self.q_size, spec.rms_norm_eps, device)
            self.k_norm = RMSNorm(self.head_dim if per_head else self.kv_size, spec.rms_norm_eps, device)
        self.rope = spec.layer_rope[layer]  # key of this layer's rotary table, None: no rope
        self.rotary_dim = spec.ropes[self.rope].rotary_dim if self.rope else 0
        self.window = spec.layer_windows[layer]
        self.softcap = spec.attn_softcap
        self.scale = spec.attn_scale

    def forward(
        self,
        hidden: torch.Tensor,  # [num_tokens, hidden_size]
        rope: dict[str, tuple[torch.Tensor, torch.Tensor]],  # table -> cos, sin [num_tokens, R]
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        backend: AttentionBackend,
        ops: LayerOps,
    ) -> torch.Tensor:  # [num_tokens, hidden_size]
        num_tokens = hidden.shape[0]
        qkv = self.qkv_proj(hidden)  # [num_tokens, q_size + 2 * kv_size]
        if self.q_norm is not None and self.k_norm is not None:
            self._norm_qk_(qkv, ops)
        if self.rope is not None:
            cos, sin = rope[self.rope]  # [num_tokens, R]
            if self.rotary_dim == self.head_dim:
                ops.rope_qk_(qkv, cos, sin, self.num_heads, self.num_kv_heads)  # q, k in place
            else:
                rope_partial_(qkv, cos, sin, self.num_heads, self.num_kv_heads, self.head_dim)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)  # [num_tokens, H, D], strided rows
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)  # [num_tokens, Hkv, D]
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)  # [num_tokens, Hkv, D]
        backend.write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        nd = meta.num_decode_seqs  # decode sequences own the first nd tokens, one each
        decoded = None if not nd else backend.decode_attention(
            q[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.context_lens[:nd],
            self.scale, window=self.window, softcap=self.softcap,
        )  # [nd, num_heads, head_dim]
        if decoded is not None and nd == num_tokens:  # decode only: its output is all of it
            return self.o_proj(decoded.reshape(num_tokens, self.q_size))
        out = torch.empty_like(q)  # [num_tokens, num_heads, head_dim]
        if decoded is not None:
            out[:nd] = decoded
        cu_q = meta.cu_seqlens_q[nd:] - nd  # [num_prefill_seqs + 1], rebased to 0
        out[nd:] = backend.prefill_attention(
            q[nd:], k_cache, v_cache, meta.block_tables[nd:], cu_q,
            meta.context_lens[nd:], self.scale, window=self.window, softcap=self.softcap,
        )
        return self.o_proj(out.view(num_tokens, self.q_size))

    def _norm_qk_(self, qkv: torch.Tensor, ops: LayerOps) -> None:
        """RMSNorm of q and k in place, before rope: over each head's D dimensions (Qwen3,
        Gemma 3) or over all heads at once (OLMo 2)."""
        assert self.q_norm is not None and self.k_norm is not None
        num_tokens = qkv.shape[0]
        for norm, start, width in ((self.q_norm, 0, self.q_size),
                                   (self.k_norm, self.q_size, self.kv_size)):
            part = qkv[:, start:start + width]  # [T, width], strided rows
            rows = part.reshape(-1, norm.weight.shape[0])  # [T * heads, D] or [T, width], a copy
            normed = ops.add_rms_norm(rows, None, norm.weight, norm.eps)
            part.copy_(normed.view(num_tokens, width))


class MLP(nn.Module):
    """Gated feed-forward (SwiGLU or GeGLU) with one fused gate/up matmul."""

    def __init__(self, spec: ArchSpec, device: torch.device | None = None) -> None:
        super().__init__()
        self.activation = spec.activation
        self.gate_up_proj = nn.Linear(spec.hidden_size, 2 * spec.intermediate_size,
                                      bias=spec.mlp_bias, device=device)
        self.down_proj = nn.Linear(spec.intermediate_size, spec.hidden_size,
                                   bias=spec.mlp_bias, device=device)

    def forward(self, x: torch.Tensor, ops: LayerOps) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        return self.down_proj(gated_activation(self.gate_up_proj(x), self.activation, ops))


class MoE(nn.Module):
    """Sparse mixture of SwiGLU experts: a softmax router picks ``top_k`` experts per token
    and each expert runs once over all the tokens routed to it (grouped by expert, one
    matmul pair per expert that has tokens; no loop over tokens). With the experts packed
    into the native CPU panels, each projection of every expert is one call
    (``GroupedPanelMatmul``), and the activation and the weighted sum run once a layer.

    ``w13[e]`` is expert e's gate and up projections stacked ``[2 I, H]``; ``w2[e]`` its down
    projection ``[H, I]``. A token's output adds its experts' weighted outputs in expert
    order, as transformers does.
    """

    def __init__(self, spec: ArchSpec, moe: MoESpec, device: torch.device | None = None) -> None:
        super().__init__()
        self.activation = spec.activation
        self.top_k, self.renormalize, self.num_experts = moe.top_k, moe.renormalize, moe.num_experts
        self.gate = nn.Linear(spec.hidden_size, moe.num_experts, bias=False, device=device)  # router
        self.w13 = nn.Parameter(torch.empty(moe.num_experts, 2 * moe.intermediate_size,
                                            spec.hidden_size, device=device))  # [E, 2 I, H]
        self.w2 = nn.Parameter(torch.empty(moe.num_experts, spec.hidden_size,
                                           moe.intermediate_size, device=device))  # [E, H, I]
        self.packed: tuple[list[PackedMatmul], list[PackedMatmul]] | None = None  # (w13, w2) per expert
        self.grouped: tuple[GroupedPanelMatmul, GroupedPanelMatmul] | None = None  # (w13, w2), all experts

    def pack_experts(self, pack: Packer) -> int:
        """Pack every expert's two weights once (CPU, ``cpu_linear``) and drop the stacked copies;
        the router stays a plain linear (it is one small matmul); returns weights packed."""
        self.packed = ([pack(w) for w in self.w13], [pack(w) for w in self.w2])
        w13, w2 = group_experts(self.packed[0]), group_experts(self.packed[1])
        self.grouped = None if w13 is None or w2 is None else (w13, w2)
        self.w13 = nn.Parameter(self.w13.new_empty(0), requires_grad=False)
        self.w2 = nn.Parameter(self.w2.new_empty(0), requires_grad=False)
        return 2 * self.num_experts

    def _expert(self, which: int, expert: int, x: torch.Tensor) -> torch.Tensor:
        """``x`` times expert's w13 (which=0, ``[T, H] -> [T, 2I]``) or w2 (which=1)."""
        if self.packed is not None:
            return self.packed[which][expert](x)
        return F.linear(x, (self.w13, self.w2)[which][expert])

    def forward(self, x: torch.Tensor, ops: LayerOps) -> torch.Tensor:  # [T, hidden] -> [T, hidden]
        num_tokens = x.shape[0]
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)  # [T, E]
        weights, experts = torch.topk(probs, self.top_k, dim=-1)  # [T, k] each
        if self.renormalize:
            weights /= weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        flat_experts = experts.flatten()  # [T * k], pair p is (token p // k, slot p % k)
        order = torch.argsort(flat_experts, stable=True)  # pairs grouped by expert, tokens ascending
        counts = torch.bincount(flat_experts, minlength=self.num_experts).tolist()  # [E]
        token_of = order // self.top_k  # [T * k], the token of each sorted pair
        pair_weights = weights.flatten()[order].unsqueeze(1)  # [T * k, 1]
        inputs = x[token_of]  # [T * k, hidden]
        out = torch.zeros_like(x)  # [T, hidden]
        if self.grouped is not None:  # every expert in one call per projection
            offsets = [0, *itertools.accumulate(counts)]  # [E + 1]
            hidden = gated_activation(self.grouped[0](inputs, offsets), self.activation, ops)  # [T * k, I]
            y = self.grouped[1](hidden, offsets) * pair_weights  # [T * k, hidden]
            return out.index_add_(0, token_of, y)  # in expert order per token, as below
        start = 0
        for expert, count in enumerate(counts):
            if not count:
                continue
            rows = slice(start, start + count)
            hidden = gated_activation(self._expert(0, expert, inputs[rows]), self.activation, ops)
            y = self._expert(1, expert, hidden) * pair_weights[rows]  # [count, hidden]
            out.index_add_(0, token_of[rows], y)
            start += count
        assert start == num_tokens * self.top_k
        return out


class DecoderLayer(nn.Module):
    """Attention and MLP blocks with the norms the layout places around them (absent norms
    are None): ``pre`` has input_layernorm and post_attention_layernorm before the blocks;
    ``sandwich`` adds post_attention_layernorm on the attention output and
    pre/post_feedforward_layernorm around the MLP; ``post`` normalises only the outputs."""

    def __init__(self, spec: ArchSpec, layer: int, device: torch.device | None = None) -> None:
        super().__init__()
        eps = spec.rms_norm_eps
        norm = lambda: RMSNorm(spec.hidden_size, eps, device)  # noqa: E731
        self.input_layernorm = norm() if spec.layout != "post" else None
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm() if spec.layout == "sandwich" else None
        self.post_feedforward_layernorm = norm() if spec.layout != "pre" else None
        self.self_attn = Attention(spec, layer, device)
        sparse = spec.moe is not None and layer in spec.moe.sparse_layers
        self.mlp: MLP | MoE = MoE(spec, spec.moe, device) if sparse and spec.moe else MLP(spec, device)
