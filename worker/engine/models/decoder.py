"""The shared decoder over a packed, padding-free batch: every supported family is this
module with its :class:`ArchSpec`.

One step's tokens of all sequences form a single 1-D ``input_ids``; attention reads and
writes the paged KV cache through ``kernels`` using an explicit AttentionMetadata. The
residual stream ``hidden`` is updated in place: a norm first adds the previous block's
output (``delta``) to it, as one fused op where the device has it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, cast

import torch
from torch import nn

from kernels import AttentionBackend
from kernels.cpu_fused import LayerOps, ops_for
from worker.engine.attention_metadata import AttentionMetadata
from worker.engine.models.layers import DecoderLayer, RMSNorm
from worker.engine.models.rope import rope_table
from worker.engine.models.spec import ArchSpec


class DecodeStack(Protocol):
    """Every layer of a decode step in one call (``native_stack.py``): the same result as
    the layer loop of :meth:`PackedCausalLM.forward`, for the steps it ``takes``."""

    def takes(self, num_tokens: int, meta: AttentionMetadata,
              kv_caches: list[tuple[torch.Tensor, torch.Tensor]], backend: AttentionBackend) -> bool: ...

    def run(self, hidden: torch.Tensor, rope: dict[str, tuple[torch.Tensor, torch.Tensor]],
            meta: AttentionMetadata, between_layers: Callable[[], None] | None = None) -> torch.Tensor: ...


class PackedCausalLM(nn.Module):
    """The whole decoder; ``forward`` returns logits only for ``meta.logits_indices``.

    Build it with :func:`worker.engine.models.registry.build_model`, which makes the
    parameters on the target device without initialising them and computes the rotary
    tables; the weights then come from :func:`worker.engine.models.weights.load_weights`.
    """

    def __init__(self, config, spec: ArchSpec, device: torch.device | None = None) -> None:
        super().__init__()
        self.config, self.spec = config, spec
        # _weight skips nn.Embedding's random init (on meta it would import torch._dynamo).
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size,
                                         _weight=torch.empty(spec.vocab_size, spec.hidden_size, device=device))
        self.layers = nn.ModuleList(DecoderLayer(spec, i, device) for i in range(spec.num_layers))
        self.decoder_layers: list[DecoderLayer] = [cast(DecoderLayer, m) for m in self.layers]
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, device)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False, device=device)
        self.rope_tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.native_ops = True  # fused native element-wise ops where they exist (CPU fp32)
        self.native_stack: DecodeStack | None = None  # decode steps in one native call

    def init_rope(self, max_positions: int, device: torch.device) -> None:
        """Compute each rotary table ``[max_positions, R]`` (fp32) on ``device``."""
        self.rope_tables = {}
        for key, rope in self.spec.ropes.items():
            cos, sin = rope_table(self.config, rope, max_positions)
            self.rope_tables[key] = (cos.to(device), sin.to(device))

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens]
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer (k, v) caches
        backend: AttentionBackend,
        between_layers: Callable[[], None] | None = None,
    ) -> torch.Tensor:  # [num_sampled, vocab_size]
        """Run all layers over the packed step and return logits of the requested rows.
        ``between_layers`` is called after every layer but the last (by the Python loop, or
        between the native stack's one-layer calls): it may run a whole other forward, of
        other sequences in other KV blocks, since nothing here is kept outside this call
        (``LLMEngine.interjected_step``)."""
        spec = self.spec
        hidden = self.embed_tokens(input_ids)  # [num_tokens, hidden_size]
        if spec.embed_scale != 1.0:
            hidden = hidden * torch.tensor(spec.embed_scale, dtype=hidden.dtype)
        ops = ops_for(hidden.device, hidden.dtype, self.native_ops)
        rope = {key: (cos[meta.positions].to(hidden.dtype), sin[meta.positions].to(hidden.dtype))
                for key, (cos, sin) in self.rope_tables.items()}  # key -> 2 x [num_tokens, R]
        delta: torch.Tensor | None = None  # the last block's output, not yet added
        stack = self.native_stack
        if stack is not None and self.native_ops and stack.takes(hidden.shape[0], meta, kv_caches, backend):
            delta = stack.run(hidden, rope, meta, between_layers)  # the same kernels as the loop below
        else:
            last_layer = len(self.decoder_layers) - 1
            for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.decoder_layers, kv_caches, strict=True)):
                attn = self._attention_block(layer, hidden, delta, rope, k_cache, v_cache, meta, backend, ops)
                delta = self._mlp_block(layer, hidden, attn, ops)
                if between_layers is not None and i < last_layer:
                    between_layers()
        rows = meta.logits_indices
        last_delta = None if delta is None else delta[rows]
        last = ops.add_rms_norm(hidden[rows], last_delta, self.norm.weight, self.norm.eps)
        logits = self.lm_head(last)  # [num_sampled, vocab_size]
        if spec.logits_divisor != 1.0:
            logits = logits / spec.logits_divisor
        if spec.final_softcap:
            logits = torch.tanh(logits / spec.final_softcap) * spec.final_softcap
        return logits.float()

    def _attention_block(self, layer: DecoderLayer, hidden: torch.Tensor, delta: torch.Tensor | None,
                         rope: dict[str, tuple[torch.Tensor, torch.Tensor]], k_cache: torch.Tensor,
                         v_cache: torch.Tensor, meta: AttentionMetadata, backend: AttentionBackend,
                         ops: LayerOps) -> torch.Tensor:  # [num_tokens, hidden_size]
        """Add the last block's output to ``hidden``, run attention on it (normalised first
        unless the layout is ``post``) and return what the residual gets from it."""
        if layer.input_layernorm is None:
            if delta is not None:
                hidden.add_(delta)
            attn_in = hidden
        else:
            attn_in = ops.add_rms_norm(hidden, delta, layer.input_layernorm.weight, layer.input_layernorm.eps)
        out = layer.self_attn(attn_in, rope, k_cache, v_cache, meta, backend, ops)
        if self.spec.layout != "pre":  # sandwich and post normalise the block's output
            norm = layer.post_attention_layernorm
            out = ops.add_rms_norm(out, None, norm.weight, norm.eps)
        if self.spec.residual_scale != 1.0:
            out.mul_(self.spec.residual_scale)
        return out

    def _mlp_block(self, layer: DecoderLayer, hidden: torch.Tensor, attn: torch.Tensor,
                   ops: LayerOps) -> torch.Tensor:  # [num_tokens, hidden_size]
        """Add the attention output to ``hidden``, run the MLP on it and return what the
        residual gets from it (added by the next layer's first norm)."""
        layout = self.spec.layout
        if layout == "post":
            hidden.add_(attn)
            mlp_in = hidden
        else:
            norm = layer.pre_feedforward_layernorm if layout == "sandwich" else layer.post_attention_layernorm
            assert norm is not None
            mlp_in = ops.add_rms_norm(hidden, attn, norm.weight, norm.eps)
        out = layer.mlp(mlp_in, ops)
        if layer.post_feedforward_layernorm is not None:
            norm = layer.post_feedforward_layernorm
            out = ops.add_rms_norm(out, None, norm.weight, norm.eps)
        if self.spec.residual_scale != 1.0:
            out.mul_(self.spec.residual_scale)
        return out
