"""A delivered stream entry: where it came from, how often it was delivered, and its message."""

from __future__ import annotations

from dataclasses import dataclass

from worker.queue.message import JobMessage


@dataclass
class Delivery:
    """One entry handed to this consumer. ``message`` is None when the entry could not be
    decoded (``error`` says why); such entries are dead-lettered."""

    stream: str
    entry_id: str
    fields: dict[str, str]
    message: JobMessage | None
    deliveries: int = 1
    error: str | None = None

    @property
    def job_id(self) -> str | None:
        """The job id, if the message could be read."""
        if self.message is not None:
            return self.message.job_id
        return self.fields.get("job_id") if self.fields else None
