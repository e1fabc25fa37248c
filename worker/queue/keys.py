"""Names of every Redis key the service uses: the only place a key string is made.

Every key that a script, a transaction or a multi-key command uses together with another
carries the same *hash tag*, so that a Redis Cluster places them in one slot (a cluster
hashes only the text between a key's first ``{`` and the ``}`` after it):

- per model, tag ``{<prefix>:<model>}``: the interactive stream, the batch *lanes* (one
  stream per deadline bucket, ``:jobs:batch:<bucket end>``: ``worker.queue.lanes``) with
  their sorted set and work counters, the dead-letter stream, the carried-jobs index and
  its ready marker, the suspects hash, the workers' measured rates and the admission
  probe. Publishing, reissuing, acking and dead-lettering touch a stream, the lane set, the
  index and the suspects in one script or transaction; a worker's blocking XREADGROUP
  reads several of its model's streams in one command. Each model's keys hash to their own
  slot, so models spread over the shards.
- per deployment, tag ``{<prefix>}``: the cancel flags (a set and its sorted set of flag
  times, changed together by one script) and the locks (reconciler, consumer names, batch
  finalization).
- untagged, one key per command: each job's event stream (``<prefix>:job:deltas:<id>``)
  and each tenant's submissions-per-minute counter (``<prefix>:rate:<tenant>:<minute>``):
  hashed whole, so they spread over the shards.

Deployments from before the tags used ``<prefix>:jobs:<class>``, ``<prefix>:carried``, ...
(:class:`LegacyKeys`); ``worker.jobs.legacy_keys`` moves what they still hold.

A model id is written into key names percent-encoded where it holds ``{``, ``}``, ``%``,
white space or control characters, so no model id can open or close a tag.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from urllib.parse import quote

QUEUE_CLASSES = ("interactive", "batch")  # read in this order
LANE_INFIX = ":jobs:batch:"  # a batch lane: <model tag>:jobs:batch:<bucket end, epoch s>

_MODEL_SAFE = "/:@+=,!$&'()*;<>[]^|`\"#?"  # kept as is in a key; quote() keeps A-Za-z0-9_.-~


def model_key_text(model: str) -> str:
    """``model`` as it appears inside a key name (braces, %, spaces percent-encoded)."""
    return quote(model, safe=_MODEL_SAFE)


@dataclass(frozen=True)
class LegacyKeys:
    """The untagged key names of deployments from before the hash tags (one set of streams
    for every model), read only to move what they hold (``worker.jobs.legacy_keys``)."""

    prefix: str

    @property
    def streams(self) -> list[str]:
        """The old job streams, interactive first."""
        return [f"{self.prefix}:jobs:{c}" for c in QUEUE_CLASSES]

    def class_of(self, stream: str) -> str:
        """The queue class of an old stream key."""
        for queue_class, name in zip(QUEUE_CLASSES, self.streams, strict=True):
            if name == stream:
                return queue_class
        raise ValueError(f"{stream!r} is not a legacy job stream of prefix {self.prefix!r}")

    @property
    def dead(self) -> str:
        """The old dead-letter stream."""
        return f"{self.prefix}:jobs:dead"

    @property
    def carried(self) -> str:
        """The old carried-jobs index."""
        return f"{self.prefix}:carried"

    @property
    def others(self) -> list[str]:
        """The old index, its ready marker and the suspects (deleted once the streams are
        drained)."""
        return [self.carried, f"{self.prefix}:carried:ready", f"{self.prefix}:suspects"]

    @property
    def cancels(self) -> str:
        """The old set of job ids to cancel."""
        return f"{self.prefix}:cancels"

    @property
    def cancels_at(self) -> str:
        """The old sorted set of when each cancel flag was set."""
        return f"{self.cancels}:at"


@dataclass(frozen=True)
class QueueKeys:
    """Key names under ``prefix`` (tests use a unique prefix each) for one ``model``.

    A worker's keys name the model it serves. The API's and the reconciler's keys may
    name none (``model=None``): they reach the deployment-wide keys directly and a model's
    keys through :meth:`for_model`; asking them for a per-model key raises ValueError."""

    prefix: str = "inflight"
    group: str = "workers"
    model: str | None = None

    def __post_init__(self) -> None:
        if not self.prefix or any(c in self.prefix for c in "{}"):
            raise ValueError(f"Redis key prefix {self.prefix!r}: must be non-empty, without braces")
        if self.model is not None and not self.model:
            raise ValueError("model: an empty model id")

    def for_model(self, model: str) -> QueueKeys:
        """The keys of ``model`` in this deployment."""
        return self if model == self.model else replace(self, model=model)

    # -- per model: tag {prefix:model} ---------------------------------------------------
    @property
    def model_tag(self) -> str:
        """The hash tag of this model's keys, ``{<prefix>:<model>}``."""
        if self.model is None:
            raise ValueError("these queue keys name no model; use keys.for_model(model)")
        return "{" + f"{self.prefix}:{model_key_text(self.model)}" + "}"

    @property
    def interactive(self) -> str:
        """This model's interactive stream (read before any batch lane)."""
        return f"{self.model_tag}:jobs:interactive"

    def stream(self, queue_class: str) -> str:
        """The stream of ``interactive`` work. Batch work has no one stream: each job goes to
        the lane of its deadline (:meth:`lane`, ``worker.queue.lanes``)."""
        if queue_class == "interactive":
            return self.interactive
        if queue_class == "batch":
            raise ValueError("batch work goes to the lane of its deadline: keys.lane(end), "
                             "worker.queue.lanes")
        raise ValueError(f"queue class {queue_class!r}: expected one of {QUEUE_CLASSES}")

    def lane(self, end: int) -> str:
        """The batch lane of the deadline bucket ending at ``end`` (epoch seconds)."""
        return f"{self.model_tag}{LANE_INFIX}{int(end)}"

    def lane_end(self, stream: str) -> int | None:
        """The bucket end of one of this model's lanes (None: ``stream`` is not one)."""
        head = f"{self.model_tag}{LANE_INFIX}"
        tail = stream[len(head):] if stream.startswith(head) else ""
        return int(tail) if tail.isdigit() else None

    def class_of(self, stream: str) -> str:
        """The queue class of one of this model's job streams (a lane is ``batch``)."""
        if stream == self.interactive:
            return "interactive"
        if self.lane_end(stream) is not None:
            return "batch"
        raise ValueError(f"{stream!r} is not a job stream of {self.model_tag}")

    @property
    def unlaned_batch(self) -> str:
        """The one batch stream of this model in deployments from before the lanes, read
        only to move what it holds into the lanes (``worker.jobs.legacy_keys``)."""
        return f"{self.model_tag}:jobs:batch"

    @property
    def lanes(self) -> str:
        """Sorted set of this model's batch lanes, each scored by the earliest deadline
        published into it (``worker.queue.lanes``)."""
        return f"{self.model_tag}:lanes"

    @property
    def lane_work(self) -> str:
        """Hash of what was published into each lane: ``<lane>|n`` entries and ``<lane>|w``
        their estimated work (tokens), so a lane's mean work per entry is known."""
        return f"{self.model_tag}:lanes:work"

    @property
    def rates(self) -> str:
        """Hash consumer -> ``"<work per engine-second> <epoch s>"``: each worker's measured
        throughput, summed into the model's (``worker.queue.lanes.model_rate``)."""
        return f"{self.model_tag}:rates"

    @property
    def dead(self) -> str:
        """This model's dead-letter stream."""
        return f"{self.model_tag}:jobs:dead"

    @property
    def suspects(self) -> str:
        """Hash of evidence against redelivered entries (see ``worker.queue.suspects``)."""
        return f"{self.model_tag}:suspects"

    @property
    def carried(self) -> str:
        """Hash job id -> the stream entry carrying it (see ``worker.queue.carried``)."""
        return f"{self.model_tag}:carried"

    @property
    def carried_ready(self) -> str:
        """Set once ``carried`` was built from the streams: from then on it is complete."""
        return f"{self.model_tag}:carried:ready"

    @property
    def admission_probe(self) -> str:
        """A tiny expiring key written before a publish: the node holding this model's
        streams refuses it first when it refuses writes (``worker.queue.admission``)."""
        return f"{self.model_tag}:admission-probe"

    # -- per deployment: tag {prefix} ----------------------------------------------------
    @property
    def deployment_tag(self) -> str:
        """The hash tag of the deployment-wide keys, ``{<prefix>}``."""
        return "{" + self.prefix + "}"

    @property
    def cancels(self) -> str:
        """Set of job ids whose cancellation a worker must carry out."""
        return f"{self.deployment_tag}:cancels"

    @property
    def cancels_at(self) -> str:
        """Sorted set of when each cancel flag was set (``worker.queue.cancel``)."""
        return f"{self.cancels}:at"

    @property
    def reconcile_lock(self) -> str:
        """Lock so only one reconciler runs at a time."""
        return f"{self.deployment_tag}:lock:reconcile"

    def consumer_lock(self, consumer: str) -> str:
        """Lock held by the live worker that uses consumer name ``consumer``."""
        return f"{self.deployment_tag}:lock:consumer:{consumer}"

    def finalize_lock(self, batch_id: str) -> str:
        """Lock so one process at a time finalizes batch ``batch_id``."""
        return f"{self.deployment_tag}:lock:finalize:{batch_id}"

    # -- one key per command: untagged, spread over the shards ---------------------------
    def deltas(self, job_id: str) -> str:
        """The events stream of one job that someone waits on: its text deltas as the
        worker produces them (streamed jobs) and its end (``worker.queue.job_events``)."""
        return f"{self.prefix}:job:deltas:{job_id}"

    def rate(self, tenant: str, minute: int) -> str:
        """The counter of ``tenant``'s submissions in one minute (``api.quotas``)."""
        return f"{self.prefix}:rate:{tenant}:{minute}"

    # -- everything ----------------------------------------------------------------------
    @property
    def patterns(self) -> list[str]:
        """SCAN MATCH patterns that together cover every key of this deployment (of every
        model, and the legacy names)."""
        glob = self.prefix.replace("\\", "\\\\")
        for special in "*?[]":
            glob = glob.replace(special, "\\" + special)
        return ["{" + glob + "}*", "{" + glob + ":*", glob + ":*"]

    @property
    def legacy(self) -> LegacyKeys:
        """The untagged key names this prefix had before the hash tags."""
        return LegacyKeys(self.prefix)
