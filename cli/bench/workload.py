"""Benchmark workloads: JSONL files of ``{"id", "prompt_token_ids", "max_tokens"}`` lines.

Nothing here imports torch: the workload generator and the metrics use it too.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_WORKLOAD = REPO_ROOT / "benchmarks" / "heavy_tailed.jsonl"


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload: a prompt as token ids and a fixed output length."""

    id: str
    prompt_token_ids: list[int]
    max_tokens: int


def read_workload(path: str | Path, limit: int | None = None) -> list[BenchRequest]:
    """The requests of a workload file, in file order (the first ``limit`` when given)."""
    requests: list[BenchRequest] = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            ids, n = row.get("prompt_token_ids"), row.get("max_tokens")
            if not ids or not all(isinstance(t, int) for t in ids):
                raise ValueError(f"{path}:{number}: prompt_token_ids must be a non-empty int list")
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"{path}:{number}: max_tokens must be an integer >= 1")
            requests.append(BenchRequest(str(row.get("id", f"req-{number}")), list(ids), n))
    return requests[:limit] if limit is not None else requests


def write_workload(path: str | Path, requests: Iterable[BenchRequest]) -> None:
    """Write ``requests`` as one compact JSON object per line."""
    with open(path, "w", encoding="utf-8") as f:
        for r in requests:
            row = {"id": r.id, "max_tokens": r.max_tokens, "prompt_token_ids": r.prompt_token_ids}
            f.write(json.dumps(row, separators=(",", ":")) + "\n")


def write_or_check(path: str | Path, requests: list[BenchRequest], *, check: bool,
                   source: str) -> bool:
    """Write ``requests`` to ``path``, or with ``check`` only compare them with the file;
    False (and a message naming ``source``) when the committed file differs."""
    if not check:
        write_workload(path, requests)
        return True
    if read_workload(path) != requests:
        print(f"{path} differs from {source}", file=sys.stderr)
        return False
    return True


def fit_to_vocab(requests: Sequence[BenchRequest], vocab_size: int) -> list[BenchRequest]:
    """Fold token ids into ``[0, vocab_size)`` (only changes anything for tiny test models)."""
    return [BenchRequest(r.id, [t % vocab_size for t in r.prompt_token_ids], r.max_tokens)
            for r in requests]


def cohorts(items: Sequence, size: int) -> list[Sequence]:
    """Consecutive groups of ``size`` (the last one may be shorter), in workload order."""
    return [items[i:i + size] for i in range(0, len(items), size)]


def static_utilization(max_tokens: Sequence[int], cohort_size: int = 16) -> float:
    """U_static: useful slot-steps over slot-steps when cohorts of ``cohort_size`` run to
    their longest member: sum(n) / sum over cohorts of cohort_size * max(n in cohort)."""
    if not max_tokens:
        return 0.0
    slot_steps = sum(cohort_size * max(c) for c in cohorts(max_tokens, cohort_size))
    return sum(max_tokens) / slot_steps
