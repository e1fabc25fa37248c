"""An fp32 model whose weights are all bf16 values (a bf16 checkpoint run in fp32) keeps
them in bf16 panels: half the bytes read per step, and the same tokens as transformers' fp32
``generate`` and as the same engine on fp32 panels."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.bf16_checkpoint import save_bf16
from kernels import cpu_linear
from tests.conftest import checkpoint_dir, hf_greedy, prompt_token_lists
from worker.engine import LLMEngine, SamplingParams
from worker.engine.models.cpu_linear import (
    PANELS_ENV,
    PackedLinear,
    PanelMatmul,
    bf16_panels_wanted,
    panels_choice,
)
from worker.engine.models.native_stack import NativeDecodeStack

NEW_TOKENS = 16


def test_the_panel_dtype_follows_the_weight_the_build_and_the_choice(monkeypatch) -> None:
    assert bf16_panels_wanted("avx512")
    assert not bf16_panels_wanted("avx2")  # the AVX2 build keeps fp32 by default
    assert bf16_panels_wanted("avx2", "bf16")
    assert not bf16_panels_wanted("avx512", "fp32")
    ext = cpu_linear.load()
    exact = torch.randn(40, 24).bfloat16().float()
    inexact = exact + 2.0**-12  # values bf16 cannot hold
    assert PanelMatmul(exact, ext, try_bf16=True).panels.dtype == torch.bfloat16
    assert PanelMatmul(exact, ext).panels.dtype == torch.float32
    assert PanelMatmul(inexact, ext, try_bf16=True).panels.dtype == torch.float32
    assert panels_choice() == "auto"
    monkeypatch.setenv(PANELS_ENV, " BF16 ")
    assert panels_choice() == "bf16"
    monkeypatch.setenv(PANELS_ENV, "fp16")
    with pytest.raises(ValueError, match="expected one of auto, bf16, fp32"):
        panels_choice()


def bf16_checkpoint(arch: str, where: Path) -> Path:
    """The tiny ``arch`` checkpoint saved in bf16, as most published checkpoints are."""
    return save_bf16(Path(checkpoint_dir(f"tiny-{arch}")), where)


def run(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    done: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        outputs, _ = engine.step()
        done.update({o.request_id: o.token_ids for o in outputs if o.finished})
    return [done[f"r{i}"] for i in range(len(prompts))]


def panel_dtypes(engine: LLMEngine) -> set[torch.dtype]:
    model = engine.runner.model
    dtypes = {m.matmul.panels.dtype for m in model.modules()
              if isinstance(m, PackedLinear) and isinstance(m.matmul, PanelMatmul)}
    for layer in getattr(model, "decoder_layers", []):  # experts packed one call per projection
        for grouped in getattr(layer.mlp, "grouped", None) or ():
            dtypes |= {p.dtype for p in grouped.panels}
    return dtypes


@pytest.mark.parametrize("arch", ["llama", "qwen3moe"])
def test_a_bf16_checkpoint_in_fp32_reads_bf16_panels_and_gives_the_same_tokens(
        arch: str, tmp_path: Path, monkeypatch) -> None:
    path = bf16_checkpoint(arch, tmp_path / arch)
    monkeypatch.setenv(PANELS_ENV, "bf16")  # on whichever build this CPU runs
    args = {"dtype": "float32", "num_kv_blocks": 64, "max_num_seqs": 4, "max_num_batched_tokens": 32}
    engine = LLMEngine(model=str(path), **args)
    assert engine.runner.dtype == torch.float32
    assert panel_dtypes(engine) == {torch.bfloat16}
    if arch == "llama":
        assert isinstance(engine.runner.model.native_stack, NativeDecodeStack)
    prompts = prompt_token_lists(engine.tokenizer, 4, seed=5, lo=9, hi=60)
    outputs = run(engine, prompts)
    assert outputs == [hf_greedy(str(path), prompt, NEW_TOKENS) for prompt in prompts]  # HF in fp32
    monkeypatch.setenv(PANELS_ENV, "fp32")
    wide = LLMEngine(model=str(path), **args)
    assert panel_dtypes(wide) == {torch.float32}
    assert run(wide, prompts) == outputs
