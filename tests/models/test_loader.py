"""Which checkpoint files the loader reads (no model is built here)."""

from __future__ import annotations

import json
from pathlib import Path

from worker.engine.models.loader import _safetensors_files


def _touch(directory: Path, *names: str) -> None:
    for name in names:
        (directory / name).write_bytes(b"")


def test_the_index_names_the_shards(tmp_path: Path) -> None:
    _touch(tmp_path, "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
           "consolidated.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "a": "model-00002-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
        "c": "model-00001-of-00002.safetensors"}}))
    assert [p.name for p in _safetensors_files(tmp_path)] == [
        "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def test_without_an_index_only_model_files_count(tmp_path: Path) -> None:
    _touch(tmp_path, "model.safetensors", "consolidated.safetensors", "adapter.safetensors")
    assert [p.name for p in _safetensors_files(tmp_path)] == ["model.safetensors"]
    assert _safetensors_files(tmp_path / "missing") == []


def _tiny_dir(tmp_path: Path, arch: str = "qwen3") -> Path:
    from worker.engine.models.tiny import build_tiny_checkpoint

    return build_tiny_checkpoint(tmp_path / arch, arch)


def _rewrite_weights(directory: Path, edit) -> None:
    """Load the checkpoint's tensors, let ``edit`` change the dict, save it back."""
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_an_unsupported_architecture_names_itself_and_the_supported_list(tmp_path: Path) -> None:
    import pytest

    from worker.engine import LLM, InvalidRequestError

    directory = _tiny_dir(tmp_path)
    config = json.loads((directory / "config.json").read_text())
    for model_type in ("gpt_neox", "a_model_nobody_made"):  # known to transformers, and not
        config["model_type"] = model_type
        (directory / "config.json").write_text(json.dumps(config))
        with pytest.raises(InvalidRequestError,
                           match=rf"'{model_type}' is not supported; supported: llama, mistral.*qwen3_moe"):
            LLM(str(directory), num_kv_blocks=8)


def test_a_missing_or_unused_or_misshapen_tensor_is_named(tmp_path: Path) -> None:
    import pytest

    from worker.engine import LLM
    from worker.engine.models.weights import CheckpointMismatchError

    directory = _tiny_dir(tmp_path)
    _rewrite_weights(directory, lambda t: t.pop("model.layers.1.self_attn.k_norm.weight"))
    with pytest.raises(CheckpointMismatchError, match=r"no tensor 'model.layers.1.self_attn.k_norm.weight'"):
        LLM(str(directory), num_kv_blocks=8)

    directory = _tiny_dir(tmp_path / "b")
    _rewrite_weights(directory, lambda t: t.update({"model.layers.0.mlp.extra.weight": t["model.norm.weight"].clone()}))
    with pytest.raises(CheckpointMismatchError, match=r"'model.layers.0.mlp.extra.weight' is not used by a qwen3 model"):
        LLM(str(directory), num_kv_blocks=8)

    directory = _tiny_dir(tmp_path / "c")
    _rewrite_weights(directory, lambda t: t.update({"model.norm.weight": t["model.norm.weight"][:8].clone()}))
    with pytest.raises(CheckpointMismatchError, match=r"'model.norm.weight' has shape \(8,\), the config makes it \(64,\)"):
        LLM(str(directory), num_kv_blocks=8)


def test_mixtral_and_stacked_expert_names_load_alike(tmp_path: Path) -> None:
    """Mixtral's block_sparse_moe.experts.{e}.w1/w3/w2 and transformers' stacked
    experts.gate_up_proj / down_proj fill the same parameters."""
    import torch

    from worker.engine.models.loader import load_checkpoint
    from worker.engine.models.registry import build_model
    from worker.engine.models.weights import load_weights

    checkpoint = load_checkpoint(str(_tiny_dir(tmp_path, "mixtral")))
    per_expert = dict(checkpoint.tensors())
    stacked: dict[str, torch.Tensor] = {}
    for name, tensor in per_expert.items():
        if ".experts." not in name:
            stacked[name] = tensor
    for layer in range(checkpoint.config.num_hidden_layers):
        p = f"model.layers.{layer}.block_sparse_moe.experts"
        experts = range(checkpoint.config.num_local_experts)
        stacked[f"model.layers.{layer}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([per_expert[f"{p}.{e}.w1.weight"], per_expert[f"{p}.{e}.w3.weight"]]) for e in experts])
        stacked[f"model.layers.{layer}.mlp.experts.down_proj"] = torch.stack(
            [per_expert[f"{p}.{e}.w2.weight"] for e in experts])
    stacked = {k.replace(".block_sparse_moe.", ".mlp."): v for k, v in stacked.items()}
    models = []
    for tensors in (per_expert, stacked):
        model = build_model(checkpoint.config, 64, torch.device("cpu"), torch.float32)
        load_weights(model, tensors.items())
        models.append(dict(model.named_parameters()))
    assert models[0].keys() == models[1].keys()
    for name, param in models[0].items():
        assert torch.equal(param, models[1][name]), name


def test_dtype_auto_follows_the_checkpoint_where_it_runs_fast() -> None:
    import torch

    from worker.engine.model_runner import resolve_dtype, slow_reduced_precision

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_dtype("auto", cpu, None) == torch.float32
    assert resolve_dtype("auto", cpu, torch.float32) == torch.float32
    bf16_fast = slow_reduced_precision(torch.bfloat16, cpu) is None
    assert resolve_dtype("auto", cpu, torch.bfloat16) == (torch.bfloat16 if bf16_fast else torch.float32)
    assert resolve_dtype("auto", cuda, torch.float16) == torch.float16
    assert resolve_dtype("auto", cuda, torch.float32) == torch.bfloat16
    assert resolve_dtype("float32", cuda, torch.bfloat16) == torch.float32
