"""Deadline lanes and the least-slack order of reading them: the one rule the workers read
by (``worker.service.dispatch``), that the queue's figures and estimates use, and that the
simulation (``benchmarks/deadline_sim.py``) imports. Pure functions, no Redis.

**Lanes.** Batch work of one model is split by deadline into *lanes*, one stream per
deadline bucket. A job published ``w`` seconds before its deadline goes to the bucket of
width :func:`lane_width` ``(w)``: the largest ``60 * 2**k`` seconds not above ``w / 8``
(at least 60 s), and the lane is named by the bucket's end (:func:`lane_end`). So a lane
spans at most an eighth of the windows published into it: the order inside a lane (arrival,
as in any stream) is off by at most that much, while the number of lanes stays small: at
any time about 16 per width in use (the buckets of the next 8 to 16 widths), and widths are
powers of two, so a dozen octaves of windows (a minute to a year) make a few hundred lanes
at most, a few in practice (a day of 24-hour batches: 12).

**Slack.** A lane's slack is its deadline (the earliest deadline published into it) less
now, less the time its remaining work takes at the model's measured rate:

    slack = deadline - now - remaining_entries * work_per_entry / rate

Workers read the lane of least slack first and go on down the order while they have room
(work-conserving: a tight lane that cannot fill a worker leaves the room to the next). The
lane being read keeps its slack (its work shrinks as fast as time passes), every waiting
lane's slack shrinks by a second per second, so a long-window lane's turn comes before its
deadline does: no lane starves while the work fits in the time. Without a measured rate
the work term is left out and the order is earliest deadline first. :func:`read_order`
says how slacks within a quarter hour and lanes that cannot make it any more are read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

DEFAULT_WINDOW_S = 24 * 3600
"""The deadline of batch work that names none: this long after it was queued (OpenAI's
completion window)."""

MIN_LANE_WIDTH_S = 60
LANE_WIDTH_FRACTION = 8  # a lane spans at most this fraction of a job's window
SLACK_QUANTUM_S = 900  # slacks closer than this read as equal (read_order)


def lane_width(window_s: float) -> int:
    """Seconds of the deadline bucket of a job published ``window_s`` before its deadline:
    ``60 * 2**k``, the largest not above ``window_s / 8`` (60 for any window up to 16 min,
    a passed deadline included)."""
    width = MIN_LANE_WIDTH_S
    while width * 2 * LANE_WIDTH_FRACTION <= window_s:
        width *= 2
    return width


def lane_end(deadline: float, now: float) -> int:
    """The lane of a job due at ``deadline`` published at ``now`` (epoch seconds): the end
    of its deadline bucket, a multiple of :func:`lane_width` (the deadline rounded up)."""
    width = lane_width(deadline - now)
    return math.ceil(deadline / width) * width


@dataclass(frozen=True)
class LaneState:
    """One lane as a reader sees it. ``deadline``: the earliest deadline published into it
    (epoch seconds); ``remaining``: entries not done (undelivered, or pending with a
    worker); ``undelivered``: of them, not yet read by any worker; ``work_per_entry``: the
    mean estimated work (tokens) of what was published into it."""

    stream: str
    deadline: float
    remaining: int
    undelivered: int
    work_per_entry: float

    @property
    def remaining_work(self) -> float:
        """Estimated tokens of its remaining entries."""
        return self.remaining * self.work_per_entry


def slack(lane: LaneState, *, now: float, rate: float | None) -> float:
    """Seconds ``lane`` has to spare: deadline - now - remaining work / ``rate`` (estimated
    tokens per second, the whole model's; None or 0: unknown, the work term left out)."""
    spare = lane.deadline - now
    return spare - lane.remaining_work / rate if rate else spare


def read_order(lanes: Iterable[LaneState], *, now: float, rate: float | None) -> list[LaneState]:
    """The lanes with entries to read, in the order a worker reads them (going on to the
    next while it has room): least slack first, with two refinements that the simulation
    (``benchmarks/deadline_sim.py``) shows to matter:

    - slacks that differ by less than ``SLACK_QUANTUM_S`` count as equal, and the earlier
      deadline goes first: the estimates are not finer than that, and two lanes read in
      turn for a few minutes' difference are both served late, as under processor sharing;
    - a lane that cannot meet its deadline even with the whole model's rate (negative
      slack, deadline still ahead) goes after the lanes that still can: it misses anyway,
      and feeding it first would make them miss too (the domino effect of least slack and
      earliest deadline under overload). It still takes the room they leave, and once its
      deadline has passed it goes first again (overdue work; a batch's is skipped quickly,
      its jobs cancelled by the batch's expiry).

    Ties: earlier deadline, then name."""
    def key(lane: LaneState) -> tuple[bool, int, float, str]:
        spare = slack(lane, now=now, rate=rate)
        hopeless = spare < 0 < lane.deadline - now
        return hopeless, math.floor(spare / SLACK_QUANTUM_S), lane.deadline, lane.stream

    return sorted((lane for lane in lanes if lane.undelivered > 0), key=key)


@dataclass(frozen=True)
class WorkDue:
    """Queued batch work due at or before some deadline: ``entries`` not done and their
    estimated ``work`` (tokens)."""

    entries: int = 0
    work: float = 0.0


def work_due_by(lanes: Sequence[LaneState], deadline: float) -> WorkDue:
    """The remaining work of the lanes whose deadline is at or before ``deadline``: what
    least-slack reading puts ahead of work due then, at the least (lanes due later run
    first only where their slack is smaller)."""
    due = [lane for lane in lanes if lane.deadline <= deadline]
    return WorkDue(sum(ln.remaining for ln in due), sum(ln.remaining_work for ln in due))
