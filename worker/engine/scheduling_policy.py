"""Who goes next and who gives way: the orderings behind the scheduler's policies.

- ``fcfs``, ``static`` and ``static-padded`` admit in arrival order;
- ``priority`` admits the highest priority first and preempts the lowest;
- ``sjf`` admits the shortest ``max_tokens`` first;
- ``fair`` admits from the tenant served least so far: weighted tokens computed, or with
  ``fair_share="engine_seconds"`` weighted engine-seconds (each step's wall time split by
  rows, ``step_cost``), so a tenant whose tokens cost more (long contexts, steps with
  little company) is charged what they cost.

Everywhere, a sequence preempted before goes ahead of new arrivals, and a sequence
preempted ``SHIELD_AFTER_PREEMPTIONS`` times is taken as a victim only when nothing else
runs, so it cannot starve.
"""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq

from worker.engine.sequence import Sequence
from worker.engine.step_cost import split_seconds

SHIELD_AFTER_PREEMPTIONS = 3


class TenantLedger:
    """What each tenant was served, divided by its weight (the fair policy's virtual
    time): tokens computed (``unit="tokens"``, charged as steps are planned) or
    engine-seconds (``unit="engine_seconds"``, charged once a step's time is known)."""

    def __init__(self, weights: dict[str, float] | None = None, unit: str = "tokens") -> None:
        self.weights = weights or {}
        self.unit = unit
        self.served: dict[str | None, float] = {}

    def _add(self, tenant: str | None, amount: float) -> None:
        weight = self.weights.get(tenant, 1.0) if tenant is not None else 1.0
        self.served[tenant] = self.served.get(tenant, 0.0) + amount / weight

    def charge(self, tenant: str | None, num_tokens: int) -> None:
        """Add ``num_tokens`` computed for ``tenant`` (a token ledger only)."""
        if self.unit == "tokens":
            self._add(tenant, num_tokens)

    def charge_step(self, seconds: float, rows: dict[str | None, int]) -> None:
        """Add a step's ``seconds``, split by the ``rows`` each tenant computed in it (an
        engine-seconds ledger only)."""
        if self.unit == "engine_seconds":
            for tenant, share in split_seconds(seconds, rows).items():
                self._add(tenant, share)

    def on_arrival(self, tenant: str | None, present: Iterable[Sequence]) -> None:
        """A tenant returning from idle starts at the least-served active tenant's count,
        so idle time does not bank credit that would starve the others later."""
        others = list(present)
        if any(s.tenant == tenant for s in others):
            return
        floor = min((self.served.get(s.tenant, 0.0) for s in others), default=0.0)
        self.served[tenant] = max(self.served.get(tenant, 0.0), floor)


def next_waiting(policy: str, waiting: Seq[Sequence], ledger: TenantLedger) -> Sequence:
    """The waiting sequence ``policy`` serves next."""
    if policy in ("fcfs", "static", "static-padded"):
        return waiting[0]
    if policy == "priority":
        return max(waiting, key=lambda s: (s.priority, s.metrics.num_preemptions, -s.metrics.arrival_time))
    if policy == "sjf":
        return min(waiting, key=lambda s: (-s.metrics.num_preemptions, s.max_tokens, s.metrics.arrival_time))
    # fair: the tenant served least so far goes next; FCFS within a tenant.
    return min(
        waiting,
        key=lambda s: (-s.metrics.num_preemptions, ledger.served.get(s.tenant, 0), s.metrics.arrival_time),
    )


def pick_victim(policy: str, running: Seq[Sequence]) -> Sequence:
    """The running sequence to preempt: lowest priority (priority policy), then latest
    arrived; shielded sequences last."""
    by_priority = policy == "priority"
    return min(
        running,
        key=lambda s: (
            s.metrics.num_preemptions >= SHIELD_AFTER_PREEMPTIONS,
            s.priority if by_priority else 0,
            -s.metrics.arrival_time,
        ),
    )
