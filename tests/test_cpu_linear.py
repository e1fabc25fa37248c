"""oneDNN-prepacked linears: same output as ``nn.Linear``, and a bounded primitive cache."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from worker.engine.models.cpu_linear import (
    PRIMITIVE_CACHE_CAPACITY,
    PRIMITIVE_CACHE_ENV,
    PackedLinear,
    onednn_available,
    pack_linears,
)

pytestmark = pytest.mark.skipif(not onednn_available(), reason="torch built without oneDNN")


def test_packed_linears_match_nn_linear_at_every_row_count() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.Sequential(nn.Linear(96, 32, bias=False)))
    x = torch.randn(37, 64)
    expected = model(x)
    assert pack_linears(model) == 2
    assert isinstance(model[0], PackedLinear) and isinstance(model[1][0], PackedLinear)
    for rows in (1, 5, 37):
        torch.testing.assert_close(model(x[:rows]), expected[:rows], rtol=1e-5, atol=1e-5)


def test_packing_caps_the_primitive_cache_unless_the_user_chose_a_size(monkeypatch) -> None:
    monkeypatch.delenv(PRIMITIVE_CACHE_ENV, raising=False)
    pack_linears(nn.Linear(8, 8))
    assert PRIMITIVE_CACHE_CAPACITY < 1024  # oneDNN's own default
    assert int(os.environ[PRIMITIVE_CACHE_ENV]) == PRIMITIVE_CACHE_CAPACITY
    monkeypatch.setenv(PRIMITIVE_CACHE_ENV, "300")
    pack_linears(nn.Linear(8, 8))
    assert os.environ[PRIMITIVE_CACHE_ENV] == "300"
