"""One step's plan and what comes back from it: the types every stage of a step reads.

A step is schedule -> execute -> update. The scheduler writes a :class:`SchedulerOutput`
(which sequences run and how many query rows each computes), the model runner packs it
and returns logits for the rows that :attr:`SchedulerOutput.logits_rows` names, the
sampler and the draft verifier turn those rows into a :class:`SampledStep`, and
``Scheduler.update_from_output`` applies it and says, per sequence, what it appended and
whether it ended (:class:`Appended`).

Kinds of row (each scheduled sequence is exactly one):

- **decode**: exactly one query row (``num_new_tokens == 1``). Attention runs it on its
  decode path, and the plan lists decodes first. This is the only definition of
  "decode" in the engine; a one-token prompt chunk is a decode too.
- **verify**: the last sampled token plus ``num_draft_tokens`` drafts; attention runs it
  as a prefill chunk.
- **prefill**: a chunk of prompt (or of recompute after preemption) longer than one row.
- **pad** (``static-padded`` policy only): a finished member of a cohort that still fills
  its slot. One decode row over its context that writes no K/V and samples nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from worker.engine.outputs import TokenLogprob
from worker.engine.sequence import Sequence


@dataclass(eq=False, slots=True)
class ScheduledSequence:
    """A sequence in this step and how many query rows it computes, fixed when planned."""

    seq: Sequence
    num_new_tokens: int  # query rows, drafts included
    num_draft_tokens: int = 0  # speculative tokens after the last sampled one
    is_pad: bool = False  # a finished static-padded member: computes, writes and samples nothing
    start: int = field(init=False)  # position of the first query row
    samples: bool = field(init=False)  # the chunk reaches the last token: a token is sampled

    def __post_init__(self) -> None:
        computed = self.seq.num_computed_tokens
        # A pad row re-reads the last computed position, whose K/V is already cached.
        self.start = computed - 1 if self.is_pad else computed
        real = self.num_new_tokens - self.num_draft_tokens
        self.samples = not self.is_pad and self.start + real == self.seq.num_tokens

    @classmethod
    def decode(cls, seq: Sequence) -> ScheduledSequence:
        """``seq``'s plain decode row (its newest token, no drafts): what the constructor
        makes of ``(seq, 1)``, made without its general arithmetic (the hot path)."""
        s = cls.__new__(cls)
        s.seq, s.num_new_tokens, s.num_draft_tokens, s.is_pad = seq, 1, 0, False
        s.start, s.samples = seq.num_computed_tokens, True
        return s

    @property
    def is_decode(self) -> bool:
        """One query row: attention runs it on the decode path (see the module doc)."""
        return self.num_new_tokens == 1

    @property
    def num_real_tokens(self) -> int:
        """Query rows that are the sequence's own tokens (not drafts)."""
        return self.num_new_tokens - self.num_draft_tokens

    @property
    def prompt_logprob_positions(self) -> range:
        """Positions of this step's rows whose next token is a prompt token not yet scored,
        when the request asks for prompt logprobs (empty otherwise). A recompute after
        preemption skips the positions scored before."""
        scored = self.seq.prompt_logprobs
        if scored is None or self.is_pad:
            return range(0)
        first = max(self.start, len(scored) - 1)
        last = min(self.start + self.num_real_tokens, self.seq.num_prompt_tokens - 1)
        return range(first, max(first, last))

    @property
    def num_logits_rows(self) -> int:
        """Logits rows this sequence needs: one per draft plus one, when it samples."""
        return 1 + self.num_draft_tokens if self.samples else 0

    def query_token_ids(self) -> list[int]:
        """The token ids this step feeds through the model for this sequence."""
        own = self.seq.token_ids[self.start : self.start + self.num_real_tokens]
        return own + self.seq.draft_token_ids[: self.num_draft_tokens]


@dataclass
class LogitsRows:
    """Which packed query rows give logits, and which logits rows belong to whom."""

    token_indices: list[int]  # per logits row: its row in the packed batch
    owners: list[tuple[ScheduledSequence, int]]  # per sampling sequence: its first logits row
    # per sequence scoring its prompt: its first logits row and the positions they score
    prompt_rows: list[tuple[ScheduledSequence, int, range]] = field(default_factory=list)


@dataclass
class RowCounts:
    """A step's rows by kind (see the module doc)."""

    decode: int = 0  # one-row sequences, pad rows apart
    verify: int = 0  # rows of sequences checking drafts: last sampled token plus drafts
    prefill: int = 0  # rows of chunks longer than one, without drafts
    pad: int = 0  # rows of finished static-padded members
    draft: int = 0  # speculative tokens among the verify rows


@dataclass
class SchedulerOutput:
    """One step's plan: decodes first, then verify and prefill chunks."""

    scheduled: list[ScheduledSequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    num_admitted: int = 0
    num_cached_tokens: int = 0
    block_copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) KV copies
    # rows each tenant computes (pad rows left out), filled as the plan is stamped
    tenant_rows: dict[str | None, int] = field(default_factory=dict)

    @cached_property
    def logits_rows(self) -> LogitsRows:
        """The logits-row layout of the step (computed here only; read once planned)."""
        scheduled = self.scheduled
        if all(s.num_new_tokens == 1 and s.samples and s.seq.prompt_logprobs is None for s in scheduled):
            rows = range(len(scheduled))  # plain decodes: row i is sequence i's only row
            return LogitsRows(list(rows), list(zip(scheduled, rows, strict=True)))
        token_indices: list[int] = []
        owners: list[tuple[ScheduledSequence, int]] = []
        prompt_rows: list[tuple[ScheduledSequence, int, range]] = []
        end = 0
        for s in self.scheduled:
            begin, end = end, end + s.num_new_tokens
            positions = s.prompt_logprob_positions  # rows before the sampled one, if any
            if positions:
                prompt_rows.append((s, len(token_indices), positions))
                token_indices.extend(begin + p - s.start for p in positions)
            if s.samples:
                owners.append((s, len(token_indices)))
                token_indices.extend(range(end - s.num_logits_rows, end))
        return LogitsRows(token_indices, owners, prompt_rows)

    @cached_property
    def row_counts(self) -> RowCounts:
        """The step's rows by kind, counted in one pass (read once planned)."""
        counts = RowCounts()
        for s in self.scheduled:
            n, drafts = s.num_new_tokens, s.num_draft_tokens
            if s.is_pad:
                counts.pad += 1
            elif drafts:
                counts.verify += n
                counts.draft += drafts
            elif n == 1:
                counts.decode += 1
            else:
                counts.prefill += n
        return counts

    @property
    def num_decode_tokens(self) -> int:
        """Decode rows of live sequences (pad rows are counted apart)."""
        return self.row_counts.decode

    @property
    def num_verify_tokens(self) -> int:
        """Rows of sequences that check drafts: the last sampled token plus the drafts."""
        return self.row_counts.verify

    @property
    def num_prefill_tokens(self) -> int:
        """Rows of prompt (or recompute) chunks longer than one."""
        return self.row_counts.prefill

    @property
    def num_pad_rows(self) -> int:
        """Rows computed for finished members of a padded static cohort."""
        return self.row_counts.pad

    @property
    def num_draft_tokens(self) -> int:
        """Speculative tokens checked this step."""
        return self.row_counts.draft

    @property
    def is_empty(self) -> bool:
        """Nothing to run."""
        return not self.scheduled


@dataclass(slots=True)
class SampledTokens:
    """What one sequence appends after a step: sampled, or verified drafts plus one."""

    seq: Sequence
    tokens: list[tuple[int, TokenLogprob | None]]
    num_drafts: int = 0  # drafts it checked this step


@dataclass
class SampledStep:
    """What sampling a step gives the scheduler's update: the tokens each sampling sequence
    appends (one sampled token each for most, in three parallel lists, so that the common
    step makes no object per sequence; verified drafts plus one in ``tokens``), the
    sequences whose rows could not be used (and why: they fail alone), and how many drafts
    were accepted."""

    seqs: list[Sequence] = field(default_factory=list)  # each appends one sampled token
    token_ids: list[int] = field(default_factory=list)  # seqs[i]'s token
    logprobs: list[TokenLogprob | None] = field(default_factory=list)  # and its logprobs
    tokens: list[SampledTokens] = field(default_factory=list)  # several tokens each
    failed: list[tuple[Sequence, str]] = field(default_factory=list)
    num_accepted: int = 0

    @property
    def appending(self) -> list[Sequence]:
        """Every sequence that appends tokens this step."""
        return self.seqs + [entry.seq for entry in self.tokens]


@dataclass(slots=True)
class Appended:
    """One sequence's result of ``Scheduler.update_from_output``: its new tokens, and
    whether it ended (its ``finish_reason`` says how)."""

    seq: Sequence
    new_token_ids: list[int]
    finished: bool
