"""A decode step's layer stack as one native call (``kernels/cpu_decoder.py``), for the
models and steps it covers; the Python loop of ``decoder.py`` runs everything else.

It covers fp32 models on the CPU whose weights are packed into the native panels and whose
layers are the pre-norm shape with a dense SwiGLU MLP: full rotary embedding from one
table or none (SmolLM3's NoPE layers), no q/k norm or a per-head one (Qwen3), any sliding
windows, attention soft-cap, biases and residual scale (Granite): Llama, Qwen2, Qwen3,
Mistral, Phi-3, Granite and SmolLM2/3 among the families of ``registry.py``. A step takes
it when every token is a decode token and it is given the KV caches the stack was made
over; a step the service may pause between layers (``LLMEngine.step``'s
``between_layers``) takes it one layer per call. The stack runs the same kernels in the
same order as the Python loop, so the logits are the same bit for bit
(tests/models/test_native_stack.py).

``INFLIGHT_CPU_DECODE_STACK=off`` keeps every step on the Python loop (for comparisons).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from kernels import AttentionBackend
from worker.engine.attention_metadata import AttentionMetadata
from worker.engine.models.cpu_linear import PackedLinear, PanelMatmul
from worker.engine.models.decoder import PackedCausalLM
from worker.engine.models.layers import MLP, DecoderLayer

STACK_ENV = "INFLIGHT_CPU_DECODE_STACK"  # "on" (default) or "off"
log = logging.getLogger(__name__)

KVCaches = list[tuple[torch.Tensor, torch.Tensor]]


def unsupported(model: PackedCausalLM, kv_caches: KVCaches) -> str | None:
    """Why ``model`` over ``kv_caches`` cannot take the native stack, or None when it can."""
    spec = model.spec
    if model.embed_tokens.weight.device.type != "cpu" or model.embed_tokens.weight.dtype != torch.float32:
        return "not an fp32 model on the CPU"
    if spec.layout != "pre" or spec.qk_norm not in ("none", "head") or spec.activation != "silu":
        return f"layout {spec.layout}, q/k norm {spec.qk_norm}, activation {spec.activation}"
    keys = set(spec.layer_rope) - {None}
    if len(keys) > 1:
        return "several rotary tables"
    if any(key is not None and spec.ropes[key].rotary_dim != spec.head_dim for key in keys):
        return "partial rotary embedding"
    for layer in model.decoder_layers:
        if not isinstance(layer.mlp, MLP):
            return "a mixture-of-experts layer"
        if not all(isinstance(m, PackedLinear) and isinstance(m.matmul, PanelMatmul)
                   for m in _projections(layer)):
            return "weights not packed into the native panels"
    if any(k.dtype != torch.float32 or v.dtype != torch.float32 for k, v in kv_caches):
        return "a KV cache that is not fp32"
    return None


class NativeDecodeStack:
    """The native stack of one model over one KV pool (the weights are shared, not copied)."""

    def __init__(self, model: PackedCausalLM, kv_caches: KVCaches, ext) -> None:
        spec = model.spec
        self.kv_caches = kv_caches
        self.num_layers = len(kv_caches)
        self.rope_key = next((key for key in spec.layer_rope if key is not None), None)
        norms, panels, widths, biases, caches = [], [], [], [], []
        none = torch.empty(0)
        for layer, (k_cache, v_cache) in zip(model.decoder_layers, kv_caches, strict=True):
            assert layer.input_layernorm is not None and isinstance(layer.mlp, MLP)
            attn = layer.self_attn
            norms += [layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach(),
                      none if attn.q_norm is None else attn.q_norm.weight.detach(),
                      none if attn.k_norm is None else attn.k_norm.weight.detach()]
            for linear in _projections(layer):
                assert isinstance(linear, PackedLinear) and isinstance(linear.matmul, PanelMatmul)
                panels.append(linear.matmul.panels)  # [P, K, W]
                widths.append(linear.out_features)
                biases.append(none if linear.bias is None else linear.bias)
            caches += [k_cache, v_cache]
        ropes = [key is not None for key in spec.layer_rope]
        self.stack = ext.DecoderStack(norms, panels, widths, biases, caches, list(spec.layer_windows),
                                      ropes, spec.num_heads, spec.num_kv_heads, spec.head_dim,
                                      spec.rms_norm_eps, spec.attn_scale, spec.attn_softcap,
                                      spec.residual_scale)

    def takes(self, num_tokens: int, meta: AttentionMetadata, kv_caches: KVCaches,
              backend: AttentionBackend) -> bool:
        """Whether this step runs here: decode tokens only, over this stack's caches, with the
        native attention backend (any other backend is the caller's choice to honour)."""
        return (meta.num_decode_seqs == num_tokens and kv_caches is self.kv_caches
                and backend.name == "cpu")

    def run(self, hidden: torch.Tensor,  # [T, H], the residual stream, updated in place
            rope: dict[str, tuple[torch.Tensor, torch.Tensor]],  # table -> cos, sin [T, D]
            meta: AttentionMetadata,
            between_layers: Callable[[], None] | None = None) -> torch.Tensor:  # [T, H]
        """Every layer over a decode step; returns the last MLP output, not yet added.
        With ``between_layers`` (a long step the service may pause, ``LLMEngine.step``) the
        layers run one native call each and it is called after every layer but the last,
        as the Python loop calls it; the result is the same bit for bit."""
        if self.rope_key is None:  # no layer rotates: the kernel never reads them
            cos = sin = hidden.new_empty(0, 0)
        else:
            cos, sin = rope[self.rope_key]
        step = (hidden, cos, sin, meta.slot_mapping, meta.block_tables, meta.context_lens)
        delta = hidden.new_empty(0)  # [0]: no layer's output yet
        if between_layers is None:
            return self.stack.run(*step, delta, 0, self.num_layers)
        for layer in range(self.num_layers):
            delta = self.stack.run(*step, delta, layer, layer + 1)  # [T, H]
            if layer < self.num_layers - 1:
                between_layers()
        return delta


def _projections(layer: DecoderLayer) -> tuple[nn.Module, ...]:
    """The layer's q/k/v, o, gate/up and down projections, in the stack's order."""
    mlp = layer.mlp
    assert isinstance(mlp, MLP)
    return (layer.self_attn.qkv_proj, layer.self_attn.o_proj, mlp.gate_up_proj, mlp.down_proj)


def build_native_stack(model: PackedCausalLM, kv_caches: KVCaches) -> NativeDecodeStack | None:
    """The native stack for ``model`` over ``kv_caches`` where it covers them and builds here,
    else None (the reason is logged at debug level)."""
    from kernels import cpu_native

    choice = cpu_native.env_choice(STACK_ENV, ("on", "off"))
    if choice == "off" or not model.native_ops:
        return None
    reason = unsupported(model, kv_caches)
    if reason is not None:
        log.debug("decode steps stay on the Python loop: %s", reason)
        return None
    try:
        from kernels import cpu_decoder

        ext = cpu_decoder.load()
    except Exception as exc:  # no compiler: the Python loop runs the same kernels
        log.warning("decode steps stay on the Python loop: the native stack did not build (%s)", exc)
        return None
    first = model.decoder_layers[0].self_attn.qkv_proj
    assert isinstance(first, PackedLinear) and isinstance(first.matmul, PanelMatmul)
    if int(ext.panel_width()) != int(first.matmul.ext.panel_width()):
        return None  # packed by another build (INFLIGHT_CPU_ISA changed since)
    return NativeDecodeStack(model, kv_caches, ext)
