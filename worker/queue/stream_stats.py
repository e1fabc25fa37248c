"""Per-stream figures for ``inflight top`` and the metrics: length, pending and undelivered
entries and consumers of the group, for each job stream of one model (the interactive
stream, then each batch lane in the order the workers read them: least slack first) and
its dead-letter stream."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from worker.queue.figures import group_figures
from worker.queue.keys import QueueKeys
from worker.queue.lanes import lane_states, model_rate
from worker.queue.slack import read_order, slack


@dataclass
class StreamStats:
    """One stream as the consumer group sees it. ``pending`` (delivered, not acked),
    ``lag`` (not delivered yet) and ``consumers`` are None where the group does not exist
    (the dead-letter stream has none). Where Redis cannot tell the lag (entries deleted
    in the middle of the stream) it is estimated as length less pending, ``lag_estimated``.
    A batch lane also has its ``deadline`` (epoch seconds, the earliest published into it)
    and its ``slack`` (seconds to spare at the model's measured rate; ``worker.queue.
    slack``)."""

    stream: str
    length: int
    model: str | None = None
    kind: str = ""  # the queue class, or "dead"
    pending: int | None = None
    lag: int | None = None
    consumers: int | None = None
    lag_estimated: bool = False
    deadline: float | None = None
    slack: float | None = None


def stream_stats(
    *, redis_client: redis.Redis, keys: QueueKeys, now: float | None = None
) -> list[StreamStats]:
    """The interactive stream, each lane (least slack first, then the drained ones) and the
    dead-letter stream of ``keys.model``. A missing stream reads as empty."""
    now = time.time() if now is None else now
    lanes = lane_states(redis_client=redis_client, keys=keys)
    rate = model_rate(redis_client=redis_client, keys=keys, now=now) if lanes else None
    ordered = read_order(lanes, now=now, rate=rate)
    ordered += [lane for lane in lanes if lane not in ordered]
    streams = [keys.interactive, *(lane.stream for lane in ordered), keys.dead]
    kinds = ["interactive", *(["batch"] * len(ordered)), "dead"]
    out = []
    for stream, kind, fig in zip(
        streams, kinds, group_figures(redis_client, streams, keys.group), strict=True
    ):
        out.append(StreamStats(
            stream=stream, length=fig.length, model=keys.model, kind=kind,
            pending=fig.pending, lag=fig.lag, consumers=fig.consumers,
            lag_estimated=fig.lag_estimated,
        ))
    for stats, lane in zip(out[1:], ordered, strict=False):
        stats.deadline = lane.deadline
        stats.slack = slack(lane, now=now, rate=rate)
    return out
