"""Put a checkpoint's tensors into a :class:`PackedCausalLM`, one tensor at a time.

Every Hugging Face tensor name maps to a region of one of our parameters: the same name,
or a row range of a fused one (``q_proj``/``k_proj``/``v_proj`` into ``qkv_proj``,
``gate_proj``/``up_proj`` into ``gate_up_proj``, expert e's projections into ``w13[e]`` and
``w2[e]``). Checkpoints that are already fused (Phi-3's ``qkv_proj``, transformers' stacked
``experts.gate_up_proj``) map to the whole parameter. Each tensor is converted to the
parameter's dtype and device as it is copied, so nothing but the model and the tensor in
hand is held. Every parameter must be filled and every tensor used, else the first missing
or unused name is reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from worker.engine.models.decoder import PackedCausalLM
from worker.engine.models.layers import MoE, RMSNorm

# Tensors some checkpoints carry that no model computes with (old Llama exports).
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# Mixtral's names for the MoE block and its experts' projections, as the other families name them.
_MIXTRAL_NAMES = ((".block_sparse_moe.", ".mlp."), (".w1.", ".gate_proj."), (".w3.", ".up_proj."),
                  (".w2.", ".down_proj."))
_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp)\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


class CheckpointMismatchError(ValueError):
    """The checkpoint's tensors do not match the model its config describes."""


@dataclass(frozen=True)
class Target:
    """Where one checkpoint tensor goes: ``param[index]`` (rows of a fused parameter, or
    one expert's slice), with ``offset`` added (Gemma's ``1 + w`` norms)."""

    param_name: str
    param: torch.Tensor
    index: tuple[int | slice, ...] = ()
    offset: float = 0.0

    def region(self) -> torch.Tensor:
        """The part of the parameter this tensor fills."""
        return self.param[self.index] if self.index else self.param


def canonical_name(name: str) -> str:
    """Mixtral's ``block_sparse_moe.experts.{e}.w1/w3/w2`` as ``mlp.experts.{e}.gate/up/down_proj``."""
    if ".block_sparse_moe." not in name:
        return name
    for old, new in _MIXTRAL_NAMES:
        name = name.replace(old, new)
    return name


def weight_targets(model: PackedCausalLM) -> dict[str, Target]:
    """Every checkpoint name the model accepts, with where it goes."""
    params = dict(model.named_parameters(remove_duplicate=False))
    offset = model.spec.norm_offset
    targets: dict[str, Target] = {}
    for name, module in model.named_modules():
        hf = _hf_prefix(name)
        if isinstance(module, RMSNorm):
            targets[f"{hf}.weight"] = Target(f"{name}.weight", module.weight, offset=offset)
        elif isinstance(module, MoE):
            targets.update(_moe_targets(name, hf, module))
    for name, param in params.items():
        if name.startswith("layers.") and (".qkv_proj." in name or ".gate_up_proj." in name):
            targets.update(_fused_targets(name, param, model))
        elif name.endswith(("_proj.weight", "_proj.bias", "gate.weight")):
            targets[_hf_prefix(name)] = Target(name, param)
    targets["model.embed_tokens.weight"] = Target("embed_tokens.weight", model.embed_tokens.weight)
    if not model.spec.tie_word_embeddings:
        targets["lm_head.weight"] = Target("lm_head.weight", model.lm_head.weight)
    return targets


def _hf_prefix(name: str) -> str:
    """Our module path as the checkpoint names it (``layers.3.mlp`` -> ``model.layers.3.mlp``)."""
    return name if name.startswith("lm_head") else f"model.{name}"


def _fused_targets(name: str, param: torch.Tensor, model: PackedCausalLM) -> dict[str, Target]:
    """The fused parameter itself, and the row range each unfused checkpoint tensor fills."""
    spec = model.spec
    hf = _hf_prefix(name)
    kind = name.rsplit(".", 1)[1]  # weight or bias
    parts: tuple[tuple[str, int], ...]
    if ".qkv_proj." in name:
        parts = (("q_proj", spec.q_size), ("k_proj", spec.kv_size), ("v_proj", spec.kv_size))
    else:
        half = param.shape[0] // 2
        parts = (("gate_proj", half), ("up_proj", half))
    fused = hf.rsplit(".", 2)[0]  # model.layers.i.self_attn or model.layers.i.mlp
    targets = {hf: Target(name, param)}
    start = 0
    for part, width in parts:
        targets[f"{fused}.{part}.{kind}"] = Target(name, param, (slice(start, start + width),))
        start += width
    return targets


def _moe_targets(name: str, hf: str, moe: MoE) -> dict[str, Target]:
    """Each expert's projections into its slices of ``w13`` and ``w2``, and the stacked form."""
    inter = moe.w2.shape[2]
    targets = {
        f"{hf}.experts.gate_up_proj": Target(f"{name}.w13", moe.w13),
        f"{hf}.experts.down_proj": Target(f"{name}.w2", moe.w2),
    }
    for e in range(moe.num_experts):
        targets[f"{hf}.experts.{e}.gate_proj.weight"] = Target(f"{name}.w13", moe.w13, (e, slice(0, inter)))
        targets[f"{hf}.experts.{e}.up_proj.weight"] = Target(f"{name}.w13", moe.w13, (e, slice(inter, 2 * inter)))
        targets[f"{hf}.experts.{e}.down_proj.weight"] = Target(f"{name}.w2", moe.w2, (e,))
    return targets


@torch.inference_mode()
def load_weights(model: PackedCausalLM, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy each ``(hf_name, tensor)`` into the model, converting dtype and device on the
    way; raises :class:`CheckpointMismatchError` on an unknown, misshapen or missing tensor.
    A tied head is the embedding's parameter already (``build_model``): its tensor, which
    some checkpoints carry anyway, is skipped."""
    targets = weight_targets(model)
    filled: dict[str, int] = {}  # parameter name -> elements written
    for raw_name, tensor in tensors:
        name = canonical_name(raw_name)
        if name.endswith(IGNORED_SUFFIXES) or (name == "lm_head.weight" and model.spec.tie_word_embeddings):
            continue
        target = targets.get(name)
        if target is None:
            raise CheckpointMismatchError(
                f"checkpoint tensor {raw_name!r} is not used by a {model.spec.family} model "
                "with this config (a different architecture or config?)")
        region = target.region()
        if tuple(region.shape) != tuple(tensor.shape):
            raise CheckpointMismatchError(
                f"checkpoint tensor {raw_name!r} has shape {tuple(tensor.shape)}, the config "
                f"makes it {tuple(region.shape)}")
        if target.offset:
            tensor = tensor.float() + target.offset
        region.copy_(tensor)
        filled[target.param_name] = filled.get(target.param_name, 0) + tensor.numel()
    _check_complete(model, targets, filled)


def _check_complete(model: PackedCausalLM, targets: dict[str, Target], filled: dict[str, int]) -> None:
    """Raise naming the first checkpoint tensor a parameter still waits for (a tied head
    is listed once, as the embedding)."""
    for name, param in model.named_parameters():
        if filled.get(name, 0) < param.numel():
            wanted = [hf for hf, t in targets.items() if t.param_name == name]
            unfused = [hf for hf in wanted if targets[hf].index] or wanted
            raise CheckpointMismatchError(
                f"checkpoint has no tensor {unfused[0]!r} (of {len(wanted)} that fill {name}); "
                "is it a checkpoint of this architecture, complete with all its shards?")
