"""CUDA-graph decode: every ladder size captured, and replay equal to the eager forward.

Each comparison builds a random decode step (random contexts over distinct random KV
blocks, random tokens), runs the model eagerly on exactly that step, then the same step
through ``DecodeGraphs.run`` (padded to its ladder size, replayed on CUDA, eager padded
buffers on the CPU). Both write the same K/V to the same slots, so the second run sees
the cache the first one left. Sizes: every ladder size, and one below each (padding rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.gpucheck.device import time_ms
from worker.engine.attention_metadata import AttentionMetadata
from worker.engine.decode_graphs import DecodeGraphs

# Largest |replay - eager| over the eager logits' standard deviation, where the eager
# forward runs on the graph's own padded buffers: the same kernels on the same shapes, so
# anything above rounding is a capture or buffer fault (measured 0 on an H200 in bf16).
TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.1, torch.float16: 0.05}
# The same against the eager forward of the unpadded step. Padding changes the shapes:
# a wider block table can change the decode attention's split into partitions and a
# padded row count cuBLAS's kernel, so sums run in another order. fp32 keeps that to
# rounding; in bf16 one flipped rounding grows through the layers of random weights (an
# H200 read up to 0.165 on the 16-layer Llama-3.2-1B shape, argmax agreement >= 0.86).
# A padding row leaking into a real one moves that row's logits by whole standard
# deviations, which these bounds still catch.
PADDING_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 0.5, torch.float16: 0.5}


@dataclass
class DecodeStep:
    """One decode step's inputs."""

    input_ids: torch.Tensor  # [num_seqs]
    meta: AttentionMetadata


def random_decode_step(num_seqs: int, *, num_blocks: int, block_size: int, max_context: int,
                       vocab_size: int, device: torch.device, seed: int) -> DecodeStep:
    """``num_seqs`` sequences of random contexts (at most ``max_context``, bounded by the
    pool so no two sequences share a block), each decoding one random token."""
    gen = torch.Generator().manual_seed(seed)
    per_seq = max(1, min(-(-max_context // block_size), num_blocks // num_seqs))
    if per_seq * num_seqs > num_blocks:
        raise ValueError(f"{num_blocks} KV blocks cannot hold {num_seqs} sequences")
    contexts = torch.randint(1, per_seq * block_size + 1, (num_seqs,), generator=gen)
    width = int(-(-contexts.max() // block_size))
    order = torch.randperm(num_blocks, generator=gen)[: num_seqs * per_seq]
    tables = order.view(num_seqs, per_seq)[:, :width].clone()  # [num_seqs, width]
    used = -(-contexts // block_size)  # [num_seqs] blocks each sequence reads
    tables[torch.arange(width)[None, :] >= used[:, None]] = 0  # unused entries 0, as the engine
    positions = contexts - 1  # the new token's position
    rows = torch.arange(num_seqs)
    slots = tables[rows, positions // block_size] * block_size + positions % block_size
    arange = torch.arange(num_seqs + 1)
    meta = AttentionMetadata(
        positions=positions.to(device), slot_mapping=slots.to(device),
        cu_seqlens_q=arange.to(device),
        cu_seqlens_k=torch.cat([torch.zeros(1, dtype=torch.long), contexts.cumsum(0)]).to(device),
        context_lens=contexts.to(device), block_tables=tables.to(device),
        num_decode_seqs=num_seqs, logits_indices=arange[:num_seqs].to(device),
    )
    ids = torch.randint(0, vocab_size, (num_seqs,), generator=gen).to(device)
    return DecodeStep(ids, meta)


def comparison_sizes(ladder: list[int]) -> list[int]:
    """Every ladder size and the size just below each (which runs with a padding row)."""
    return sorted({*ladder, *(max(1, s - 1) for s in ladder)})


@torch.inference_mode()
def compare_replay_with_eager(graphs: DecodeGraphs, *, num_blocks: int, block_size: int,
                              max_context: int, seed: int = 0,
                              time_iters: int = 0) -> list[dict[str, Any]]:
    """Per comparison size: max |replay - eager| / std(eager) against the eager forward of
    the unpadded step and against the eager forward of the graph's padded buffers,
    argmax agreement with the unpadded one, and (with ``time_iters``) the median
    milliseconds of the unpadded eager forward and of the replay."""
    model = graphs.model
    vocab = model.config.vocab_size
    rows = []
    for n in comparison_sizes(graphs.ladder):
        step = random_decode_step(n, num_blocks=num_blocks, block_size=block_size,
                                  max_context=max_context, vocab_size=vocab,
                                  device=graphs.device, seed=seed + n)

        def eager(step: DecodeStep = step) -> torch.Tensor:
            return model(step.input_ids, step.meta, graphs.kv_caches, graphs.backend)

        def replay(step: DecodeStep = step) -> torch.Tensor:
            return graphs.run(step.input_ids, step.meta)

        want = eager().float()  # [n, vocab]
        got = replay().float()  # [n, vocab]
        padded = graphs.run(step.input_ids, step.meta, replay=False).float()  # [n, vocab]
        row: dict[str, Any] = {
            "batch": n, "padded_to": next(s for s in graphs.ladder if s >= n),
            "padded_diff_over_std": float((got - padded).abs().max() / padded.std()),
            "max_abs_diff_over_std": float((got - want).abs().max() / want.std()),
            "argmax_agreement": float((got.argmax(-1) == want.argmax(-1)).float().mean()),
        }
        if time_iters:
            row["eager_ms"] = time_ms(eager, graphs.device, iters=time_iters)
            row["replay_ms"] = time_ms(replay, graphs.device, iters=time_iters)
        rows.append(row)
    return rows


def randomize_kv(kv_caches: list[tuple[torch.Tensor, torch.Tensor]], seed: int) -> None:
    """Fill every layer's K and V pool with random values (the engine must be drained)."""
    torch.manual_seed(seed)
    for k_cache, v_cache in kv_caches:
        k_cache.normal_()
        v_cache.normal_()
