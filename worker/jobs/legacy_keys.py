"""Upgrading a deployment from older keys: what they still hold moves to the current ones,
so that nothing is lost and nothing runs twice. Two kinds (``worker.queue.legacy``): the
untagged keys of deployments from before the hash tags (``<prefix>:jobs:<class>``,
``<prefix>:jobs:dead``, ...; a single Redis server only, a cluster never held them), and
a model's one batch stream from before the deadline lanes (``{<prefix>:<model>}:jobs:
batch``; anywhere, each worker moving its own model's).

Every worker runs :func:`move_legacy_keys` as it starts and before each reconcile. When no
old key exists that is one EXISTS. Otherwise, page by page: the worker takes the old
entries nobody runs (never delivered, or left idle for the claim time by a worker that is
gone), looks their jobs up in SQL, and moves each entry to the streams of its job's model
(a batch entry to the lane of the job's deadline, ``jobs.deadline``): open jobs without a
model (rows from before revision 0014 that no worker had run) are given the moving
worker's model first; entries of jobs that ended or are gone are only acked and deleted;
unreadable ones go to the mover's streams, where its intake dead-letters them as usual; a
job a new stream carries already (a reconciler that ran before the move published it
again) is not copied twice. On a cluster an entry of the unlaned stream whose job names
another model (whose keys lie in another slot) is only deleted, and the reconciler
publishes the open job to its model. Entries a live old worker still holds stay with it.
Once no old stream holds an entry that is pending or undelivered, the old dead-letter
stream's entries join the mover's model's and the old keys are deleted (their cancel flags
too: cancels are recorded in SQL, which workers read as well)."""

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
    MoveTo,
    drop_legacy,
    legacy_drained,
    legacy_present,
    move_legacy_dead,
    move_legacy_entries,
    take_legacy_entries,
)
from worker.store.crud.job_status import assign_model
from worker.store.crud.jobs import job_routes
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
    model = keys.model
    if model is None:
        raise ValueError("moving the old keys needs the mover's model")
    cluster = is_cluster(redis_client)
    if not legacy_present(redis_client=redis_client, keys=keys, cluster=cluster):
        return out
    while True:
        owned = take_legacy_entries(
            redis_client=redis_client, keys=keys, mover=mover, min_idle_ms=min_idle_ms,
            cluster=cluster,
        )
        if not owned:
            break
        moves = _destinations(session_factory, owned, model, cluster=cluster)
        copied, deleted = move_legacy_entries(redis_client=redis_client, keys=keys, moves=moves)
        out.moved += copied
        out.dropped += deleted
        if copied + deleted == 0 or len(owned) < PAGE:
            break
    if legacy_drained(redis_client=redis_client, keys=keys, cluster=cluster):
        out.dead = 0 if cluster else move_legacy_dead(redis_client=redis_client, keys=keys)
        drop_legacy(redis_client=redis_client, keys=keys, cluster=cluster)
        out.finished = True
    if out.moved or out.dropped or out.dead or out.finished:
        log.warning(
            "old Redis keys of prefix %r: moved %d entries to the current streams, dropped "
            "%d (ended, or carried already), moved %d dead letters%s", keys.prefix, out.moved, out.dropped,
            out.dead, "; the old keys are gone" if out.finished else "",
        )
    return out


def _destinations(
    session_factory: sessionmaker[Session], owned: list[Delivery], model: str, *, cluster: bool
) -> list[tuple[Delivery, MoveTo]]:
    """Each old entry with where it goes (model None: drop it). Open jobs without a model
    are given ``model`` in SQL first. On a cluster an entry goes to ``model``'s keys or
    nowhere (another model's keys are in another slot: the reconciler publishes the job)."""
    ids = [d.job_id for d in owned if d.message is not None and d.job_id]
    with session_factory.begin() as session:
        routes = job_routes(session=session, job_ids=ids)
        unassigned = [j for j, r in routes.items() if r.status in OPEN and r.model is None]
        if assign_model(session=session, job_ids=unassigned, model=model):
            routes = job_routes(session=session, job_ids=ids)
    moves: list[tuple[Delivery, MoveTo]] = []
    for d in owned:
        if d.message is None:
            moves.append((d, MoveTo(model)))  # unreadable: the mover's intake dead-letters it
            continue
        route = routes.get(d.job_id or "")
        if route is None or route.status not in OPEN or (cluster and route.model != model):
            moves.append((d, MoveTo(None)))
            continue
        deadline = route.deadline.timestamp() if route.deadline is not None else d.message.deadline
        moves.append((d, MoveTo(route.model, deadline)))
    return moves
