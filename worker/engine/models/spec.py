"""What one architecture is, as data: the shared decoder (``decoder.py``) reads an
:class:`ArchSpec` and nothing else about the family.

Each family module (``families/*.py``) turns a transformers config into an ArchSpec and
states only what differs from Llama: norms, activation, q/k norms, biases, soft-caps,
window layout, rope per layer, embedding and residual scales, the MoE block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Layout = Literal["pre", "sandwich", "post"]
QKNorm = Literal["none", "head", "full"]
Activation = Literal["silu", "gelu_tanh"]

FULL_ATTENTION = 0  # a layer's window when it sees the whole context


@dataclass(frozen=True)
class MoESpec:
    """A sparse mixture-of-experts MLP: ``top_k`` of ``num_experts`` SwiGLU experts per token.

    ``renormalize``: the top-k routing probabilities are divided by their sum (Mixtral always,
    Qwen3-MoE when ``norm_topk_prob``). ``sparse_layers``: the layers whose MLP is the MoE
    block; the others keep a dense MLP of the config's ``intermediate_size``.
    """

    num_experts: int
    top_k: int
    intermediate_size: int
    renormalize: bool
    sparse_layers: frozenset[int]


@dataclass(frozen=True)
class RopeSpec:
    """One rotary table: the transformers ``rope_parameters`` dict it is built from (with
    ``rope_theta``), how many leading dimensions of each head it rotates, and the layer type
    transformers keys it by where a config has one table per layer type (Gemma 3)."""

    parameters: dict[str, Any]
    rotary_dim: int
    layer_type: str | None = None


@dataclass(frozen=True)
class ArchSpec:
    """Everything the shared decoder needs to know about an architecture.

    ``layout`` places the norms around each block: ``pre`` (Llama: ``x + f(norm(x))``),
    ``sandwich`` (Gemma: ``x + norm(f(norm(x)))``) or ``post`` (OLMo 2: ``x + norm(f(x))``).
    ``layer_windows[i]`` is layer i's sliding window in keys (FULL_ATTENTION for none);
    ``layer_rope[i]`` names its rotary table in ``ropes`` (None: the layer has no rope).
    """

    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    layer_windows: tuple[int, ...]
    layer_rope: tuple[str | None, ...]
    ropes: dict[str, RopeSpec]
    tie_word_embeddings: bool
    attn_scale: float
    layout: Layout = "pre"
    activation: Activation = "silu"
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: QKNorm = "none"
    norm_offset: float = 0.0  # Gemma's RMSNorm multiplies by (offset + weight)
    embed_scale: float = 1.0
    residual_scale: float = 1.0
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    logits_divisor: float = 1.0
    moe: MoESpec | None = None

    @property
    def q_size(self) -> int:
        """Width of all query heads together."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of all key (or value) heads together."""
        return self.num_kv_heads * self.head_dim

    @property
    def max_window(self) -> int:
        """The widest window of any layer, or FULL_ATTENTION when a layer sees everything:
        keys older than this are read by no layer, so their blocks can be released."""
        if not self.layer_windows or FULL_ATTENTION in self.layer_windows:
            return FULL_ATTENTION
        return max(self.layer_windows)


def head_dim_of(config) -> int:
    """The config's ``head_dim``, else hidden / heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def rope_parameters(config, layer_type: str | None = None) -> dict[str, Any]:
    """The config's rope parameters (for ``layer_type`` where they are per layer type),
    always with ``rope_type`` and ``rope_theta``."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = dict(params[layer_type])
    params.setdefault("rope_type", "default")
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    return params


def uniform_rope(config, rotary_dim: int | None = None) -> dict[str, RopeSpec]:
    """One rotary table, shared by every layer that has rope."""
    return {"default": RopeSpec(rope_parameters(config), rotary_dim or head_dim_of(config))}


def windows_from_layer_types(config, enabled: bool = True) -> tuple[int, ...]:
    """Per-layer windows from ``config.layer_types`` and ``config.sliding_window`` (every
    layer windowed when the config has a window but no layer types)."""
    num_layers = config.num_hidden_layers
    window = getattr(config, "sliding_window", None)
    if not enabled or not window:
        return (FULL_ATTENTION,) * num_layers
    types = getattr(config, "layer_types", None)
    if not types:
        return (int(window),) * num_layers
    return tuple(int(window) if t == "sliding_attention" else FULL_ATTENTION for t in types)


def base_spec(config, family: str, **overrides: Any) -> ArchSpec:
    """The Llama reading of ``config``, with ``overrides`` for what the family changes."""
    head_dim = head_dim_of(config)
    attention_bias = bool(getattr(config, "attention_bias", False))
    fields: dict[str, Any] = dict(
        family=family,
        num_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        num_heads=config.num_attention_heads,
        num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
        head_dim=head_dim,
        intermediate_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        rms_norm_eps=config.rms_norm_eps,
        layer_windows=windows_from_layer_types(config),
        layer_rope=("default",) * config.num_hidden_layers,
        ropes=uniform_rope(config),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        attn_scale=head_dim**-0.5,
        qkv_bias=attention_bias,
        o_bias=attention_bias,
        mlp_bias=bool(getattr(config, "mlp_bias", False)),
        activation=activation_of(config),
    )
    fields.update(overrides)
    return ArchSpec(**fields)


def activation_of(config) -> Activation:
    """The MLP's activation, named as the decoder knows it; anything else is refused."""
    act = getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", "silu")
    if act in ("silu", "swish"):
        return "silu"
    if act in ("gelu_pytorch_tanh", "gelu_tanh"):
        return "gelu_tanh"
    raise ValueError(f"{config.model_type}: activation {act!r} is not supported (silu, gelu_pytorch_tanh)")
