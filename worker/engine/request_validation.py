"""What the engine accepts: a request it can schedule to the end, or a clear refusal.

Every accepted request is scheduled: ``add_request`` refuses at once a prompt that
is empty or out of vocabulary, one whose prompt plus ``max_tokens`` passes the model's
context or the whole KV pool, and (chunked prefill off) a prompt longer than the step's
token budget, which no step could ever take whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.engine.outputs import RequestMetrics
from worker.engine.sampler import make_generator
from worker.engine.sequence import SampleGroup, Sequence
from worker.protocol.sampling_params import InvalidRequestError, SamplingParams


@dataclass(frozen=True)
class RequestLimits:
    """The bounds a request must fit, fixed when the engine is built."""

    vocab_size: int
    max_model_len: int
    pool_tokens: int  # tokens the whole KV pool holds
    max_prompt_tokens: int | None  # the token budget when prompts cannot be chunked, else None
    device: torch.device
    window: int = 0  # every layer's widest window (0: some layer reads everything)
    block_size: int = 16
    step_tokens: int = 2048  # max_num_batched_tokens: the longest chunk one step computes

    def peak_tokens(self, prompt_tokens: int, max_tokens: int) -> int:
        """The most tokens' KV a sequence holds at once: all of them, or with windows on
        every layer (blocks behind the window are released after each step) the window,
        one step's chunk (the whole prompt when prompts cannot be chunked) and the two
        partly filled blocks at either end."""
        total = prompt_tokens + max_tokens
        if not self.window:
            return total
        chunk = prompt_tokens if self.max_prompt_tokens is not None else self.step_tokens
        return min(total, self.window + chunk + 2 * self.block_size)


def tokenize(tokenizer, prompt: str | None = None, messages: list[dict] | None = None) -> list[int]:
    """Token ids of a plain prompt, or of chat messages through the chat template."""
    if (prompt is None) == (messages is None):
        raise InvalidRequestError("give exactly one of prompt or messages")
    try:
        if messages is not None:
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return list(ids)
        return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    except Exception as exc:  # template errors, bad content types
        raise InvalidRequestError(f"could not tokenize the request: {exc}") from exc


def new_sequence(
    request_id: str,
    prompt_token_ids: list[int],
    params: SamplingParams,
    limits: RequestLimits,
    *,
    prompt: str | None,
    priority: int,
    tenant: str | None,
    arrival_time: float,
) -> Sequence:
    """The sequence of a new request, or InvalidRequestError saying why it can never run."""
    n = len(prompt_token_ids)
    if n == 0:
        raise InvalidRequestError("the prompt is empty")
    vocab = limits.vocab_size
    if any(not isinstance(t, int) or not 0 <= t < vocab for t in prompt_token_ids):
        raise InvalidRequestError(f"prompt token ids must be integers in [0, {vocab})")
    context = limits.max_model_len
    if n >= context:
        raise InvalidRequestError(
            f"the prompt has {n} tokens; this model's context is {context} "
            "and at least one token must be generated"
        )
    max_tokens = params.max_tokens if params.max_tokens is not None else context - n
    if n + max_tokens > context:
        raise InvalidRequestError(
            f"prompt ({n} tokens) + max_tokens ({max_tokens}) = {n + max_tokens} exceeds the "
            f"context of {context} tokens"
        )
    if limits.peak_tokens(n, max_tokens) > limits.pool_tokens:
        raise InvalidRequestError(
            f"prompt ({n} tokens) + max_tokens ({max_tokens}) needs more KV than the whole "
            f"pool holds ({limits.pool_tokens} tokens)"
        )
    if limits.max_prompt_tokens is not None and n > limits.max_prompt_tokens:
        raise InvalidRequestError(
            f"the prompt has {n} tokens, more than max_num_batched_tokens="
            f"{limits.max_prompt_tokens} with chunked prefill off: no step could run it"
        )
    seq = Sequence(
        request_id=request_id,
        prompt_token_ids=list(prompt_token_ids),
        params=params,
        metrics=RequestMetrics(arrival_time=arrival_time),
        prompt=prompt,
        priority=priority,
        tenant=tenant,
        generator=make_generator(params.seed, limits.device),
        max_tokens=max_tokens,
    )
    if params.n > 1:  # sample 0 prefills; the scheduler forks the others from it
        seq.group_id, seq.group = request_id, SampleGroup(params.n, [seq])
    return seq
