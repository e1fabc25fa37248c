"""One request's state inside the engine."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

from worker.engine.ngram_proposer import NgramIndex
from worker.engine.outputs import RequestMetrics, RequestOutput, TokenLogprob
from worker.engine.sampler import make_generator
from worker.protocol.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    """Where a sequence is in its life."""

    WAITING = "waiting"  # not yet admitted, or preempted and waiting to resume
    RUNNING = "running"  # holds KV blocks, scheduled every step
    FINISHED = "finished"


@dataclass(eq=False)
class SampleGroup:
    """The samples of one request with n > 1: sample 0 prefills alone, then the scheduler
    forks the other n - 1 from it (``Sequence.fork_sample``); each member's final output
    waits in ``finished`` until every member has ended."""

    n: int
    members: list[Sequence]  # sample 0 until the fork, then all n
    finished: dict[int, RequestOutput] = field(default_factory=dict)  # by sample index


@dataclass(eq=False)
class Sequence:
    """Prompt and output tokens, KV bookkeeping and sampling state of one request.

    ``num_computed_tokens`` counts tokens whose K/V are in the cache; each step the
    scheduler lets it catch up with ``num_tokens`` (prefill chunks, then one token per
    decode step). A prefix-cache hit or a preemption simply moves it.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    metrics: RequestMetrics
    prompt: str | None = None
    priority: int = 0
    tenant: str | None = None
    # "interactive" | "batch": the queue class the job came from (see Scheduler)
    service_class: str = "interactive"
    generator: torch.Generator | None = None
    status: SequenceStatus = SequenceStatus.WAITING
    token_ids: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    table_row: int | None = None  # its row in BlockManager.tables while it holds blocks
    num_hashed_blocks: int = 0  # full blocks already published to the prefix cache
    block_hash: int | None = None  # hash chain value of the last published block
    logprobs: list[TokenLogprob] | None = None
    # prompt_logprobs asked: one entry per prompt position scored so far (the first: None)
    prompt_logprobs: list[TokenLogprob | None] | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None  # why it was stopped alone (its row could not be sampled)
    text: str | None = None  # final text, set once at finish
    max_tokens: int = 0  # resolved from params and the context limit at add time
    group_id: str | None = None  # the user's request id; set on every sample when n > 1
    group: SampleGroup | None = None  # n > 1: the samples of the request, shared by all
    sample_index: int = 0
    draft_token_ids: list[int] = field(default_factory=list)  # speculative, checked next step
    ngram_index: NgramIndex | None = None  # built on the first draft proposal
    grammar: Any = None  # structured output: its matcher (worker.engine.structured.Grammar)

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)
        if self.params.logprobs is not None:
            self.logprobs = []
        if self.params.prompt_logprobs is not None:
            self.prompt_logprobs = [None]

    @property
    def is_batch(self) -> bool:
        """True for a batch-class sequence (it yields to interactive ones)."""
        return self.service_class == "batch"

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt length."""
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Generated tokens so far."""
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        """True once a stop condition, the length limit or an abort ended it."""
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int, logprob: TokenLogprob | None) -> None:
        """Record a sampled token (its K/V is computed in the next step)."""
        self.token_ids.append(token_id)
        self.output_token_ids.append(token_id)
        if self.logprobs is not None and logprob is not None:
            self.logprobs.append(logprob)

    def fork_sample(self, k: int) -> Sequence:
        """Sample ``k`` of this n > 1 request, made from sample 0 once its prompt is computed:
        same prompt, params and timeline so far, its own generator (seed + k) and grammar
        matcher; the prompt is scored once, by sample 0. Its KV is the caller's to share."""
        seed, m = self.params.seed, self.metrics
        child = Sequence(
            request_id=f"{self.request_id}#sample{k}", prompt_token_ids=self.prompt_token_ids,
            params=self.params, metrics=RequestMetrics(
                arrival_time=m.arrival_time, first_scheduled_time=m.first_scheduled_time,
                first_step=m.first_step, last_step=m.last_step,
            ),
            prompt=self.prompt, priority=self.priority, tenant=self.tenant,
            service_class=self.service_class,
            generator=None if seed is None or self.generator is None
            else make_generator(seed + k, self.generator.device),
            max_tokens=self.max_tokens, group_id=self.group_id, group=self.group, sample_index=k,
        )
        child.grammar = self.grammar.fresh() if self.grammar is not None else None
        child.prompt_logprobs = None
        return child
