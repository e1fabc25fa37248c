"""The native fp32 linear (kernels/csrc/linear_cpu.cpp) against its reference
``torch.nn.functional.linear`` (in float64), for every kernel build this CPU can run: row
counts across one register tile, several tiles and several row blocks; output widths that
are not a whole panel; inner sizes across one and several k blocks; bias or none; strided
rows. And batch invariance to the bit: a row's output never depends on the rows beside it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import cpu_linear, cpu_native

ISAS = cpu_native.supported_isas()


@pytest.fixture(params=ISAS or ["none"])
def ext(request: pytest.FixtureRequest):
    if request.param == "none":
        pytest.fail("this CPU has neither AVX2 nor AVX-512: the native linear cannot run")
    return cpu_linear.load(request.param)


def _reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x.double(), w.double(), None if b is None else b.double()).float()


@pytest.mark.parametrize("rows", [1, 3, 8, 13, 40, 300])
@pytest.mark.parametrize(("out_features", "in_features"), [(576, 576), (100, 1000), (7, 3), (49, 385)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_matches_the_reference(ext, rows: int, out_features: int, in_features: int,
                                      with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + out_features)
    x = torch.randn(rows, in_features, generator=gen)
    w = torch.randn(out_features, in_features, generator=gen)
    b = torch.randn(out_features, generator=gen) if with_bias else None
    panels = cpu_linear.pack(w, ext)
    width = int(ext.panel_width())
    assert panels.shape == (-(-out_features // width), in_features, width)
    y = cpu_linear.linear(x, panels, out_features, b, ext)
    # fp32 sums of in_features products of N(0, 1) values: error grows like sqrt(in_features)
    torch.testing.assert_close(y, _reference(x, w, b), rtol=1e-5, atol=2e-6 * in_features)


def test_strided_rows_and_empty_inputs(ext) -> None:
    w, b = torch.randn(33, 40), torch.randn(33)
    panels = cpu_linear.pack(w, ext)
    wide = torch.randn(9, 100)
    rows = wide[:, 10:50]  # [9, 40] with a row stride of 100
    assert rows.stride() == (100, 1)
    torch.testing.assert_close(cpu_linear.linear(rows, panels, 33, b, ext), _reference(rows, w, b),
                               rtol=1e-5, atol=1e-4)
    columns = wide[:, 10:50].t().contiguous().t()  # column-major: copied first
    torch.testing.assert_close(cpu_linear.linear(columns, panels, 33, b, ext),
                               _reference(columns, w, b), rtol=1e-5, atol=1e-4)
    assert cpu_linear.linear(torch.empty(0, 40), panels, 33, b, ext).shape == (0, 33)
    empty_k = cpu_linear.pack(torch.empty(5, 0), ext)
    assert torch.equal(cpu_linear.linear(torch.empty(3, 0), empty_k, 5, b[:5], ext), b[:5].expand(3, 5))


def test_a_row_is_computed_the_same_at_every_batch_size(ext) -> None:
    """Bitwise: the engine's batch invariance rests on it."""
    gen = torch.Generator().manual_seed(7)
    w, b = torch.randn(200, 1100, generator=gen), torch.randn(200, generator=gen)
    x = torch.randn(301, 1100, generator=gen)
    panels = cpu_linear.pack(w, ext)
    whole = cpu_linear.linear(x, panels, 200, b, ext)
    for lo, hi in ((0, 1), (5, 6), (17, 30), (100, 301), (299, 301)):
        assert torch.equal(cpu_linear.linear(x[lo:hi], panels, 200, b, ext), whole[lo:hi])


def test_refuses_mismatched_shapes(ext) -> None:
    panels = cpu_linear.pack(torch.randn(10, 16), ext)
    with pytest.raises(RuntimeError, match="columns"):
        cpu_linear.linear(torch.randn(2, 15), panels, 10, None, ext)
    with pytest.raises(RuntimeError, match="panels"):
        cpu_linear.linear(torch.randn(2, 16), panels, 1000, None, ext)
    with pytest.raises(RuntimeError, match="float32"):
        cpu_linear.linear(torch.randn(2, 16, dtype=torch.float64), panels, 10, None, ext)
