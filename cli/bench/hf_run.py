"""The Hugging Face baseline: ``generate`` on left-padded batches in workload order.

Each batch runs to its longest request (``max_new_tokens`` = the batch's largest
max_tokens, EOS disabled); a request's useful tokens are its own max_tokens, the rest of
its padded row is waste.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from cli.bench.workload import BenchRequest, cohorts
from worker.engine.models.loader import resolve_checkpoint_dir

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_hf_model(spec: str, dtype: str = "float32") -> tuple[Any, int]:
    """The checkpoint as an ``AutoModelForCausalLM`` in eval mode, and its pad token id."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        resolve_checkpoint_dir(spec), dtype=_DTYPES.get(dtype, torch.float32)).eval()
    pad = model.config.pad_token_id
    if pad is None:
        eos = model.config.eos_token_id
        pad = (eos[0] if isinstance(eos, list) else eos) or 0
    return model, int(pad)


def _generate(model: Any, batch: Sequence[BenchRequest], pad_id: int) -> int:
    """Run one left-padded batch; returns the number of new tokens per row."""
    width = max(len(r.prompt_token_ids) for r in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, r in enumerate(batch):
        n = len(r.prompt_token_ids)
        ids[row, width - n:] = torch.tensor(r.prompt_token_ids)
        mask[row, width - n:] = 1
    max_new = max(r.max_tokens for r in batch)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new, min_new_tokens=0,
                             do_sample=False, eos_token_id=[], pad_token_id=pad_id)
    new = out.shape[1] - width
    if new != max_new:
        raise RuntimeError(f"HF generate produced {new} tokens per row, expected {max_new}")
    return new


def warm_up_hf(model: Any, requests: Sequence[BenchRequest], pad_id: int) -> None:
    """One small batch of a few tokens."""
    batch = [BenchRequest(r.id, r.prompt_token_ids, 4) for r in requests[:2]]
    _generate(model, batch, pad_id)


def run_hf(model: Any, requests: Sequence[BenchRequest], *, batch_size: int, pad_id: int
           ) -> dict[str, Any]:
    """Time ``generate`` over the workload in batches of ``batch_size``."""
    useful = sum(r.max_tokens for r in requests)
    slot_steps = 0
    steps = 0
    batch_seconds = []
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    for batch in cohorts(requests, batch_size):
        tb = time.perf_counter()
        new = _generate(model, batch, pad_id)
        batch_seconds.append(time.perf_counter() - tb)
        slot_steps += len(batch) * new  # rows computed, padding included
        steps += new
    seconds = time.perf_counter() - t0
    return {
        "kind": "hf",
        "batch_size": batch_size,
        "num_requests": len(requests),
        "useful_tokens": useful,
        "wall_seconds": seconds,
        "cpu_seconds": time.process_time() - cpu0,
        "useful_tokens_per_s": useful / seconds,
        "slot_utilization": useful / slot_steps if slot_steps else None,
        "num_steps": steps,
        "mean_step_ms": 1000 * seconds / steps if steps else None,
        "batch_seconds": batch_seconds,
    }
