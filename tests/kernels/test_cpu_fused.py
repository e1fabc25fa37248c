"""The native fused element-wise ops (kernels/csrc/fused_cpu.cpp) against their torch
references, for every kernel build this CPU can run, over ragged row counts, feature sizes
that are not a multiple of the vector width, strided rows, and GQA head layouts."""

from __future__ import annotations

import pytest
import torch

from kernels import cpu_fused, cpu_native

ISAS = cpu_native.supported_isas()


@pytest.fixture(params=ISAS or ["none"])
def ops(request: pytest.FixtureRequest) -> cpu_fused.LayerOps:
    if request.param == "none":
        pytest.fail("this CPU has neither AVX2 nor AVX-512: the native ops cannot run")
    return cpu_fused.native_ops(request.param)


@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("hidden_size", [576, 100, 8])
@pytest.mark.parametrize("with_delta", [True, False])
def test_add_rms_norm_matches_torch(ops, rows: int, hidden_size: int, with_delta: bool) -> None:
    gen = torch.Generator().manual_seed(rows * hidden_size)
    base = torch.randn(rows, hidden_size, generator=gen) * 3
    delta = torch.randn(rows, hidden_size, generator=gen) if with_delta else None
    weight = torch.randn(hidden_size, generator=gen)
    want_hidden, got_hidden = base.clone(), base.clone()
    want = cpu_fused.torch_add_rms_norm(want_hidden, delta, weight, 1e-5)
    got = ops.add_rms_norm(got_hidden, delta, weight, 1e-5)
    assert torch.equal(got_hidden, want_hidden)  # the residual add is exact, in place
    torch.testing.assert_close(got, want, atol=1e-6, rtol=2e-6)


def test_add_rms_norm_accepts_strided_rows(ops) -> None:
    wide = torch.randn(5, 40)
    rows = wide[:, :16]  # a view whose rows are 40 apart
    want = cpu_fused.torch_add_rms_norm(rows.clone(), None, torch.ones(16), 1e-6)
    torch.testing.assert_close(ops.add_rms_norm(rows, None, torch.ones(16), 1e-6), want)


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(9, 3, 64), (4, 4, 32), (8, 2, 128)])
@pytest.mark.parametrize("rows", [1, 13])
def test_rope_is_bitwise_the_torch_rotation(ops, num_heads: int, num_kv_heads: int,
                                            head_dim: int, rows: int) -> None:
    gen = torch.Generator().manual_seed(num_heads + rows)
    qkv = torch.randn(rows, (num_heads + 2 * num_kv_heads) * head_dim, generator=gen)
    angles = torch.rand(rows, head_dim // 2, generator=gen) * 50
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)  # [rows, head_dim]
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)
    want, got = qkv.clone(), qkv.clone()
    cpu_fused.torch_rope_qk_(want, cos, sin, num_heads, num_kv_heads)
    ops.rope_qk_(got, cos, sin, num_heads, num_kv_heads)
    assert torch.equal(got, want)  # same products and sums, no fused multiply-add
    v_part = slice((num_heads + num_kv_heads) * head_dim, None)
    assert torch.equal(got[:, v_part], qkv[:, v_part])  # v untouched


@pytest.mark.parametrize("rows", [1, 64])
@pytest.mark.parametrize("inter", [1536, 100])
def test_silu_mul_matches_torch(ops, rows: int, inter: int) -> None:
    gen = torch.Generator().manual_seed(inter + rows)
    gate_up = torch.randn(rows, 2 * inter, generator=gen) * 8
    gate_up[0, :6] = torch.tensor([-200.0, -90.0, -1e-30, 0.0, 90.0, 200.0])  # exp's edges
    got = ops.silu_mul(gate_up)
    torch.testing.assert_close(got, cpu_fused.torch_silu_mul(gate_up), atol=1e-6, rtol=2e-6)
    assert torch.isfinite(got).all()


@pytest.mark.parametrize("rows", [1, 5, 64])
@pytest.mark.parametrize("vocab", [49152, 1000, 7])  # whole vectors, a tail, less than one
def test_max_per_row_is_torch_max(ops, rows: int, vocab: int) -> None:
    gen = torch.Generator().manual_seed(rows + vocab)
    x = torch.randn(rows, vocab, generator=gen)
    x[0, vocab // 3] = x[0, vocab - 1] = 50.0  # a tie: the first index wins
    if rows > 1:
        x[1, vocab - 1] = float("inf")  # +inf in the tail
    if rows > 2:
        x[2, vocab // 2] = x[2, vocab - 1] = float("nan")  # NaN beats everything, first one
        x[2, 0] = float("inf")
    if rows > 3:
        x[3] = float("-inf")  # all masked
    if rows > 4:
        x[4] = 0.0  # all equal
    values, indices = ops.max_per_row(x)
    want_values, want_indices = torch.max(x, dim=-1)
    assert torch.equal(indices, want_indices)
    assert torch.equal(values.isnan(), want_values.isnan())
    assert torch.equal(values.nan_to_num(0), want_values.nan_to_num(0))


def test_max_per_row_reads_strided_rows(ops) -> None:
    wide = torch.randn(6, 300)
    rows = wide[:, 10:250]  # a view whose rows are 300 apart
    values, indices = ops.max_per_row(rows)
    assert torch.equal(indices, rows.argmax(dim=-1)) and torch.equal(values, rows.amax(dim=-1))


def test_other_dtypes_and_devices_get_the_torch_reference() -> None:
    assert cpu_fused.ops_for(torch.device("cpu"), torch.bfloat16) is cpu_fused.TORCH_OPS
    assert cpu_fused.ops_for(torch.device("cpu"), torch.float32, prefer_native=False) is cpu_fused.TORCH_OPS
    assert cpu_fused.ops_for(torch.device("cpu"), torch.float32).name == "cpu"


def test_bad_inputs_are_refused(ops) -> None:
    with pytest.raises(RuntimeError, match="float32"):
        ops.silu_mul(torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="differ in shape"):
        ops.add_rms_norm(torch.randn(2, 8), torch.randn(3, 8), torch.ones(8), 1e-6)
    with pytest.raises(RuntimeError, match="heads"):
        ops.rope_qk_(torch.randn(2, 64), torch.ones(2, 16), torch.ones(2, 16), 3, 1)
    with pytest.raises(RuntimeError, match="empty"):
        ops.max_per_row(torch.randn(2, 0))
