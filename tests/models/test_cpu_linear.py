"""Packed CPU linears (native panels and oneDNN): same output as ``nn.Linear``, a bounded
oneDNN primitive cache, and the packer each dtype gets."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from worker.engine.models.cpu_linear import (
    LINEAR_ENV,
    PRIMITIVE_CACHE_CAPACITY,
    PRIMITIVE_CACHE_ENVS,
    OneDnnMatmul,
    PackedLinear,
    PanelMatmul,
    onednn_available,
    pack_linears,
    packer_for,
)

pytestmark = pytest.mark.skipif(not onednn_available(), reason="torch built without oneDNN")


@pytest.mark.parametrize("kind", ["native", "onednn"])
def test_packed_linears_match_nn_linear_at_every_row_count(monkeypatch, kind: str) -> None:
    monkeypatch.setenv(LINEAR_ENV, kind)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.Sequential(nn.Linear(96, 32, bias=False)))
    x = torch.randn(37, 64)
    expected = model(x)
    pack = packer_for(torch.float32)
    assert pack is not None
    assert pack_linears(model, pack) == 2
    assert isinstance(model[0], PackedLinear) and isinstance(model[1][0], PackedLinear)
    assert isinstance(model[0].matmul, PanelMatmul if kind == "native" else OneDnnMatmul)
    for rows in (1, 5, 37):
        torch.testing.assert_close(model(x[:rows]), expected[:rows], rtol=1e-5, atol=1e-5)


def test_fp32_gets_the_native_panels_and_bf16_onednn(monkeypatch) -> None:
    monkeypatch.delenv(LINEAR_ENV, raising=False)
    fp32 = packer_for(torch.float32)
    assert fp32 is not None and isinstance(fp32(torch.randn(8, 4)), PanelMatmul)
    assert packer_for(torch.bfloat16) is (OneDnnMatmul if onednn_available(torch.bfloat16) else None)
    monkeypatch.setenv(LINEAR_ENV, "mkl")
    with pytest.raises(ValueError, match=LINEAR_ENV):
        packer_for(torch.float32)
    monkeypatch.delenv(LINEAR_ENV)
    monkeypatch.setenv("INFLIGHT_CPU_AHEAD", "sometimes")  # refused, not taken for a failed build
    with pytest.raises(ValueError, match="INFLIGHT_CPU_AHEAD"):
        packer_for(torch.float32)


@pytest.mark.parametrize("name", PRIMITIVE_CACHE_ENVS)
def test_packing_caps_the_primitive_caches_unless_the_user_chose_a_size(monkeypatch,
                                                                        name: str) -> None:
    for each in PRIMITIVE_CACHE_ENVS:
        monkeypatch.delenv(each, raising=False)
    pack_linears(nn.Linear(8, 8), OneDnnMatmul)
    assert PRIMITIVE_CACHE_CAPACITY < 1024  # the libraries' own default
    assert int(os.environ[name]) == PRIMITIVE_CACHE_CAPACITY
    monkeypatch.setenv(name, "300")
    pack_linears(nn.Linear(8, 8), OneDnnMatmul)
    assert os.environ[name] == "300"


def _memory_growth_mib(env_caps: dict[str, str]) -> int:
    """MiB a fresh process grows while packed matmuls run at 400 new row counts (the caps
    are read at the first primitive, so only a fresh process can check them)."""
    code = (
        "import torch\n"
        "from torch import nn\n"
        "from cli.bench.machine import current_rss_bytes\n"
        "from worker.engine.models.cpu_linear import OneDnnMatmul, pack_linears\n"
        "model = nn.Sequential(nn.Linear(576, 1536), nn.Linear(1536, 576))\n"
        "pack_linears(model, OneDnnMatmul)\n"
        "torch.set_num_threads(1)\n"
        "def run(lo, hi):\n"
        "    for rows in range(lo, hi):\n"
        "        model(torch.randn(rows, 576))\n"
        "run(1, 40)\n"
        "before = current_rss_bytes()\n"
        "run(40, 440)\n"
        "print((current_rss_bytes() - before) >> 20)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in PRIMITIVE_CACHE_ENVS}
    env.update(env_caps)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=True)
    return int(out.stdout.strip())


def test_memory_stays_flat_over_many_row_counts() -> None:
    """Packed matmuls at 400 distinct row counts must not keep a primitive per count. The
    allocator's own growth differs between machines, so the capped process is compared
    with one run at the libraries' default of 1,024 entries on the same machine (675 MiB
    against 13 to 41 on the development machine)."""
    capped = _memory_growth_mib({})
    uncapped = _memory_growth_mib({name: "1024" for name in PRIMITIVE_CACHE_ENVS})
    assert capped * 5 < uncapped, f"capped grew {capped} MiB, uncapped {uncapped} MiB"


def test_bf16_weights_are_packed_only_where_onednn_has_a_bf16_path() -> None:
    from worker.engine import LLMEngine, SamplingParams
    from worker.protocol.sampling_params import InvalidRequestError

    has_path = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert onednn_available(torch.bfloat16) == has_path and onednn_available(torch.float32)
    engine = LLMEngine(model="tiny-llama", dtype="bfloat16", num_kv_blocks=64)
    assert engine.prepacked == has_path  # an AVX2-only CPU falls back to F.linear
    engine.add_request("r", prompt_token_ids=[1, 2, 3], params=SamplingParams(max_tokens=3, ignore_eos=True))
    done = []
    while engine.has_unfinished_requests():
        done += [o for o in engine.step()[0] if o.finished]
    assert len(done) == 1 and len(done[0].token_ids) == 3
    if not has_path:
        with pytest.raises(InvalidRequestError, match="prepack_weights=True"):
            LLMEngine(model="tiny-llama", dtype="bfloat16", num_kv_blocks=64, prepack_weights=True)
