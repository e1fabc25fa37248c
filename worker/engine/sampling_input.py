"""What the sampler and the logit adjustments read from each sequence of a batch."""

from __future__ import annotations

from typing import Protocol

import torch

from worker.protocol.sampling_params import SamplingParams


class SamplingInput(Protocol):
    """What the sampler reads from each sequence of the batch."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    generator: torch.Generator | None  # per-request RNG when params.seed is set, else None
