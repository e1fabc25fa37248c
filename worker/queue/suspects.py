"""Evidence against redelivered jobs, so a poison job is isolated by bisection, not suspicion.

A job delivered again after its worker died is a *suspect*, but almost always an innocent
one: every job in flight when a worker is killed comes back. Suspects therefore run in
*cohorts*: a group of suspects admitted together, one cohort at a time per worker. Before a
cohort runs, each member's record in the ``suspects`` hash (field ``"<stream> <entry id>"``)
gets an open run: which worker, how many suspects beside it, whether it ran alone. A run
that ends (result written and acked, job handed back, dead-lettered) deletes the record,
in the same Redis round trip as that ack; so a record found on the
next redelivery means the run it names never ended: its worker died with it.

From that evidence the next cohort is half the size of the one that died (the first
cohort, with no record, is as large as the worker has room for), so one poison job among N
suspects is cornered in about log2(N) deaths while the others finish in batches; a job that
was running *alone* when its worker died is the poison, and is dead-lettered with the
evidence instead of being run again.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import redis

from worker.queue.keys import QueueKeys


@dataclass
class Run:
    """One cohort run of a suspect: where, with how many suspects, and when it began."""

    worker: str
    group: int
    at: float

    @property
    def alone(self) -> bool:
        """The suspect ran with no other job in the engine."""
        return self.group == 1


@dataclass
class Evidence:
    """The runs of one entry that never ended (oldest first)."""

    runs: list[Run] = field(default_factory=list)

    def next_cohort_size(self, room: int) -> int:
        """How many suspects may run beside this one next: half the cohort that died with
        it, or all the ``room`` there is when no cohort of its died yet."""
        if not self.runs:
            return max(1, room)
        return max(1, min(room, math.ceil(self.runs[-1].group / 2)))

    @property
    def crashed_alone(self) -> bool:
        """Its worker died while it ran alone: it reproduces the failure by itself."""
        return bool(self.runs) and self.runs[-1].alone

    def describe(self) -> str:
        """One line for the job's record, e.g. ``its worker died in 3 runs: ...``."""
        if not self.runs:
            return "its worker died while it ran in a normal batch (no isolated run yet)"
        parts = [
            f"{'alone' if r.alone else f'in a group of {r.group} suspects'} on {r.worker} "
            f"at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(r.at))}"
            for r in self.runs
        ]
        return f"its worker died in {len(self.runs)} isolated run(s): " + "; ".join(parts)


@dataclass
class CohortChoice:
    """What to do next with the suspects: dead-letter ``guilty`` now, or run ``cohort``
    together (both empty: wait for room)."""

    guilty: list[tuple[str, str]] = field(default_factory=list)
    cohort: list[tuple[str, str]] = field(default_factory=list)


def choose_cohort(
    suspects: list[tuple[str, str]], evidence: dict[tuple[str, str], Evidence], room: int
) -> CohortChoice:
    """The next step for ``suspects`` (in delivery order) given their ``evidence`` and the
    worker's ``room``: any whose worker died while it ran alone are guilty; otherwise the
    suspects with the most evidence go first, as many as half the cohort that last died
    with the first of them (all the room there is when none did). A cohort beside the
    batch waits for room; a cohort of one runs alone and needs none."""
    guilty = [e for e in suspects if evidence[e].crashed_alone]
    if guilty:
        return CohortChoice(guilty=guilty)
    everything = 1 << 30
    ordered = sorted(suspects, key=lambda e: evidence[e].next_cohort_size(everything))
    cap = evidence[ordered[0]].next_cohort_size(everything) if ordered else 0
    if not ordered or (cap > 1 and room <= 0):
        return CohortChoice()
    return CohortChoice(cohort=ordered[: min(cap, max(room, 1))])


def field_of(stream: str, entry_id: str) -> str:
    """The hash field of one stream entry."""
    return f"{stream} {entry_id}"


def read_evidence(
    *, redis_client: redis.Redis, keys: QueueKeys, entries: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], Evidence]:
    """The evidence of each ``(stream, entry_id)`` (an empty one where there is none)."""
    if not entries:
        return {}
    raw = cast(Any, redis_client).hmget(keys.suspects, [field_of(s, e) for s, e in entries])
    out: dict[tuple[str, str], Evidence] = {}
    for entry, value in zip(entries, raw, strict=True):
        out[entry] = _decode(value)
    return out


def open_runs(
    *,
    redis_client: redis.Redis,
    keys: QueueKeys,
    cohort: dict[tuple[str, str], Evidence],
    worker: str,
    now: float | None = None,
) -> None:
    """Record that ``cohort`` (each entry with its evidence so far) starts a run together on
    ``worker``; written before the first member is admitted, so a death mid-run is seen."""
    if not cohort:
        return
    run = Run(worker=worker, group=len(cohort), at=time.time() if now is None else now)
    mapping = {
        field_of(s, e): json.dumps({"runs": [asdict(r) for r in [*ev.runs, run]]})
        for (s, e), ev in cohort.items()
    }
    redis_client.hset(keys.suspects, mapping=mapping)  # type: ignore[arg-type]


def _decode(value: Any) -> Evidence:
    if not value:
        return Evidence()
    try:
        runs = json.loads(value)["runs"]
        return Evidence([Run(str(r["worker"]), int(r["group"]), float(r["at"])) for r in runs])
    except (ValueError, KeyError, TypeError):
        return Evidence()  # an unreadable record counts as none: the job runs batched
