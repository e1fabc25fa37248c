"""Upgrading a deployment from before the hash-tagged keys: what its untagged keys still
hold (``<prefix>:jobs:<class>``, ``<prefix>:jobs:dead``, ...) moves to the per-model keys,
so that nothing is lost and nothing runs twice.

Every worker runs :func:`move_legacy_keys` as it starts and before each reconcile (on a
single Redis server; a cluster never held the old names). When no old key exists that is
one EXISTS. Otherwise, page by page: the worker takes the old entries nobody runs
(``worker.queue.legacy``: never delivered, or left idle for the claim time by a worker
that is gone), looks their jobs up in SQL, and moves each entry to the streams of its
job's model: open jobs without a model (rows from before revision 0014 that no worker had
run) are given the moving worker's model first; entries of jobs that ended or are gone
are only acked and deleted; unreadable ones go to the mover's streams, where its intake
dead-letters them as usual; a job a new stream carries already (a reconciler that ran
before the move published it again) is not copied twice. Entries a live old worker still
holds stay with it. Once no
old stream holds an entry that is pending or undelivered, the old dead-letter stream's
entries join the mover's model's and the old keys are deleted (their cancel flags too:
cancels are recorded in SQL, which workers read as well)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis
from sqlalchemy.orm import Session, sessionmaker

from worker.queue.connection import is_cluster
from worker.queue.delivery import Delivery
from worker.queue.keys import QueueKeys
from worker.queue.legacy import (
    PAGE,
    drop_legacy,
    legacy_drained,
    legacy_present,
    move_legacy_dead,
    move_legacy_entries,
    take_legacy_entries,
)
from worker.store.crud.job_status import assign_model
from worker.store.crud.jobs import statuses_and_models
from worker.store.job_lifecycle import OPEN

log = logging.getLogger(__name__)


@dataclass
class LegacyMove:
    """What one run did: entries copied to the new streams (``moved``), entries only
    deleted (``dropped``: their job ended, is gone, or a new stream carries it already),
    dead entries moved, and whether the old keys are gone now."""

    moved: int = 0
    dropped: int = 0
    dead: int = 0
    finished: bool = False


def move_legacy_keys(
    *,
    session_factory: sessionmaker[Session],
    redis_client: redis.Redis,
    keys: QueueKeys,
    mover: str,
    min_idle_ms: int,
) -> LegacyMove:
    """Move what the old keys of ``keys.prefix`` hold (see the module text); ``keys`` name
    the moving worker's model, ``mover`` its consumer name in the old groups."""
    out = LegacyMove()
    if is_cluster(redis_client) or not legacy_present(redis_client=redis_client, keys=keys):
        return out
    model = keys.model
    if model is None:
        raise ValueError("moving the old keys needs the mover's model")
    while True:
        owned = take_legacy_entries(
            redis_client=redis_client, keys=keys, mover=mover, min_idle_ms=min_idle_ms
        )
        if not owned:
            break
        moves = _destinations(session_factory, owned, model)
        copied, deleted = move_legacy_entries(redis_client=redis_client, keys=keys, moves=moves)
        out.moved += copied
        out.dropped += deleted
        if copied + deleted == 0 or len(owned) < PAGE:
            break
    if legacy_drained(redis_client=redis_client, keys=keys):
        out.dead = move_legacy_dead(redis_client=redis_client, keys=keys)
        drop_legacy(redis_client=redis_client, keys=keys)
        out.finished = True
    if out.moved or out.dropped or out.dead or out.finished:
        log.warning(
            "old Redis keys of prefix %r: moved %d entries to the per-model streams, dropped "
            "%d (ended, or carried already), moved %d dead letters%s", keys.prefix, out.moved, out.dropped,
            out.dead, "; the old keys are gone" if out.finished else "",
        )
    return out


def _destinations(
    session_factory: sessionmaker[Session], owned: list[Delivery], model: str
) -> list[tuple[Delivery, str | None]]:
    """Each old entry with the model whose streams it goes to (None: drop it). Open jobs
    without a model are given ``model`` in SQL first."""
    ids = [d.job_id for d in owned if d.message is not None and d.job_id]
    with session_factory.begin() as session:
        state = statuses_and_models(session=session, job_ids=ids)
        unassigned = [j for j, (status, m) in state.items() if status in OPEN and m is None]
        if assign_model(session=session, job_ids=unassigned, model=model):
            state = statuses_and_models(session=session, job_ids=ids)
    moves: list[tuple[Delivery, str | None]] = []
    for d in owned:
        if d.message is None:
            moves.append((d, model))  # unreadable: the mover's intake dead-letters it
            continue
        status, job_model = state.get(d.job_id or "", ("", None))
        moves.append((d, job_model if status in OPEN else None))
    return moves
