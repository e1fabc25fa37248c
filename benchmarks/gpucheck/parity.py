"""Greedy parity: this engine's tokens against Hugging Face ``generate`` on one checkpoint.

HF runs each prompt alone (no padding) in the same dtype on the same device, with EOS
disabled like ``ignore_eos`` here. Two implementations may round differently, so a
mismatch is accepted only where it is a near tie in HF's own logits: at the first
differing position, HF's score of its token minus its score of ours is within
``TIE_TOLERANCE`` of that row's standard deviation. Anything else fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
TIE_TOLERANCE = {"float32": 1e-3, "bfloat16": 0.05}  # fraction of the logits' std


@dataclass
class PromptParity:
    """How one prompt's greedy continuation compares."""

    matched: int  # leading tokens equal
    length: int  # tokens compared
    margin_over_std: float | None  # at the first difference: HF's gap between the two tokens

    def verdict(self, dtype: str) -> bool:
        """Equal, or first differing at a near tie of HF's logits."""
        if self.matched == self.length:
            return True
        return self.margin_over_std is not None and self.margin_over_std <= TIE_TOLERANCE[dtype]


def hf_greedy_with_scores(model: Any, prompt: Sequence[int], max_new_tokens: int
                          ) -> tuple[list[int], list[torch.Tensor]]:
    """HF greedy tokens of one prompt and the logits row each was chosen from."""
    ids = torch.tensor([list(prompt)], device=model.device)
    pad = model.config.pad_token_id
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=max_new_tokens, min_new_tokens=0, eos_token_id=[],
                             pad_token_id=0 if pad is None else pad, output_scores=True,
                             return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt):].tolist()
    return tokens, [s[0].float() for s in out.scores]


def compare(ours: Sequence[int], theirs: Sequence[int], scores: Sequence[torch.Tensor]
            ) -> PromptParity:
    """Leading agreement and, at the first difference, HF's margin in units of its std."""
    length = min(len(ours), len(theirs))
    matched = next((i for i in range(length) if ours[i] != theirs[i]), length)
    margin = None
    if matched < length:
        row = scores[matched]  # [vocab]
        margin = float((row[theirs[matched]] - row[ours[matched]]) / row.std())
    return PromptParity(matched, length, margin)


def engine_greedy(engine: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int
                  ) -> list[list[int]]:
    """This engine's greedy tokens for every prompt, batched (continuous batching); the
    engine (an ``LLMEngine``, drained) is left drained."""
    from worker.engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"parity-{i}", list(prompt), params)
    done: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        outputs, _ = engine.step()
        done.update({o.request_id: list(o.token_ids) for o in outputs if o.finished})
    return [done[f"parity-{i}"] for i in range(len(prompts))]


def load_hf(path: str, dtype: str, device: torch.device) -> Any:
    """The checkpoint through transformers, in ``dtype`` on ``device``, eval mode."""
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=TORCH_DTYPES[dtype])
    return model.to(device).eval()


def random_prompts(count: int, vocab_size: int, *, min_len: int, max_len: int, seed: int
                   ) -> list[list[int]]:
    """``count`` prompts of seeded random lengths and token ids."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (count,), generator=gen).tolist()
    return [torch.randint(0, vocab_size, (n,), generator=gen).tolist() for n in lengths]
