"""A reduced-precision dtype on a CPU without its instructions is called out as slow."""

from __future__ import annotations

import pytest
import torch

from worker.engine.model_runner import slow_reduced_precision

CPU = torch.device("cpu")


@pytest.mark.parametrize(("bf16", "amx", "slow"), [(False, False, True), (True, False, False),
                                                   (False, True, False)])
def test_bf16_is_called_slow_only_without_its_instructions(monkeypatch, bf16: bool, amx: bool,
                                                           slow: bool) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    message = slow_reduced_precision(torch.bfloat16, CPU)
    assert (message is not None) == slow
    if slow:
        assert "bfloat16" in message and "avx512_bf16" in message


def test_fp32_and_other_devices_are_never_called_slow(monkeypatch) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert slow_reduced_precision(torch.float32, CPU) is None
    assert slow_reduced_precision(torch.bfloat16, torch.device("cuda")) is None
