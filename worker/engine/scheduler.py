"""The scheduler: the engine's queues and the two calls of a step around the forward.

``schedule()`` plans the step: running sequences first, then admission of waiting ones
within the sequence slots, the KV blocks and the token budget, preempting when blocks
run out (``admission.py``). The plan lists decodes first (see ``step_plan``).

``update_from_output(plan, sampled)``, after the forward (as vLLM V1's): computed tokens
advance, sampled tokens are appended, and the stop checker decides after each one whether
the sequence ends. ``finish`` is the one place a sequence ends (a stop, a length limit,
an abort, a row the sampler refused): its final text is set and its blocks are freed in
the same step. On a model whose every layer has a sliding window, the blocks that slid
out of the window of a sequence still running are released there too
(``BlockManager.release_out_of_window``).

A request with n > 1 runs one sequence until its prompt is computed; ``fork`` then makes
the other n - 1 samples, which share its blocks by reference count (copy-on-write on the
partial last block) and draw their first token from its logits row in the same step.
"""

from __future__ import annotations

from collections import deque
from itertools import chain

from worker.engine import speculation
from worker.engine.admission import COHORT_POLICIES, Admission
from worker.engine.block_manager import BlockManager
from worker.engine.scheduling_policy import SHIELD_AFTER_PREEMPTIONS, TenantLedger
from worker.engine.sequence import Sequence, SequenceStatus
from worker.engine.step_plan import Appended, SampledStep, ScheduledSequence, SchedulerOutput
from worker.engine.step_time_model import StepTimeModel
from worker.engine.stopping import StopChecker
from worker.engine.swap import SwapManager

__all__ = ["SHIELD_AFTER_PREEMPTIONS", "ScheduledSequence", "Scheduler", "SchedulerOutput"]


class Scheduler(Admission):
    """Decides, every step, which sequences run and how many tokens each computes, and
    applies what the step gave them."""

    def __init__(
        self,
        *,
        block_manager: BlockManager,
        stop_checker: StopChecker,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        policy: str = "fcfs",
        enable_chunked_prefill: bool = True,
        tenant_weights: dict[str, float] | None = None,
        fair_share: str = "tokens",
        swap: SwapManager | None = None,
        interactive_reserve_seqs: int = 0,
        interactive_reserve_tokens: int = 0,
        interactive_priority: bool = False,
        interactive_batch_rows: int = 0,
        interactive_step_ms: float = 0.0,
        interactive_fast_lane: bool = False,
    ) -> None:
        self.block_manager = block_manager
        self.stop_checker = stop_checker
        self.swap = swap
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.padding: list[Sequence] = []
        self.unforked: set[Sequence] = set()  # first samples of n > 1 requests not yet forked
        self.ledger = TenantLedger(tenant_weights, unit=fair_share)
        self.cohort_open = True
        classes = policy not in COHORT_POLICIES  # a cohort is formed and run whole
        # batch admission leaves these free; batch keeps at least three quarters of each
        self.reserve_seqs = min(interactive_reserve_seqs, max_num_seqs // 4) if classes else 0
        self.reserve_tokens = min(interactive_reserve_tokens, max_num_batched_tokens // 4) if classes else 0
        # and KV blocks for that many tokens, so that an arrival starts without preempting
        # (between two layers of a step, where nothing can be preempted: interjected
        # steps); never so many that a sequence of max_model_len tokens could not run alone
        longest = block_manager.blocks_needed(stop_checker.max_model_len)
        self.reserve_blocks = max(0, min(block_manager.blocks_needed(self.reserve_tokens),
                                         block_manager.num_blocks - longest))
        self.interactive_priority = interactive_priority and classes
        self.interactive_batch_rows = interactive_batch_rows if classes else 0
        self.interactive_step_s = interactive_step_ms / 1000 if classes else 0.0
        self.step_time = StepTimeModel()  # what a step of so many rows takes here, lately
        # arrivals are admitted ahead of batch work only under interactive priority
        self.interactive_fast_lane = interactive_fast_lane and self.interactive_priority
        self.fast_lane_last = False  # whether the last step planned was a fast-lane step
        self.batch_turn = 0  # where the batch runners' turns start in the next capped step

    # -- queues -----------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a new sequence."""
        if self.policy == "fair":
            self.ledger.on_arrival(seq.tenant, (*self.waiting, *self.running))
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)
        if seq.group is not None:
            self.unforked.add(seq)

    def has_unfinished(self) -> bool:
        """True while anything waits or runs."""
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence, *, keep_cached: bool = True) -> None:
        """Take a sequence out of the queues and free its blocks at once."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq, keep_cached=keep_cached)
        if self.swap is not None:
            self.swap.discard(seq)
        seq.status = SequenceStatus.FINISHED
        self._end_drained_cohort()

    def finish(
        self, seq: Sequence, reason: str, *, stop_reason: str | int | None = None,
        text: str | None = None, error: str | None = None,
    ) -> None:
        """End ``seq``, the one place a sequence ends: ``reason`` "stop" or "length" (its
        stop check), or "abort" (aborted, or its row could not be sampled: ``error``). Its
        final text is ``text`` (a stop string's cut) or its output decoded; its blocks are
        freed now, an aborted one's dropped from the prefix cache, except that under
        ``static-padded`` a member that stopped keeps its slot and blocks as padding until
        the cohort ends. A first sample that ends before its fork ends its request alone."""
        seq.finish_reason, seq.stop_reason, seq.error = reason, stop_reason, error
        seq.text = text if text is not None else self.stop_checker.final_text(seq.output_token_ids, seq.params)
        if seq.group is not None:
            self.unforked.discard(seq)
        if reason == "abort" or self.policy != "static-padded":
            self.remove(seq, keep_cached=reason != "abort")
            return
        self.running.remove(seq)
        seq.status = SequenceStatus.FINISHED
        self.padding.append(seq)

    # -- the step ---------------------------------------------------------------------
    def schedule(self, step: int, now: float) -> SchedulerOutput:
        """Plan one step within the token budget (see ``admission``); stamp the sequences
        that run in it with step number ``step`` (and ``now``, the first time)."""
        out = SchedulerOutput()
        budget, batch_room = self._schedule_running(out, self.max_num_batched_tokens)
        budget = self._schedule_padding(out, budget)
        # After a preemption nothing new fits, except under the priority policy, where a
        # waiting request that outranks a runner may still take its place.
        if (
            not out.preempted or self.policy == "priority" or self._interactive_waiting()
        ) and self._may_admit():
            stopped_by = self._admit_waiting(out, budget, batch_room)
            if self.policy in COHORT_POLICIES and stopped_by != "budget":
                self.cohort_open = False  # full, out of blocks, or nothing left to admit
        decodes = [s for s in out.scheduled if s.num_new_tokens == 1]
        if len(decodes) < len(out.scheduled):  # decodes first, each kind in its order
            out.scheduled = decodes + [s for s in out.scheduled if s.num_new_tokens != 1]
        self._stamp(out, step, now)
        return out

    def schedule_arrivals(self, step: int, now: float) -> SchedulerOutput:
        """Plan a step of interactive arrivals only, while another step's forward is
        paused between two layers (``LLMEngine.interjected_step``): the interactive requests
        never scheduled yet, each prompt whole, within the free slots, the free KV blocks
        and the token budget. Nothing is preempted and no running sequence is planned: the
        paused step holds their blocks and computes their rows. Empty without interactive
        priority (only then do arrivals go ahead of batch work)."""
        out = SchedulerOutput()
        if self.interactive_priority:
            self._admit_arrivals(out)
        self._stamp(out, step, now)
        return out

    def _stamp(self, out: SchedulerOutput, step: int, now: float) -> None:
        """Charge the planned rows to their tenants; stamp the sequences that run in step
        ``step`` (and ``now``, the first time)."""
        rows = out.tenant_rows
        for s in out.scheduled:
            tenant = s.seq.tenant
            if s.is_pad:
                self.ledger.charge(tenant, s.num_new_tokens)  # charged, but not the tenant's work
                continue
            rows[tenant] = rows.get(tenant, 0) + s.num_new_tokens
            metrics = s.seq.metrics
            if metrics.first_scheduled_time is None:
                metrics.first_scheduled_time, metrics.first_step = now, step
            metrics.last_step = step
        for tenant, num_rows in rows.items():
            self.ledger.charge(tenant, num_rows)

    def record_step_time(self, plan: SchedulerOutput, seconds: float) -> None:
        """A step's wall time: learnt by the step-time model (the interactive step budget)
        and, under an engine-seconds ledger, charged to the tenants of its rows (a token
        ledger was charged as the step was planned)."""
        rows = plan.tenant_rows
        self.step_time.observe(sum(rows.values()), seconds)
        self.ledger.charge_step(seconds, rows)

    def fork(self, plan: SchedulerOutput) -> list[tuple[Sequence, int]]:
        """Fork the other samples of each n > 1 request whose prompt this step computed:
        they share its blocks by reference count and run from the next step. Returns each
        new sample with the logits row of its first sample, to draw its first token from."""
        if not self.unforked:
            return []
        forks: list[tuple[Sequence, int]] = []
        for s, row in plan.logits_rows.owners:
            leader, group = s.seq, s.seq.group
            if group is None or leader not in self.unforked:
                continue
            self.unforked.discard(leader)
            for k in range(1, group.n):
                child = leader.fork_sample(k)
                self.block_manager.fork(leader, child)
                child.num_computed_tokens = s.start + s.num_real_tokens  # the leader's, after this step
                child.status = SequenceStatus.RUNNING
                self.running.append(child)
                group.members.append(child)
                forks.append((child, row))
        return forks

    def update_from_output(self, plan: SchedulerOutput, sampled: SampledStep) -> list[Appended]:
        """Apply a step's results: advance computed tokens, append the sampled tokens, end
        what stops, fail the rows the sampler refused, and free what ended. Returns what
        each sequence appended and whether it ended, the failed ones last."""
        bm = self.block_manager
        publish, bs = bm.publish_full_blocks, bm.block_size
        for s in plan.scheduled:
            if not s.is_pad:  # drafts count as computed only once accepted (below)
                seq = s.seq
                computed = seq.num_computed_tokens = s.start + s.num_new_tokens - s.num_draft_tokens
                if computed // bs > seq.num_hashed_blocks:  # a block filled up
                    publish(seq)
        results: list[Appended] = []
        decide = self.stop_checker.decide
        for seq, token, logprob in zip(sampled.seqs, sampled.token_ids, sampled.logprobs, strict=True):
            seq.append_token(token, logprob)
            stop = decide(seq)
            if stop is not None:
                self.finish(seq, stop[0], stop_reason=stop[1], text=stop[2])
            results.append(Appended(seq, [token], stop is not None))
        for entry in sampled.tokens:
            seq = entry.seq
            new_tokens: list[int] = []
            stop = None
            for token, logprob in entry.tokens:
                seq.append_token(token, logprob)
                new_tokens.append(token)
                stop = self.stop_checker.decide(seq)
                if stop is not None:
                    break
            if stop is not None:
                self.finish(seq, stop[0], stop_reason=stop[1], text=stop[2])
            elif entry.num_drafts:
                speculation.settle_accepted(seq, len(entry.tokens))
                bm.publish_full_blocks(seq)
            results.append(Appended(seq, new_tokens, stop is not None))
        if bm.window:  # after publishing, so released blocks are findable in the cache
            for seq in chain((s.seq for s in plan.scheduled), sampled.appending):
                # running only: a static-padded pad row re-reads one position back
                if seq.status is SequenceStatus.RUNNING:
                    bm.release_out_of_window(seq)
        self._end_drained_cohort()
        for seq, error in sampled.failed:
            self.finish(seq, "abort", error=error)
            results.append(Appended(seq, [], True))
        return results
