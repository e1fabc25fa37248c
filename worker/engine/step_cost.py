"""What a step cost each of its sequences: its wall time split by their share of its work.

A step's work is the query rows it computed (prompt chunks, decode rows, draft-checking
rows); a prompt token served from the prefix cache is not computed, so it costs nothing,
and a static-padded cohort's pad rows are nobody's work (their time goes to the members
that computed). :func:`split_seconds` is the one definition of the split, used for the
engine-seconds of jobs (``worker.service.loop_output``) and for the ``fair`` policy's
engine-seconds ledger (``scheduling_policy.TenantLedger``). The shares of a step add up to
its time (the last one is what the others leave, so they do to the last bit of the running
subtraction; summed in another order, to within float rounding, about 1e-15 of it)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeVar

K = TypeVar("K", bound=Hashable | None)


def split_seconds(seconds: float, work: Mapping[K, int]) -> dict[K, float]:
    """``seconds`` split across the keys of ``work`` (rows computed, per request or per
    tenant) in proportion to their rows; empty when nothing was computed."""
    total = sum(work.values())
    if total <= 0:
        return {}
    shares: dict[K, float] = {}
    left = seconds
    last = len(work) - 1
    for i, (key, rows) in enumerate(work.items()):
        share = left if i == last else seconds * rows / total
        shares[key] = share
        left -= share
    return shares
