"""One mixture-of-experts block, its experts in one native call per projection (the
engine's path) against a call per expert (the path before it), at decode and prefill
token counts.

    python benchmarks/moe_block.py [--experts 128] [--tokens 1,4,16,64,256]
        [--layers 4] [--rounds 7] [--threads 2] [--json docs/moe_block.json]

Shapes are Qwen3-30B-A3B's (hidden 2048, experts of 768, 8 picked per token and
renormalised), fp32, seeded random weights and router. ``--layers`` blocks run back to
back so the experts stream from memory as in a step, not from cache. Each round times
both paths on the same inputs, one after the other; the figure is the median over rounds
of each path's time and of their ratio. Prints one JSON line per token count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import Qwen3MoeConfig

from cli.bench.machine import cpu_description
from kernels.cpu_fused import ops_for
from worker.engine.models.cpu_linear import packer_for
from worker.engine.models.layers import MoE
from worker.engine.models.registry import arch_spec
from worker.engine.models.spec import MoESpec

HIDDEN, EXPERT_WIDTH, TOP_K = 2048, 768, 8


def make_blocks(experts: int, layers: int) -> list[MoE]:
    """``layers`` MoE blocks of Qwen3-30B-A3B's shapes with ``experts`` experts, packed."""
    config = Qwen3MoeConfig(hidden_size=HIDDEN, moe_intermediate_size=EXPERT_WIDTH, num_experts=experts,
                            num_experts_per_tok=TOP_K, norm_topk_prob=True, num_hidden_layers=1,
                            num_attention_heads=32, num_key_value_heads=4, head_dim=128)
    spec = arch_spec(config)
    moe = MoESpec(num_experts=experts, top_k=TOP_K, intermediate_size=EXPERT_WIDTH,
                  renormalize=True, sparse_layers=frozenset({0}))
    pack = packer_for(torch.float32)
    if pack is None:
        raise SystemExit("no packed fp32 linear on this machine: nothing to compare")
    gen = torch.Generator().manual_seed(0)
    blocks = []
    for _ in range(layers):
        block = MoE(spec, moe)
        with torch.no_grad():
            block.gate.weight.copy_(torch.randn(block.gate.weight.shape, generator=gen) * 0.05)
            block.w13.copy_(torch.randn(block.w13.shape, generator=gen) * 0.02)
            block.w2.copy_(torch.randn(block.w2.shape, generator=gen) * 0.02)
        block.pack_experts(pack)
        if block.grouped is None:
            raise SystemExit("the experts did not pack into the native panels: no grouped path here")
        blocks.append(block)
    return blocks


def time_paths(blocks: list[MoE], x: torch.Tensor, rounds: int) -> dict[str, float]:
    """Median ms of all blocks on ``x`` grouped and per expert, and of their ratio."""
    ops = ops_for(x.device, x.dtype, True)

    def run(grouped: bool) -> float:
        saved = [block.grouped for block in blocks]
        if not grouped:
            for block in blocks:
                block.grouped = None
        start = time.perf_counter()
        for block in blocks:
            block(x, ops)
        elapsed = time.perf_counter() - start
        for block, kept in zip(blocks, saved, strict=True):
            block.grouped = kept
        return elapsed * 1000

    run(True), run(False)  # warm-up
    grouped, looped = [], []
    for _ in range(rounds):
        grouped.append(run(True))
        looped.append(run(False))
    return {"grouped_ms": statistics.median(grouped), "per_expert_ms": statistics.median(looped),
            "grouped_over_per_expert": statistics.median(g / p for g, p in zip(grouped, looped, strict=True))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--tokens", default="1,4,16,64,256")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="also write every line to this file")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    blocks = make_blocks(args.experts, args.layers)
    gen = torch.Generator().manual_seed(1)
    lines = []
    with torch.inference_mode():
        for tokens in (int(t) for t in args.tokens.split(",")):
            x = torch.randn(tokens, HIDDEN, generator=gen)
            routed = torch.topk(blocks[0].gate(x), TOP_K, dim=-1).indices.unique().numel()
            line = {"tokens": tokens, "experts": args.experts, "experts_with_tokens_layer0": routed,
                    "layers": args.layers, "threads": args.threads, **time_paths(blocks, x, args.rounds)}
            lines.append(line)
            print(json.dumps(line), flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"command": "python benchmarks/moe_block.py", "cpu": cpu_description(),
                       "torch": torch.__version__, "lines": lines}, out, indent=1)


if __name__ == "__main__":
    main()
