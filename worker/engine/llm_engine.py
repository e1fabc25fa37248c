"""The incremental engine: add requests, step, collect outputs. No Redis, no SQL.

``step()`` is schedule -> run -> sample -> update: the scheduler plans the step, the
model runner computes the planned rows, the sampler and the draft verifier pick the
tokens, and ``Scheduler.update_from_output`` appends them, stops and frees what ended;
the request tracker turns that into the step's outputs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import torch

from worker.engine.block_manager import BlockManager
from worker.engine.config import SERVICE_CLASSES, EngineArgs
from worker.engine.model_runner import ModelRunner
from worker.engine.outputs import RequestOutput, StepStats
from worker.engine.prompt_logprobs import record_prompt_logprobs
from worker.engine.request_tracker import RequestTracker
from worker.engine.request_validation import RequestLimits, new_sequence, tokenize
from worker.engine.sampler import Sampler
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import Sequence
from worker.engine.speculation import NgramSpeculator
from worker.engine.step_plan import SchedulerOutput
from worker.engine.step_sampling import sample_step
from worker.engine.step_stats import StepTimer, step_stats
from worker.engine.stopping import StopChecker
from worker.engine.structured import Grammars
from worker.engine.swap import make_swapper
from worker.protocol.sampling_params import InvalidRequestError, SamplingParams

log = logging.getLogger(__name__)


class LLMEngine:
    """Continuous batching over a paged KV pool, one ``step()`` at a time."""

    def __init__(self, args: EngineArgs | None = None, **kwargs: Any) -> None:
        self.args = args = args or EngineArgs(**kwargs)
        self.runner = runner = ModelRunner(args)
        self.model_name, self.tokenizer, self.block_size = args.model, runner.tokenizer, args.block_size
        self.device, self.dtype, self.max_model_len = runner.device, runner.dtype, runner.max_model_len
        self.prepacked, self.load_seconds = runner.prepacked, runner.load_seconds
        self.block_manager = BlockManager(runner.num_blocks, args.block_size, args.enable_prefix_caching,
                                          never_used_last=not runner.kv_pool_committed,
                                          window=runner.spec.max_window,  # 0: nothing slides out
                                          tables=runner.block_tables)
        self.swapper = make_swapper(runner.k_pool, runner.v_pool,
                                    block_size=args.block_size, swap_space=args.swap_space,
                                    min_tokens=args.swap_min_tokens)
        self.scheduler = Scheduler(
            block_manager=self.block_manager, max_num_seqs=args.max_num_seqs,
            stop_checker=StopChecker(tokenizer=self.tokenizer, eos_token_ids=runner.eos_token_ids,
                                     max_model_len=runner.max_model_len),
            max_num_batched_tokens=args.max_num_batched_tokens, policy=args.policy,
            enable_chunked_prefill=args.enable_chunked_prefill, tenant_weights=args.tenant_weights,
            fair_share=args.fair_share,
            swap=self.swapper.manager if self.swapper is not None else None,
            interactive_reserve_seqs=args.interactive_reserve_seqs,
            interactive_reserve_tokens=args.interactive_reserve_tokens,
            interactive_priority=args.interactive_priority,
            interactive_batch_rows=args.interactive_batch_rows,
            interactive_step_ms=args.interactive_step_ms,
            interactive_fast_lane=args.interactive_fast_lane,
        )
        self.sampler = Sampler(eos_token_ids=runner.eos_token_ids, device=runner.device, seed=args.seed)
        self.grammars = Grammars(self.tokenizer, vocab_size=runner.vocab_size,
                                 eos_token_ids=runner.eos_token_ids)
        self.tracker = RequestTracker()
        self.limits = RequestLimits(
            vocab_size=runner.vocab_size, max_model_len=runner.max_model_len,
            pool_tokens=runner.num_blocks * args.block_size, device=runner.device,
            max_prompt_tokens=None if args.enable_chunked_prefill else args.max_num_batched_tokens,
            window=runner.spec.max_window, block_size=args.block_size,
            step_tokens=args.max_num_batched_tokens,
        )
        self.speculator = (
            NgramSpeculator(num_tokens=args.num_speculative_tokens, max_rows=args.speculative_max_rows)
            if args.num_speculative_tokens > 0 else None
        )
        self.step_index = 0
        self.total_draft_tokens = 0  # speculative tokens checked, all steps
        self.total_accepted_tokens = 0  # of them, accepted
        log.info(
            "engine ready: %s on %s/%s, KV pool %d blocks x %d = %d tokens, backend %s, "
            "prepacked weights %s, load %.2fs", args.model, runner.device, runner.dtype,
            runner.num_blocks, args.block_size, runner.num_blocks * args.block_size,
            runner.backend.name, runner.prepacked, runner.load_seconds,
        )

    @property
    def requests(self) -> dict[str, Sequence]:
        """Sequences in the engine by internal id (samples of n > 1 get ``#sampleK``)."""
        return self.tracker.sequences

    # -- requests ---------------------------------------------------------------------
    def tokenize(self, prompt: str | None = None, messages: list[dict] | None = None) -> list[int]:
        """Token ids of a plain prompt, or of chat messages through the chat template."""
        return tokenize(self.tokenizer, prompt=prompt, messages=messages)

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams | None = None,
        *,
        prompt: str | None = None,
        priority: int = 0,
        tenant: str | None = None,
        arrival_time: float | None = None,
        service_class: str = "interactive",
        grammar: Any | None = None,
    ) -> None:
        """Queue a request; refuse at once (InvalidRequestError) one that could never be
        scheduled (see ``request_validation``). ``service_class`` is the queue class:
        "interactive" (the default, as for in-process callers) or "batch", which yields to
        interactive requests (``EngineArgs.interactive_*``). ``grammar``: the
        structured-output grammar compiled already (``self.grammars.compiled``, off this
        thread); None compiles it here, from the cache when it is there."""
        if request_id in self.tracker:
            raise InvalidRequestError(f"request id {request_id!r} is already in the engine")
        if service_class not in SERVICE_CLASSES:
            raise InvalidRequestError(
                f"service_class={service_class!r}: expected one of {SERVICE_CLASSES}")
        seq = new_sequence(
            request_id, prompt_token_ids, params or SamplingParams(), self.limits, prompt=prompt,
            priority=priority, tenant=tenant, arrival_time=arrival_time or time.time(),
        )
        seq.service_class = service_class
        if seq.params.structured is not None:
            seq.grammar = self.grammars.grammar_for(seq.params.structured, grammar)
        self.tracker.add(seq)
        self.scheduler.add(seq)

    def abort_request(self, request_id: str) -> None:
        """Stop a request (all its samples) now and free its KV; the next step reports it
        with reason abort."""
        for seq in self.tracker.unfinished(request_id):
            self.scheduler.finish(seq, "abort")
            self.tracker.aborted.append(seq)

    def has_unfinished_requests(self) -> bool:
        """True while any request waits, runs, or has an abort still to report."""
        return self.scheduler.has_unfinished() or bool(self.tracker.aborted)

    def num_unfinished_requests(self) -> int:
        """Requests waiting or running."""
        return len(self.scheduler.waiting) + len(self.scheduler.running)

    def admission_capacity(self) -> int:
        """How many new requests are worth reading now: free sequence slots not yet claimed
        by waiting requests, and none while free KV cannot hold what already waits."""
        sched = self.scheduler
        slots = sched.max_num_seqs - len(sched.running) - len(sched.padding) - len(sched.waiting)
        waiting_tokens = sum(s.num_tokens - s.num_computed_tokens for s in sched.waiting)
        if waiting_tokens >= self.block_manager.num_free_blocks * self.block_size:
            return 0
        return max(0, slots - sched.reserve_seqs)

    def interactive_capacity(self) -> int:
        """How many new interactive requests are worth reading now: with interactive
        priority they go ahead of (and may preempt) batch work, so only the interactive
        requests already in the engine count against ``max_num_seqs``, and none is worth
        reading while the free KV and the batch sequences' KV cannot hold the interactive
        ones already waiting; without it, as ``admission_capacity``."""
        sched = self.scheduler
        if not sched.interactive_priority:
            return self.admission_capacity()
        waiting = [s for s in sched.waiting if not s.is_batch]
        waiting_tokens = sum(s.num_tokens - s.num_computed_tokens for s in waiting)
        batch_blocks = sum(len(s.block_table) for s in sched.running if s.is_batch)
        if waiting and waiting_tokens >= (self.block_manager.num_free_blocks + batch_blocks) * self.block_size:
            return 0
        present = len(waiting) + sum(1 for s in sched.running if not s.is_batch)
        return max(0, sched.max_num_seqs - present)

    # -- the step ---------------------------------------------------------------------
    def step(self, between_layers: Callable[[], None] | None = None) -> tuple[list[RequestOutput], StepStats]:
        """Schedule, run, sample, update: one forward pass, its tokens, what finished.

        ``between_layers``: when the step is expected to outlast
        ``interactive_interject_ms``, called between every two layers of its forward,
        where it may start newly arrived interactive requests with
        :meth:`interjected_step` (the service loop's hook: ``EngineLoop._interject``), so
        that they wait for one layer of a long batch step, not for the whole of it."""
        step = self._claim_step_index()
        timer = StepTimer(waiting_before=len(self.scheduler.waiting))
        outputs = self.tracker.report_aborted(timer.start)  # aborted since the last step
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)
        plan = self.scheduler.schedule(step, timer.start)
        timer.lap()  # schedule
        pause = self._pause_hook(plan, between_layers, timer)
        return self._finish_step(step, plan, timer, outputs, pause)

    def interjected_step(self) -> tuple[list[RequestOutput], StepStats] | None:
        """A step of interactive arrivals only (their prompts and first tokens), run while
        another step's forward is paused between two layers; None when none can start now
        (no free slot, KV blocks or budget: the next regular step admits them). It plans
        nothing of the paused step's sequences and preempts nothing
        (``Scheduler.schedule_arrivals``), and it writes other KV blocks than the paused
        step, so that step resumes as if nothing had run."""
        timer = StepTimer(waiting_before=len(self.scheduler.waiting))
        plan = self.scheduler.schedule_arrivals(self.step_index, timer.start)
        if plan.is_empty:
            return None
        step = self._claim_step_index()
        timer.lap()  # schedule
        return self._finish_step(step, plan, timer, [], None)

    def _claim_step_index(self) -> int:
        """The next step number (an interjected step takes the one after its paused step's)."""
        self.step_index += 1
        return self.step_index - 1

    def _pause_hook(self, plan: SchedulerOutput, between_layers: Callable[[], None] | None,
                    timer: StepTimer) -> Callable[[], None] | None:
        """``between_layers`` for a step of batch work expected to outlast
        ``interactive_interject_ms`` (from the step-time model; a step is long when there is
        no estimate yet), wrapped so
        that the time it takes is taken off this step's forward (it runs steps of its own);
        None otherwise."""
        limit_s = self.args.interactive_interject_ms / 1000
        if (between_layers is None or not limit_s or not self.scheduler.interactive_priority
                or not any(s.seq.is_batch for s in plan.scheduled)):
            return None  # an arrival may wait for interactive work, never for batch work
        fitted = self.scheduler.step_time.fit()
        rows = sum(s.num_new_tokens for s in plan.scheduled)
        if fitted is not None and fitted[0] + fitted[1] * rows <= limit_s:
            return None

        def pause() -> None:
            started = time.perf_counter()
            between_layers()
            timer.pause(time.perf_counter() - started)
        return pause

    def _finish_step(self, step: int, plan: SchedulerOutput, timer: StepTimer, outputs: list[RequestOutput],
                     pause: Callable[[], None] | None) -> tuple[list[RequestOutput], StepStats]:
        """Run, sample and update a scheduled ``plan``; its outputs after ``outputs``."""
        logits = self._run(plan, pause)
        timer.lap()  # forward
        forks = self.scheduler.fork(plan)  # n > 1: the other samples of the prompts just run
        sampled = sample_step(plan, logits, self.sampler, forks)
        appended = self.scheduler.update_from_output(plan, sampled)
        outputs += self.tracker.outputs(appended, time.time())
        timer.lap()  # sample
        return outputs, self._count(step, plan, outputs, timer, sampled.num_accepted)

    def _run(self, plan: SchedulerOutput, pause: Callable[[], None] | None = None) -> torch.Tensor | None:
        """The block copies the plan needs, then its forward (``pause`` between its layers):
        logits ``[rows, vocab]`` laid out as ``plan.logits_rows`` (None when nothing runs);
        the prompt logprobs asked for are recorded from them."""
        self.runner.copy_blocks(plan.block_copies)  # copy-on-write, before anything writes
        if self.swapper is not None:
            self.swapper.apply()  # swapped KV out to the host and back, before the forward
        if plan.is_empty:
            return None
        logits = self.runner.execute(plan, pause)
        if plan.logits_rows.prompt_rows:
            record_prompt_logprobs(plan, logits)
        return logits

    def _count(self, step: int, plan: SchedulerOutput, outputs: list[RequestOutput], timer: StepTimer,
               num_accepted: int) -> StepStats:
        """Step ``step``'s StepStats; the draft counters move on."""
        stats = step_stats(step, plan, self.scheduler, outputs, timer, num_accepted)
        self.scheduler.record_step_time(plan, stats.seconds)
        self.total_draft_tokens += stats.num_draft_tokens
        self.total_accepted_tokens += num_accepted
        return stats
