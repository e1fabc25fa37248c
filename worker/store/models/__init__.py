"""The tables: jobs, iterations, batches, workers."""

from worker.store.models.batch import Batch, BatchStatus
from worker.store.models.iteration import Iteration
from worker.store.models.job import Job, JobStatus
from worker.store.models.worker import Worker, WorkerStatus

__all__ = [
    "Batch",
    "BatchStatus",
    "Iteration",
    "Job",
    "JobStatus",
    "Worker",
    "WorkerStatus",
]
from worker.store.models.api_job import ApiJob  # noqa: F401
from worker.store.models.api_key import ApiKey  # noqa: F401
from worker.store.models.batch_progress import BatchProgress  # noqa: F401
from worker.store.models.file import StoredFile  # noqa: F401
from worker.store.models.webhook_secret import WebhookSecret  # noqa: F401
