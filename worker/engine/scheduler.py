"""Iteration-level scheduling under one token budget.

Each step: running sequences first (a decode token each, or the next prefill chunk of a
partially prefilled one), then admission of waiting sequences while blocks, sequence
slots and the step's token budget allow. ``num_computed_tokens`` catching up with
``num_tokens`` is the only rule: chunked prefill, prefix-cache hits and resumption after
preemption all fall out of it. When a running sequence cannot get a block, the newest
(or lowest-priority) running sequence is preempted by recompute.

The ``static`` policy reproduces request-level batching: a cohort is admitted only when
nothing runs, and runs until its longest member ends.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from worker.engine.block_manager import BlockManager
from worker.engine.sequence import Sequence, SequenceStatus
from worker.engine.swap import SwapManager

SHIELD_AFTER_PREEMPTIONS = 3


@dataclass
class ScheduledSequence:
    """A sequence in this step and how many of its tokens it computes now."""

    seq: Sequence
    num_new_tokens: int  # includes the draft tokens
    num_draft_tokens: int = 0  # speculative tokens after the last sampled one

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the sequence's last token, so a token is sampled."""
        real = self.num_new_tokens - self.num_draft_tokens
        return self.seq.num_computed_tokens + real == self.seq.num_tokens


@dataclass
class SchedulerOutput:
    """One step's plan: decodes first, then prefill chunks."""

    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    num_admitted: int = 0
    num_cached_tokens: int = 0
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) KV copies

    @property
    def num_decode_tokens(self) -> int:
        """Tokens of decoding sequences: one each, plus their drafts."""
        return sum(s.num_new_tokens for s in self.scheduled if s.num_new_tokens - s.num_draft_tokens == 1)

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens of prompt (or recompute) chunks longer than one."""
        return sum(s.num_new_tokens for s in self.scheduled if s.num_new_tokens - s.num_draft_tokens > 1)

    @property
    def num_draft_tokens(self) -> int:
        """Speculative tokens checked this step."""
        return sum(s.num_draft_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        """Nothing to run."""
        return not self.scheduled


class Scheduler:
    """Decides, every step, which sequences run and how many tokens each computes."""

    def __init__(
        self,
        *,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        policy: str = "fcfs",
        enable_chunked_prefill: bool = True,
        tenant_weights: dict[str, float] | None = None,
        swap: SwapManager | None = None,
    ) -> None:
        self.block_manager = block_manager
        self.swap = swap  # swap preemption (worker/engine/swap.py); None: recompute only
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        self.enable_chunked_prefill = enable_chunked_prefill
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.served_tokens: dict[str | None, float] = {}  # weighted, per tenant (fair policy)
        self.tenant_weights = tenant_weights or {}
        self.total_preemptions = 0
        self._cohort_open = True  # static policy: the cohort still takes members

    # -- queue management -------------------------------------------------------------
    def add_running(self, seq: Sequence) -> None:
        """Enter a sequence that already holds its KV (a forked sample) straight into running."""
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence."""
        if self.policy == "fair" and not self._tenant_active(seq.tenant):
            # A tenant returning from idle starts at the least-served active tenant's count,
            # so idle time does not bank credit that would starve the others later.
            active = [self.served_tokens.get(s.tenant, 0.0) for s in (*self.waiting, *self.running)]
            floor = min(active, default=0.0)
            self.served_tokens[seq.tenant] = max(self.served_tokens.get(seq.tenant, 0.0), floor)
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def _tenant_active(self, tenant: str | None) -> bool:
        return any(s.tenant == tenant for s in (*self.waiting, *self.running))

    def has_unfinished(self) -> bool:
        """True while anything waits or runs."""
        return bool(self.waiting or self.running)

    def remove(self, seq: Sequence, *, keep_cached: bool = True) -> None:
        """Take a finished or aborted sequence out and free its blocks at once."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq, keep_cached=keep_cached)
        if self.swap is not None:
            self.swap.discard(seq)
        seq.status = SequenceStatus.FINISHED

    # -- the step ---------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """Plan one step within the token budget (see the module docstring)."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        budget = self._schedule_running(out, budget)
        # After a preemption nothing new fits, except under the priority policy, where a
        # waiting request that outranks a runner may still take its place.
        if (not out.preempted or self.policy == "priority") and self._may_admit():
            stopped_by = self._admit_waiting(out, budget)
            if self.policy == "static" and stopped_by != "budget":
                self._cohort_open = False  # full, out of blocks, or nothing left to admit
        # Decodes first: the model runs decode attention on the leading one-token rows.
        out.scheduled.sort(key=lambda s: s.num_new_tokens != 1)
        for s in out.scheduled:
            tenant = s.seq.tenant
            weight = self.tenant_weights.get(tenant, 1.0) if tenant is not None else 1.0
            self.served_tokens[tenant] = self.served_tokens.get(tenant, 0.0) + s.num_new_tokens / weight
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        bm = self.block_manager
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            uncomputed = seq.num_tokens - seq.num_computed_tokens
            num_new = min(uncomputed + len(seq.draft_token_ids), budget)
            target = seq.num_computed_tokens + num_new
            if seq.draft_token_ids and not bm.can_grow(seq, target):
                num_new = min(uncomputed, budget)  # guesses never cost another's KV
                target = seq.num_computed_tokens + num_new
            del seq.draft_token_ids[max(0, num_new - uncomputed):]  # drafts that fit
            while not bm.can_grow(seq, target):
                victim = self._pick_victim()
                if self.running.index(victim) < i:  # already planned this step: give back
                    i -= 1
                    budget += self._preempt(victim, out)
                else:
                    self._preempt(victim, out)
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                break  # it preempted itself: every later one is already gone too
            if bm.needs_copy_on_write(seq):
                out.block_copies.append(bm.copy_on_write(seq))
            bm.grow(seq, target)
            out.scheduled.append(ScheduledSequence(seq, num_new, len(seq.draft_token_ids)))
            budget -= num_new
            i += 1
        return budget

    def _may_admit(self) -> bool:
        if self.policy == "static":
            if not self.running:
                self._cohort_open = True  # the previous cohort is done: form the next one
            return self._cohort_open
        return True

    def _admit_waiting(self, out: SchedulerOutput, budget: int) -> str:
        """Admit waiting sequences; return what stopped admission."""
        bm = self.block_manager
        while True:
            if not self.waiting:
                return "empty"
            if budget <= 0:
                return "budget"
            seq = self._next_waiting()
            if len(self.running) >= self.max_num_seqs:
                if self._preempt_lower_priority(seq, out):
                    continue
                return "slots"
            hits = bm.match_prefix(seq) if seq.num_computed_tokens == 0 and not seq.block_table else []
            computed = len(hits) * bm.block_size if hits else seq.num_computed_tokens
            remaining = seq.num_tokens - computed
            if remaining > budget and not self.enable_chunked_prefill:
                return "budget"
            num_new = min(remaining, budget)
            revived = sum(1 for b in hits if bm.ref_counts[b] == 0)
            needed = bm.blocks_needed(computed + num_new) - len(hits) - len(seq.block_table)
            if needed + revived > bm.num_free_blocks:
                if self._preempt_lower_priority(seq, out):
                    budget = self.max_num_batched_tokens - sum(s.num_new_tokens for s in out.scheduled)
                    continue
                return "blocks"
            self.waiting.remove(seq)
            if hits:
                bm.take_cached(seq, hits)
                out.num_cached_tokens += len(hits) * bm.block_size
            bm.grow(seq, computed + num_new)
            if self.swap is not None:
                self.swap.swap_in(seq)  # its swapped KV is copied into the new blocks
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            out.scheduled.append(ScheduledSequence(seq, num_new))
            out.num_admitted += 1
            budget -= num_new

    def _next_waiting(self) -> Sequence:
        """The waiting sequence the policy serves next."""
        if self.policy in ("fcfs", "static"):
            return self.waiting[0]
        if self.policy == "priority":
            return max(self.waiting, key=lambda s: (s.priority, s.metrics.num_preemptions, -s.metrics.arrival_time))
        if self.policy == "sjf":
            return min(self.waiting, key=lambda s: (-s.metrics.num_preemptions, s.max_tokens, s.metrics.arrival_time))
        # fair: the tenant served least so far goes next; FCFS within a tenant.
        return min(
            self.waiting,
            key=lambda s: (-s.metrics.num_preemptions, self.served_tokens.get(s.tenant, 0), s.metrics.arrival_time),
        )

    def _pick_victim(self) -> Sequence:
        """The running sequence to preempt: lowest priority, then latest arrived.

        A sequence already preempted ``SHIELD_AFTER_PREEMPTIONS`` times is taken only
        when nothing else runs, so it cannot starve.
        """
        by_priority = self.policy == "priority"
        return min(
            self.running,
            key=lambda s: (
                s.metrics.num_preemptions >= SHIELD_AFTER_PREEMPTIONS,
                s.priority if by_priority else 0,
                -s.metrics.arrival_time,
            ),
        )

    def _preempt_lower_priority(self, incoming: Sequence, out: SchedulerOutput) -> bool:
        """Priority policy: make room for ``incoming`` by preempting a lower-priority runner."""
        if self.policy != "priority" or not self.running:
            return False
        victim = self._pick_victim()
        if victim.priority >= incoming.priority:
            return False
        self._preempt(victim, out)
        self.waiting.remove(victim)
        self.waiting.append(victim)  # behind the incoming one, which outranks it
        return True

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> int:
        """Free ``seq``'s blocks, requeue it first (its KV swapped out to the host, or to be
        recomputed); return its planned tokens."""
        self.running.remove(seq)
        swapped = self.swap is not None and self.swap.swap_out(seq)
        self.block_manager.free(seq)
        if not swapped:
            seq.num_computed_tokens = 0
        seq.draft_token_ids = []
        seq.status = SequenceStatus.WAITING
        seq.metrics.num_preemptions += 1
        self.total_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        planned = sum(s.num_new_tokens for s in out.scheduled if s.seq is seq)
        out.scheduled = [s for s in out.scheduled if s.seq is not seq]
        return planned
