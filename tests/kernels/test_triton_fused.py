"""The Triton element-wise kernels (``kernels/triton_fused.py``) against the torch reference
ops (``kernels.cpu_fused.TORCH_OPS``) on the same inputs: under the interpreter, or on CUDA
with ``INFLIGHT_TRITON_TEST_DEVICE=cuda`` (``triton_harness.py`` says how they run).

Both sides round to the tensors' dtype at the same places, so fp32 differs only in the
norm's order of summation and in exp (a few ulp), and the half dtypes by an ulp or two (the
interpreter rounds fp32 -> bf16 by truncation, the GPU to nearest). Rows, widths and head
counts are ragged (not powers of two, one row, a row stride wider than the row), so a
masked lane or a wrong stride shows.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from kernels.cpu_fused import TORCH_OPS
from tests.kernels.triton_harness import Run

if importlib.util.find_spec("triton") is None:  # found, not imported: see triton_harness.py
    pytest.skip("triton is not installed: the Triton kernels cannot run", allow_module_level=True)

# (atol, rtol) of the kernel against the torch ops on the same inputs: two ulps of a half
# dtype (a result rounded twice, each time truncated by the interpreter).
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (2e-2, 2e-2), torch.float16: (3e-3, 3e-3)}
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def close(out: torch.Tensor, want: torch.Tensor, rounded_as: torch.dtype | None = None) -> None:
    """``out`` equals ``want`` in dtype and within the rounding of ``rounded_as`` (default:
    their dtype)."""
    atol, rtol = TOLERANCES[rounded_as or want.dtype]
    assert out.dtype == want.dtype and out.shape == want.shape
    torch.testing.assert_close(out.float(), want.float(), atol=atol, rtol=rtol)


def rows_of(num_rows: int, width: int, dtype: torch.dtype, *, pad: int, seed: int) -> torch.Tensor:
    """Random ``[num_rows, width]`` rows, viewed out of rows ``pad`` columns wider (NaN there)."""
    torch.manual_seed(seed)  # the default device's generator (CUDA in the CUDA runs)
    buffer = torch.full((num_rows, width + pad), float("nan"), dtype=dtype)
    buffer[:, :width] = (torch.randn(num_rows, width) * 2).to(dtype)
    return buffer[:, :width]  # [num_rows, width], row stride width + pad


def check_add_rms_norm(dtype: torch.dtype, num_rows: int, width: int, with_delta: bool, pad: int) -> None:
    from kernels import triton_fused

    hidden = rows_of(num_rows, width, dtype, pad=pad, seed=width + num_rows)
    delta = rows_of(num_rows, width, dtype, pad=0, seed=1) if with_delta else None
    weight = (torch.rand(width) + 0.5).to(dtype)
    want_hidden = hidden.clone()
    want = TORCH_OPS.add_rms_norm(want_hidden, delta, weight, 1e-6)
    out = triton_fused.add_rms_norm(hidden, delta, weight, 1e-6)
    close(out, want)
    close(hidden, want_hidden)  # the residual add, in place (unchanged without a delta)
    assert not with_delta or not torch.equal(hidden, rows_of(num_rows, width, dtype, pad=pad,
                                                             seed=width + num_rows))


def check_add_rms_norm_fp32_weight_on_half_rows() -> None:
    """An fp32 weight on bf16 rows gives fp32 rows, as ``weight * x.to(bf16)`` does."""
    from kernels import triton_fused

    hidden = rows_of(3, 96, torch.bfloat16, pad=0, seed=5)
    weight = torch.rand(96) + 0.5
    out = triton_fused.add_rms_norm(hidden, None, weight, 1e-5)
    want = TORCH_OPS.add_rms_norm(hidden.clone(), None, weight, 1e-5)
    assert want.dtype == torch.float32
    close(out, want, rounded_as=torch.bfloat16)  # the normed rows are rounded to bf16 first


def check_rope_qk(dtype: torch.dtype, num_tokens: int, num_heads: int, num_kv_heads: int,
                  head_dim: int, pad: int) -> None:
    from kernels import triton_fused

    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = rows_of(num_tokens, width, dtype, pad=pad, seed=head_dim + num_heads)
    angles = torch.arange(num_tokens)[:, None] * 0.37 + torch.arange(head_dim // 2)[None, :] * 0.11
    angles = torch.cat((angles, angles), dim=-1)  # [T, D], halves equal as in a rotary table
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    want = qkv.clone()
    TORCH_OPS.rope_qk_(want, cos, sin, num_heads, num_kv_heads)
    v_before = qkv[:, (num_heads + num_kv_heads) * head_dim:].clone()
    triton_fused.rope_qk_(qkv, cos, sin, num_heads, num_kv_heads)
    close(qkv, want)
    assert torch.equal(qkv[:, (num_heads + num_kv_heads) * head_dim:], v_before)  # v untouched


def check_silu_mul(dtype: torch.dtype, num_rows: int, inter: int, pad: int) -> None:
    from kernels import triton_fused

    gate_up = rows_of(num_rows, 2 * inter, dtype, pad=pad, seed=inter)
    close(triton_fused.silu_mul(gate_up), TORCH_OPS.silu_mul(gate_up))


def check_empty_batches() -> None:
    """No rows: nothing launched, outputs of the right shape."""
    from kernels import triton_fused

    hidden = torch.empty(0, 64)
    assert triton_fused.add_rms_norm(hidden, None, torch.ones(64), 1e-6).shape == (0, 64)
    assert triton_fused.silu_mul(torch.empty(0, 128)).shape == (0, 64)
    triton_fused.rope_qk_(torch.empty(0, 3 * 16), torch.empty(0, 16), torch.empty(0, 16), 1, 1)


def check_bad_arguments() -> None:
    """Shapes and dtypes that do not fit are refused before a launch, with the reason."""
    from kernels import triton_fused

    hidden = torch.randn(2, 64)
    cases = [
        (lambda: triton_fused.add_rms_norm(hidden, None, torch.ones(63), 1e-6), "weight must be"),
        (lambda: triton_fused.add_rms_norm(hidden, torch.randn(2, 32), torch.ones(64), 1e-6), "must match"),
        (lambda: triton_fused.add_rms_norm(hidden.t(), None, torch.ones(2), 1e-6), "contiguous"),
        (lambda: triton_fused.silu_mul(torch.randn(2, 7)), "even number"),
        (lambda: triton_fused.rope_qk_(torch.randn(2, 48), torch.randn(2, 16), torch.randn(2, 16), 3, 1),
         "fewer than"),
        (lambda: triton_fused.rope_qk_(torch.randn(2, 48), torch.randn(2, 16).double(),
                                       torch.randn(2, 16), 1, 1), "float32, bfloat16"),
        (lambda: triton_fused.rope_qk_(torch.randn(2, 48).bfloat16(), torch.randn(2, 16),
                                       torch.randn(2, 16), 1, 1), "qkv's dtype"),
    ]
    for call, reason in cases:
        with pytest.raises(ValueError, match=reason):
            call()


def check_cuda_ops_are_the_triton_kernels() -> None:
    """``ops_for`` gives a CUDA tensor these kernels (here triton is installed), and the
    torch ops with INFLIGHT_CUDA_FUSED_OPS=off."""
    from kernels import cpu_fused, triton_fused

    ops = cpu_fused.ops_for(torch.device("cuda"), torch.bfloat16)
    assert ops.name == "triton" and ops.add_rms_norm is triton_fused.add_rms_norm
    assert cpu_fused.ops_for(torch.device("cuda"), torch.bfloat16, prefer_native=False) is TORCH_OPS
    os.environ[cpu_fused.CUDA_FUSED_ENV] = "off"  # the operator's way back to the torch ops
    cpu_fused._cuda_ops.cache_clear()
    try:
        assert cpu_fused.ops_for(torch.device("cuda"), torch.bfloat16) is TORCH_OPS
    finally:
        del os.environ[cpu_fused.CUDA_FUSED_ENV]
        cpu_fused._cuda_ops.cache_clear()
    assert cpu_fused.ops_for(torch.device("cuda"), torch.bfloat16).name == "triton"


def decode_run(arch: str, ops_name: str) -> tuple[list[list[int]], list[torch.Tensor]]:
    """Greedy tokens of three prompts of ``tiny-<arch>`` on the CPU in fp32, and every
    step's logits, each step through the decoder's layer loop with the torch ops or the
    Triton kernels (what a CUDA tensor gets), chunked prefill and decode steps alike."""
    from kernels import cpu_fused
    from worker.engine import LLMEngine, SamplingParams
    from worker.engine.models import decoder

    ops = cpu_fused._cuda_ops() if ops_name == "triton" else TORCH_OPS
    assert ops.name == ops_name
    engine = LLMEngine(model=f"tiny-{arch}", num_kv_blocks=32, max_num_seqs=4,
                       max_num_batched_tokens=16)
    model = engine.runner.model
    model.native_stack = None  # the layer loop, where the ops are called
    logits: list[torch.Tensor] = []
    forward = model.forward

    def recorded(*args, **kwargs):
        logits.append(forward(*args, **kwargs))
        return logits[-1]

    model.forward = recorded
    saved = decoder.ops_for
    decoder.ops_for = lambda device, dtype, prefer_native=True: ops  # type: ignore[assignment]
    try:
        words = "the engine schedules one token per running sequence while new requests wait"
        for i, n in enumerate((3, 7, 12)):
            prompt = engine.tokenize(" ".join(words.split()[:n]))
            engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True))
        tokens: dict[str, list[int]] = {}
        while engine.has_unfinished_requests():
            for out in engine.step()[0]:
                tokens[out.request_id] = out.token_ids
    finally:
        decoder.ops_for = saved
    return [tokens[f"r{i}"] for i in range(3)], logits


def check_tiny_family_with_triton_ops(arch: str) -> None:
    """The Triton ops inside the whole decoder (q/k norms, sandwich and post norms, GeGLU,
    experts) give the torch ops' logits within fp32 rounding at every step, and their
    greedy tokens."""
    tokens, logits = decode_run(arch, "triton")
    want_tokens, want_logits = decode_run(arch, "torch")
    assert tokens == want_tokens
    assert len(logits) == len(want_logits) > 5
    for got, want in zip(logits, want_logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3", "olmo2", "qwen3moe", "phi4mini"])
def test_tiny_families_decode_alike_with_the_triton_ops(run: Run, arch: str) -> None:
    if os.environ.get("INFLIGHT_TRITON_TEST_DEVICE") == "cuda":
        pytest.skip("a CPU model: the engine's own CUDA runs are tests/engine/test_gpu_engine.py")
    run(check_tiny_family_with_triton_ops, arch)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_rows", "width", "pad"), [(1, 576, 0), (3, 96, 5), (17, 64, 0), (2, 2048, 8)])
def test_add_rms_norm(run: Run, dtype: torch.dtype, num_rows: int, width: int, pad: int) -> None:
    run(check_add_rms_norm, dtype, num_rows, width, True, pad)
    run(check_add_rms_norm, dtype, num_rows, width, False, pad)


def test_add_rms_norm_fp32_weight_on_half_rows(run: Run) -> None:
    run(check_add_rms_norm_fp32_weight_on_half_rows)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(9, 3, 64), (4, 1, 128), (2, 2, 16)])
def test_rope_qk(run: Run, dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    run(check_rope_qk, dtype, 1, num_heads, num_kv_heads, head_dim, 0)
    run(check_rope_qk, dtype, 5, num_heads, num_kv_heads, head_dim, 3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("num_rows", "inter", "pad"), [(1, 1536, 0), (4, 100, 2), (3, 2500, 0)])
def test_silu_mul(run: Run, dtype: torch.dtype, num_rows: int, inter: int, pad: int) -> None:
    run(check_silu_mul, dtype, num_rows, inter, pad)


def test_empty_batches(run: Run) -> None:
    run(check_empty_batches)


def test_bad_arguments_are_refused(run: Run) -> None:
    run(check_bad_arguments)


def test_cuda_tensors_get_the_triton_kernels(run: Run) -> None:
    run(check_cuda_ops_are_the_triton_kernels)
