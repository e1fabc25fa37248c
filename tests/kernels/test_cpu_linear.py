"""The native fp32 linear (kernels/csrc/linear_cpu.cpp) against its reference
``torch.nn.functional.linear`` (in float64), for every kernel build this CPU can run: row
counts across one register tile, several tiles and several row blocks; output widths that
are not a whole panel; inner sizes across one and several k blocks; bias or none; strided
rows. And batch invariance to the bit: a row's output never depends on the rows beside it.
bf16 panels (a weight exact in bf16) give the fp32 panels' outputs to the bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels import cpu_decoder, cpu_linear, cpu_native

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


@pytest.mark.parametrize("counts", [[0, 1, 0, 2, 5], [13, 0, 0, 40, 300], [0, 0, 0, 1, 0], [0, 0, 0, 0, 0]])
def test_grouped_linear_is_a_call_per_expert_to_the_bit(ext, counts: list[int]) -> None:
    """Experts' rows one after another (none for some): each expert's rows equal, bit for
    bit, what ``linear`` gives them alone, and they match the reference."""
    gen = torch.Generator().manual_seed(sum(counts))
    weights = [torch.randn(49, 385, generator=gen) for _ in counts]  # E x [N, K], N not a whole panel
    packed = [cpu_linear.pack(w, ext) for w in weights]
    wide = torch.randn(sum(counts), 400, generator=gen)
    x = wide[:, 5:390]  # [M, 385], strided rows
    offsets = [0]
    for count in counts:
        offsets.append(offsets[-1] + count)
    y = cpu_linear.grouped_linear(x, offsets, packed, 49, ext)
    assert y.shape == (sum(counts), 49)
    for e, w in enumerate(weights):
        rows = slice(offsets[e], offsets[e + 1])
        assert torch.equal(y[rows], cpu_linear.linear(x[rows], packed[e], 49, None, ext))
        torch.testing.assert_close(y[rows], _reference(x[rows], w, None), rtol=1e-5, atol=1e-3)


def test_grouped_linear_refuses_bad_offsets_and_shapes(ext) -> None:
    packed = [cpu_linear.pack(torch.randn(8, 16), ext) for _ in range(3)]
    x = torch.randn(4, 16)
    with pytest.raises(RuntimeError, match="one more entry"):
        cpu_linear.grouped_linear(x, [0, 4], packed, 8, ext)
    with pytest.raises(RuntimeError, match="from 0 to 4"):
        cpu_linear.grouped_linear(x, [0, 1, 2, 3], packed, 8, ext)
    with pytest.raises(RuntimeError, match="must not decrease"):
        cpu_linear.grouped_linear(x, [0, 3, 2, 4], packed, 8, ext)
    other = [*packed[:2], cpu_linear.pack(torch.randn(8, 12), ext)]
    with pytest.raises(RuntimeError, match="expert 2"):
        cpu_linear.grouped_linear(x, [0, 1, 2, 4], other, 8, ext)


def _bf16_exact(*shape: int, gen: torch.Generator) -> torch.Tensor:
    """An fp32 tensor whose every value is a bf16 value (a bf16 checkpoint loaded in fp32)."""
    return torch.randn(*shape, generator=gen).bfloat16().float()


@pytest.mark.parametrize("rows", [1, 3, 8, 9, 13, 40, 300])
@pytest.mark.parametrize(("out_features", "in_features"), [(576, 576), (100, 1000), (7, 3), (49, 385)])
def test_bf16_panels_give_the_fp32_panels_outputs_bit_for_bit(ext, rows: int, out_features: int,
                                                                in_features: int) -> None:
    """A weight exact in bf16 packed into bf16 panels (half the bytes) gives what its fp32
    panels give, to the bit: one register tile widening as it loads, several tiles reading
    a block widened once, k across several blocks, a last panel narrower than the rest."""
    gen = torch.Generator().manual_seed(rows * 7 + in_features)
    w = _bf16_exact(out_features, in_features, gen=gen)
    b = torch.randn(out_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    wide, narrow = cpu_linear.pack(w, ext), cpu_linear.pack(w, ext, torch.bfloat16)
    assert narrow.dtype == torch.bfloat16 and narrow.shape == wide.shape
    assert torch.equal(narrow.float(), wide)  # the same values, zero padding included
    for bias in (b, None):
        assert torch.equal(cpu_linear.linear(x, narrow, out_features, bias, ext),
                           cpu_linear.linear(x, wide, out_features, bias, ext))


def test_grouped_linear_over_bf16_panels_equals_the_fp32_ones(ext) -> None:
    gen = torch.Generator().manual_seed(5)
    weights = [_bf16_exact(49, 385, gen=gen) for _ in range(3)]
    x = torch.randn(30, 385, generator=gen)
    offsets = [0, 4, 4, 30]  # one expert without rows, one of several register tiles
    wide = cpu_linear.grouped_linear(x, offsets, [cpu_linear.pack(w, ext) for w in weights], 49, ext)
    narrow = [cpu_linear.pack(w, ext, torch.bfloat16) for w in weights]
    assert torch.equal(cpu_linear.grouped_linear(x, offsets, narrow, 49, ext), wide)
    mixed = [*narrow[:2], cpu_linear.pack(weights[2], ext)]
    with pytest.raises(RuntimeError, match="first expert's dtype"):
        cpu_linear.grouped_linear(x, offsets, mixed, 49, ext)


def test_bf16_panels_only_for_weights_exact_in_bf16(ext) -> None:
    """Packing never rounds: a weight with a value bf16 cannot hold is refused bf16 panels."""
    gen = torch.Generator().manual_seed(9)
    exact = _bf16_exact(3000, 64, gen=gen)  # three comparisons of 1,024 rows (64K values)
    assert cpu_linear.exact_in_bf16(exact)
    for row in (0, 2999):  # one value off bf16 in the first comparison's rows, or the last's
        off = exact.clone()
        off[row, 3] += 2.0**-20
        assert not cpu_linear.exact_in_bf16(off)
        with pytest.raises(ValueError, match="not bf16 values"):
            cpu_linear.pack(off, ext, torch.bfloat16)
    nan = exact.clone()
    nan[5, 5] = float("nan")
    assert not cpu_linear.exact_in_bf16(nan)
    with pytest.raises(ValueError, match="panels hold"):
        cpu_linear.pack(exact, ext, torch.float16)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        cpu_linear.linear(torch.randn(2, 64), cpu_linear.pack(exact, ext).half(), 3000, None, ext)


@pytest.mark.parametrize(("choice", "vendor", "asks_in_one_tile"), [
    ("auto", "GenuineIntel", True), ("auto", "AuthenticAMD", False), ("auto", "", False),
    ("always", "AuthenticAMD", True), ("several-tiles", "GenuineIntel", False),
])
def test_build_flags_ask_for_the_next_block_in_one_tile_calls_on_intel(
        choice: str, vendor: str, asks_in_one_tile: bool) -> None:
    flags = cpu_linear.build_flags(choice, vendor)
    assert ("-DLINEAR_AHEAD_MIN_ROWS=1" in flags) is asks_in_one_tile


def test_ahead_choice_refuses_an_unknown_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_linear.AHEAD_ENV, "sometimes")
    with pytest.raises(ValueError, match="INFLIGHT_CPU_AHEAD='sometimes'"):
        cpu_linear.ahead_choice()
    monkeypatch.setenv(cpu_linear.AHEAD_ENV, " Always ")
    assert cpu_linear.ahead_choice() == "always"


def test_cpu_vendor_reads_cpuinfo(tmp_path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n")
    assert cpu_linear.cpu_vendor(cpuinfo) == "AuthenticAMD"
    assert cpu_linear.cpu_vendor(tmp_path / "missing") == ""


@pytest.mark.parametrize("rows", [1, 2, 5, 8, 9, 40])
def test_asking_for_the_next_block_or_not_gives_the_same_outputs(rows: int) -> None:
    if not ISAS:
        pytest.fail("this CPU has neither AVX2 nor AVX-512: the native linear cannot run")
    builds = [cpu_native.build(cpu_linear.LINEAR_NAME, "linear_cpu.cpp", ISAS[0],
                               cpu_linear.build_flags(choice)) for choice in ("always", "several-tiles")]
    assert builds[0].__file__ != builds[1].__file__  # two builds, not one cached twice
    gen = torch.Generator().manual_seed(rows)
    x, w, b = torch.randn(rows, 1000, generator=gen), torch.randn(300, 1000, generator=gen), torch.randn(300)
    outputs = [cpu_linear.linear(x, cpu_linear.pack(w, ext), 300, b, ext) for ext in builds]
    assert torch.equal(outputs[0], outputs[1])
    torch.testing.assert_close(outputs[0], _reference(x, w, b), rtol=1e-5, atol=2e-3)


@pytest.mark.parametrize("choice", ["always", "several-tiles"])
def test_the_linear_and_the_decoder_stack_are_built_with_the_chosen_flags(monkeypatch, choice: str) -> None:
    if not ISAS:
        pytest.fail("this CPU has neither AVX2 nor AVX-512: the native linear cannot run")
    monkeypatch.setenv(cpu_linear.AHEAD_ENV, choice)
    flags = cpu_linear.build_flags(choice)
    assert cpu_linear.load(ISAS[0]) is cpu_native.build(cpu_linear.LINEAR_NAME, "linear_cpu.cpp", ISAS[0], flags)
    asked = []  # the decoder stack includes the linear kernel: it is built with the same flags
    monkeypatch.setattr(cpu_native, "build", lambda *args: asked.append(args))
    cpu_decoder.load(ISAS[0])
    assert asked == [(cpu_decoder.DECODER_NAME, "decoder_cpu.cpp", ISAS[0], flags)]
