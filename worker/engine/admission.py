"""Planning one step (the ``schedule`` half of :class:`~worker.engine.scheduler.Scheduler`):
running sequences first, then admission of waiting ones, and preemption when blocks run out.

Running sequences are planned first: a decode token each, the next prefill chunk of a
partially prefilled one, or a token plus its drafts. When one cannot get a block, the
newest (or lowest-priority) running sequence is preempted: its KV swapped to the host or
dropped to be recomputed (``swap``), and it waits first in line. Waiting sequences are then
admitted while KV blocks, sequence slots and the step's token budget allow: the query rows
of all scheduled sequences add up to at most ``max_num_batched_tokens``.
``num_computed_tokens`` catching up with ``num_tokens`` is the only rule: chunked prefill,
prefix-cache hits and resumption after preemption all fall out of it.

Interactive and batch requests (``Sequence.service_class``; every non-cohort policy):
batch admission stops ``interactive_reserve_seqs`` slots short of ``max_num_seqs`` and
``interactive_reserve_tokens`` short of the step budget (a running batch prompt's next
chunk too), and batch work leaves the KV blocks of that many tokens free (a batch runner
that would take them preempts batch work instead), so an interactive arrival always
finds room. With ``interactive_priority``
waiting interactive requests are admitted before any batch one (the policy orders each
class), and one that finds the slots or KV blocks full preempts the lowest-value batch
runner (``pick_victim`` among batch sequences; swapped or recomputed as any preemption)
so it starts in the same step; a runner that cannot grow preempts batch runners first.
While an interactive sequence runs or waits, a step computes only the rows of batch work
that fit in ``interactive_step_s`` (what a step of so many rows takes is learnt from the
recent steps: ``step_time_model``) and at most ``interactive_batch_rows``, the batch
runners taking turns (each advancing every few steps), so the step an interactive request
waits on, and the one computing its prompt, stay short. With ``interactive_fast_lane`` the
step that admits a newly arrived interactive request computes no batch rows at all (never
two such steps in a row), so its prompt waits on a step of interactive work only.

The ``static`` policy reproduces request-level batching: a cohort is admitted only when
nothing runs, and runs until its longest member ends. ``static-padded`` is the same
cohort in lockstep, as Hugging Face ``generate`` runs a batch: a finished member keeps
its slot and its blocks and computes a pad row every step until the whole cohort ends.
"""

from __future__ import annotations

from collections import deque
from itertools import chain

from worker.engine import speculation
from worker.engine.block_manager import BlockManager
from worker.engine.scheduling_policy import TenantLedger, next_waiting, pick_victim
from worker.engine.sequence import Sequence, SequenceStatus
from worker.engine.step_plan import ScheduledSequence, SchedulerOutput
from worker.engine.step_time_model import StepTimeModel
from worker.engine.swap import SwapManager

COHORT_POLICIES = ("static", "static-padded")
MIN_CAPPED_BATCH_ROWS = 4  # a step capped for interactive work still advances the batch


class Admission:
    """Who runs in a step, and who gives way: mixed into ``Scheduler``, which sets the
    state below."""

    block_manager: BlockManager
    swap: SwapManager | None  # swap preemption (worker/engine/swap.py); None: recompute only
    max_num_seqs: int
    max_num_batched_tokens: int
    policy: str
    enable_chunked_prefill: bool
    waiting: deque[Sequence]
    running: list[Sequence]
    padding: list[Sequence]  # static-padded: finished members still in their slot
    ledger: TenantLedger
    reserve_seqs: int  # batch admission leaves these slots free
    reserve_tokens: int  # and these tokens of the step budget
    reserve_blocks: int  # batch work leaves these KV blocks free
    interactive_priority: bool
    interactive_batch_rows: int  # at most these batch rows per step while interactive work is present
    interactive_step_s: float  # and those that fit in a step of this length (0: no such bound)
    step_time: StepTimeModel  # what a step of so many rows takes, from the recent ones
    interactive_fast_lane: bool  # no batch rows in a step that admits an interactive arrival
    fast_lane_last: bool  # the last step planned was such a step
    batch_turn: int  # the batch runner that goes first in the next capped step
    cohort_open: bool  # static policies: the cohort still takes members

    def _end_drained_cohort(self) -> None:
        """Static-padded: once no member runs, the padding rows end and free their blocks."""
        if self.padding and not self.running:
            for seq in self.padding:
                self.block_manager.free(seq)
            self.padding = []

    def _batch_cap(self) -> int | None:
        """Rows of batch work the step being planned may compute (None: no cap): none in a
        fast-lane step (:meth:`_fast_lane`); while an interactive sequence runs or waits,
        those that fit in ``interactive_step_s`` beside the interactive rows (at least
        ``MIN_CAPPED_BATCH_ROWS``, so the batch goes on) and at most
        ``interactive_batch_rows``; else no cap."""
        self.fast_lane_last = self._fast_lane()
        if self.fast_lane_last:
            return 0
        if not (self.interactive_batch_rows or self.interactive_step_s):
            return None
        interactive = [s for s in chain(self.running, self.waiting) if not s.is_batch]
        if not interactive:
            return None
        caps = [self.interactive_batch_rows] if self.interactive_batch_rows else []
        fitting = self.step_time.rows_within(self.interactive_step_s) if self.interactive_step_s else None
        if fitting is not None:
            interactive_rows = sum(1 for s in interactive if s.status is SequenceStatus.RUNNING)
            caps.append(max(MIN_CAPPED_BATCH_ROWS, fitting - interactive_rows))
        return min(caps) if caps else None

    def _fast_lane(self) -> bool:
        """Whether this step computes interactive work only: a newly arrived interactive
        request waits (admitted first under interactive priority) and the last step was not
        such a step. Its time to first token is then the step in progress when it arrived
        plus a step of interactive rows, not plus a step of batch rows too; the batch loses
        one short step per arrival, and at least every other step is its own."""
        return (self.interactive_fast_lane and not self.fast_lane_last
                and any(not s.is_batch and s.num_computed_tokens == 0 for s in self.waiting))

    def _batch_turns(self, cap: int) -> set[Sequence]:
        """The batch runners left out of a step capped at ``cap`` batch rows: they take
        turns, the next step starting after the last one this step runs."""
        batch = [s for s in self.running if s.is_batch]
        if len(batch) <= cap:
            return set()
        start = self.batch_turn % len(batch)
        order = batch[start:] + batch[:start]
        self.batch_turn = start + cap
        return set(order[cap:])

    def _schedule_running(self, out: SchedulerOutput, budget: int) -> tuple[int, int | None]:
        """Plan the running sequences within ``budget`` rows; returns the budget left and
        the rows of batch work the step may still take (None: no cap, see _batch_cap)."""
        bm = self.block_manager
        cap = self._batch_cap()
        left_out = self._batch_turns(cap) if cap is not None else set()
        batch_rows = 0
        i = 0
        if cap is None:  # the leading plain decodes, planned as such (one row each)
            plain = self._plain_decode
            for seq in self.running[:budget]:
                if not plain(seq):
                    break
                out.scheduled.append(ScheduledSequence.decode(seq))
                i += 1
            budget -= i
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if cap is None and self._plain_decode(seq):
                out.scheduled.append(ScheduledSequence.decode(seq))
                budget -= 1
                i += 1
                continue
            if seq in left_out or (cap is not None and seq.is_batch and batch_rows >= cap):
                i += 1  # its turn comes in a later step
                continue
            room = budget
            if seq.is_batch and self.reserve_tokens and seq.num_tokens - seq.num_computed_tokens > 1:
                room = budget - self.reserve_tokens  # a batch prompt chunk leaves the reserve
                if room <= 0:
                    i += 1
                    continue
            if cap is not None and seq.is_batch:
                room = min(room, cap - batch_rows)
            num_new = speculation.fit_drafts(seq, room, bm)
            target = seq.num_computed_tokens + num_new
            while not bm.can_grow(seq, target, self._kept_free(seq)):
                victim = self._victim()
                if self.running.index(victim) < i:  # already planned this step: give back
                    i -= 1
                    given_back = self._preempt(victim, out)
                    budget += given_back
                    if victim.is_batch:
                        batch_rows -= given_back
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
            if seq.is_batch:
                batch_rows += num_new
            i += 1
        return budget, None if cap is None else max(0, cap - batch_rows)

    def _plain_decode(self, seq: Sequence) -> bool:
        """Whether running ``seq`` computes just its newest token this step in a block of
        its own that has room for it: no drafts, no new block, no copy-on-write, and (a
        batch sequence) the interactive reserve of blocks still free. The general path
        would plan it the same (one row, nothing to grow or copy); this one is shorter."""
        computed = seq.num_computed_tokens
        if seq.draft_token_ids or computed + 1 != len(seq.token_ids):
            return False
        table = seq.block_table
        index = computed // self.block_manager.block_size
        if index >= len(table) or self.block_manager.ref_counts[table[index]] != 1:
            return False
        return not (self.reserve_blocks and seq.is_batch
                    and self.block_manager.num_free_blocks < self.reserve_blocks)

    def _schedule_padding(self, out: SchedulerOutput, budget: int) -> int:
        """Static-padded: one pad row per finished member, inside the token budget."""
        num_pads = min(len(self.padding), max(0, budget))
        for seq in self.padding[:num_pads]:
            out.scheduled.append(ScheduledSequence(seq, 1, is_pad=True))
        return budget - num_pads

    def _kept_free(self, seq: Sequence) -> int:
        """KV blocks ``seq`` must leave free: the interactive reserve, for batch work."""
        return self.reserve_blocks if seq.is_batch else 0

    def _interactive_waiting(self) -> bool:
        return self.interactive_priority and any(not s.is_batch for s in self.waiting)

    def _victim(self) -> Sequence:
        """The runner to preempt: a batch one first when interactive requests have priority."""
        batch = [s for s in self.running if s.is_batch] if self.interactive_priority else []
        return pick_victim(self.policy, batch or self.running)

    def _next_waiting(self) -> Sequence:
        """The policy's next waiting sequence; interactive ones first under priority."""
        if self.interactive_priority:
            interactive = [s for s in self.waiting if not s.is_batch]
            if interactive:
                return next_waiting(self.policy, interactive, self.ledger)
        return next_waiting(self.policy, self.waiting, self.ledger)

    def _may_admit(self) -> bool:
        if self.policy in COHORT_POLICIES:
            if not self.running:
                self._end_drained_cohort()
                self.cohort_open = True  # the previous cohort is done: form the next one
            return self.cohort_open
        return True

    def _admit_waiting(self, out: SchedulerOutput, budget: int, batch_room: int | None) -> str:
        """Admit waiting sequences (batch ones within ``batch_room`` rows, None: no cap);
        return what stopped admission."""
        bm = self.block_manager
        while True:
            if not self.waiting:
                return "empty"
            if budget <= 0:
                return "budget"
            seq = self._next_waiting()
            if seq.is_batch and out.preempted and self.policy != "priority":
                return "blocks"  # only interactive requests are admitted after a preemption
            reserve_seqs = self.reserve_seqs if seq.is_batch else 0
            if len(self.running) + len(self.padding) >= self.max_num_seqs - reserve_seqs:
                if self._preempt_lower_priority(seq, out):
                    budget = self.max_num_batched_tokens - sum(s.num_new_tokens for s in out.scheduled)
                    continue
                return "slots"
            # a prompt to score is computed whole: cached blocks would skip its rows
            fresh = seq.num_computed_tokens == 0 and not seq.block_table
            hits = bm.match_prefix(seq) if fresh and seq.prompt_logprobs is None else []
            computed = len(hits) * bm.block_size if hits else seq.num_computed_tokens
            remaining = seq.num_tokens - computed
            room = budget - self.reserve_tokens if seq.is_batch else budget
            if not self.enable_chunked_prefill and remaining > self.max_num_batched_tokens - self.reserve_tokens:
                room = budget  # a whole prompt the reserve would never let in
            if seq.is_batch and batch_room is not None:
                room = min(room, batch_room)  # interactive work present: short steps
            if room <= 0:
                return "budget"
            # Without chunked prefill a prompt waits for a step with room for all of it.
            # Longer ones are refused at add_request; a recompute after preemption that
            # has outgrown the budget is chunked, since no step could ever take it whole.
            if not self.enable_chunked_prefill and room < remaining <= self.max_num_batched_tokens:
                return "budget"
            num_new = min(remaining, room)
            revived = sum(1 for b in hits if bm.ref_counts[b] == 0)
            needed = bm.blocks_needed(computed + num_new) - len(hits) - len(seq.block_table)
            if needed + revived > bm.num_free_blocks - self._kept_free(seq):
                if self._preempt_lower_priority(seq, out):
                    budget = self.max_num_batched_tokens - sum(s.num_new_tokens for s in out.scheduled)
                    continue
                return "blocks"
            self._start(seq, out, hits, computed + num_new)
            budget -= num_new
            if seq.is_batch and batch_room is not None:
                batch_room -= num_new

    def _start(self, seq: Sequence, out: SchedulerOutput, hits: list[int], target: int) -> None:
        """Move waiting ``seq`` to running with the cached prefix blocks ``hits`` and blocks
        up to ``target`` tokens; plan its rows up to there."""
        bm = self.block_manager
        self.waiting.remove(seq)
        if hits:
            bm.take_cached(seq, hits)
            out.num_cached_tokens += len(hits) * bm.block_size
            if seq.metrics.first_scheduled_time is None:  # not a recompute's hits again
                seq.metrics.num_cached_tokens = len(hits) * bm.block_size
        num_new = target - seq.num_computed_tokens
        bm.grow(seq, target)
        if self.swap is not None:
            self.swap.swap_in(seq)  # its swapped KV is copied into the new blocks
        seq.status = SequenceStatus.RUNNING
        self.running.append(seq)
        out.scheduled.append(ScheduledSequence(seq, num_new))
        out.num_admitted += 1

    def _admit_arrivals(self, out: SchedulerOutput) -> None:
        """Admit the interactive requests never scheduled yet, in the policy's order, each prompt
        whole, within the free sequence slots, the free KV blocks and the token budget;
        nothing is preempted and no running sequence is planned (see
        ``Scheduler.schedule_arrivals``)."""
        bm = self.block_manager
        budget = self.max_num_batched_tokens
        arrivals = [s for s in self.waiting if not s.is_batch and s.metrics.first_scheduled_time is None]
        while arrivals and len(self.running) + len(self.padding) < self.max_num_seqs:
            seq = next_waiting(self.policy, arrivals, self.ledger)
            arrivals.remove(seq)
            hits = bm.match_prefix(seq) if seq.prompt_logprobs is None else []
            remaining = seq.num_tokens - len(hits) * bm.block_size
            revived = sum(1 for b in hits if bm.ref_counts[b] == 0)
            needed = bm.blocks_needed(seq.num_tokens) - len(hits)
            if remaining > budget or needed + revived > bm.num_free_blocks:
                return  # the next regular step admits it (and the ones behind it)
            self._start(seq, out, hits, seq.num_tokens)
            budget -= remaining

    def _preempt_lower_priority(self, incoming: Sequence, out: SchedulerOutput) -> bool:
        """Priority policy: make room for ``incoming`` by preempting a lower-priority runner.
        Interactive priority: an interactive ``incoming`` preempts a batch runner."""
        batch = [s for s in self.running if s.is_batch]
        if self.interactive_priority and not incoming.is_batch and batch:
            # it stays first among the waiting batch sequences (interactive ones go first)
            self._preempt(pick_victim(self.policy, batch), out)
            return True
        if self.policy != "priority" or not self.running:
            return False
        victim = pick_victim(self.policy, self.running)
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
        # a swapped sequence keeps its released (out-of-window) entries: readmission
        # allocates, and the swap-in fills, only the blocks inside its window
        self.block_manager.free(seq, keep_released=swapped)
        if not swapped:
            seq.num_computed_tokens = 0
        speculation.drop_drafts(seq)
        seq.status = SequenceStatus.WAITING
        seq.metrics.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
        planned = sum(s.num_new_tokens for s in out.scheduled if s.seq is seq)
        out.scheduled = [s for s in out.scheduled if s.seq is not seq]
        return planned
