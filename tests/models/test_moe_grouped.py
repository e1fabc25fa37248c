"""The MoE block's grouped path (every expert of a projection in one native call) gives
the per-expert loop's output to the bit, at decode and prefill token counts, with experts
that get no tokens; the engine takes it wherever the experts are in the native panels."""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_fused import ops_for
from worker.engine import LLMEngine
from worker.engine.models.layers import MoE


@pytest.mark.parametrize("arch", ["qwen3moe", "mixtral"])
def test_grouped_experts_equal_the_loop_to_the_bit(arch: str) -> None:
    engine = LLMEngine(model=f"tiny-{arch}", num_kv_blocks=8, max_num_seqs=2)
    model = engine.runner.model
    blocks = [layer.mlp for layer in model.decoder_layers if isinstance(layer.mlp, MoE)]
    assert blocks, f"tiny-{arch} has no MoE block"
    if not engine.runner.prepacked or blocks[0].packed is None:
        pytest.skip("the experts are not packed on this machine (no native linear)")
    assert all(block.grouped is not None for block in blocks), "native panels but no grouped path"
    gen = torch.Generator().manual_seed(7)
    hidden = model.spec.hidden_size
    ops = ops_for(torch.device("cpu"), torch.float32, model.native_ops)
    with torch.inference_mode():
        for tokens in (1, 3, 40):
            x = torch.randn(tokens, hidden, generator=gen)
            for block in blocks:
                grouped = block(x, ops)
                saved, block.grouped = block.grouped, None
                try:
                    loop = block(x, ops)
                finally:
                    block.grouped = saved
                assert torch.equal(grouped, loop), f"{arch}: {tokens} tokens"
