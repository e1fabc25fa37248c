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
