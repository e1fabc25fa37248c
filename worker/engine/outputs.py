"""What the engine hands back: per-request outputs and per-step statistics."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestMetrics:
    """Timeline of one request (``time.time()`` seconds) and how often it was preempted."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    finished_time: float | None = None
    first_step: int | None = None
    last_step: int | None = None
    num_preemptions: int = 0
    num_cached_tokens: int = 0  # prompt tokens its first admission took from the prefix cache


@dataclass
class TokenLogprob:
    """Log-probability of the chosen token and the top-n alternatives at one position."""

    token_id: int
    logprob: float
    top: dict[int, float] = field(default_factory=dict)
    rank: int | None = None  # 1 + how many tokens were likelier (prompt logprobs only)


@dataclass(slots=True)
class RequestOutput:
    """State of one request after a step; ``text`` is final once ``finished`` is True."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    metrics: RequestMetrics
    finished: bool = False
    new_token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that matched
    error: str | None = None
    index: int = 0  # which of the request's n samples this is
    samples: list[RequestOutput] = field(default_factory=list)  # all n samples, when n > 1
    # per prompt token when asked (prompt_logprobs): None for the first, which has no context
    prompt_logprobs: list[TokenLogprob | None] | None = None


@dataclass
class StepStats:
    """One engine step, as the service writes it to the ``iterations`` table."""

    step: int
    num_running: int
    num_waiting: int
    num_prefill_tokens: int  # rows of prompt (or recompute) chunks longer than one
    num_decode_tokens: int  # one-row sequences: attention's decode path (pad rows apart)
    kv_blocks_used: int
    kv_blocks_total: int
    num_preemptions: int
    num_admitted: int
    num_finished: int
    schedule_seconds: float
    forward_seconds: float
    sample_seconds: float
    start_time: float = 0.0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache this step
    kv_tokens: int = 0  # tokens whose K/V sit in allocated blocks after the step
    num_scheduled_seqs: int = 0  # sequences that computed at least one token this step
    num_waiting_before: int = 0  # waiting queue length when the step began
    num_draft_tokens: int = 0  # speculative tokens checked this step
    num_accepted_tokens: int = 0  # of them, accepted
    num_verify_tokens: int = 0  # rows of sequences checking drafts (last token + drafts)
    num_pad_rows: int = 0  # rows of finished static-padded members still holding a slot
    # service classes (Sequence.service_class): interactive sequences running and waiting
    # after the step, and the rows they computed in it; the rest are batch
    num_running_interactive: int = 0
    num_waiting_interactive: int = 0
    num_interactive_tokens: int = 0
    # how long the step's forward was paused between two layers while interjected steps of
    # interactive arrivals ran (LLMEngine.interjected_step; each has its own row); not in
    # forward_seconds, so the rows' times add up to the engine's
    paused_seconds: float = 0.0
    # the rows each request computed in this step (by request id, the samples of an n > 1
    # request summed under it; pad rows are nobody's): the work its time is split by
    # (``worker.engine.step_cost``)
    work: dict[str, int] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        """The step's wall time: schedule, forward and sample."""
        return self.schedule_seconds + self.forward_seconds + self.sample_seconds

    @property
    def num_batched_tokens(self) -> int:
        """All rows the step fed through the model."""
        return self.num_prefill_tokens + self.num_decode_tokens + self.num_verify_tokens + self.num_pad_rows
