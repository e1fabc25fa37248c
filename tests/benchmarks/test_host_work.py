"""benchmarks/host_work.py on its tiny Llama: the checkpoint has the shape the figures name,
every part is timed, the parts add up to the step, and the JSON and plot are written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks import host_work


def test_split_adds_up_to_the_step_and_names_every_part(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["host_work", "--batches", "1,8", "--steps", "4",
                                      "--rounds", "1", "--threads", "1", "--json",
                                      str(tmp_path / "h.json"), "--plot", str(tmp_path / "h.png")])
    host_work.main()
    result = json.loads((tmp_path / "h.json").read_text())
    config = json.loads((host_work.host_model_dir() / "config.json").read_text())
    assert {k: config[k] for k in host_work.TINY_HOST_CONFIG} == host_work.TINY_HOST_CONFIG
    assert [r["batch"] for r in result["rows"]] == [1, 8]
    for row in result["rows"]:
        split = row["split_ms"]
        assert set(split) == set(host_work.PARTS)
        assert all(split[p] > 0 for p in ("schedule", "inputs", "forward", "sample", "update"))
        assert sum(split.values()) == pytest.approx(row["step_ms"], abs=0.01)
        assert row["host_ms"] == pytest.approx(row["step_ms"] - split["forward"], abs=0.01)
        assert row["vllm_step_ms"] is None  # no --peer
    assert (tmp_path / "h.png").stat().st_size > 0
