"""The job lifecycle: every move of a job's status is made here, always SQL first (committed),
then Redis.

- :mod:`worker.jobs.enqueue`: rows committed ``queued``, then one message per job published;
- :mod:`worker.jobs.start`: delivered jobs marked running (their entries stay pending);
- :mod:`worker.jobs.finish`: results committed, then their entries acked and cancel flags
  cleared (a result the store refuses is stored as a failure);
- :mod:`worker.jobs.cancel`: a cancel (of one job, of a batch's jobs, of an expired batch's)
  recorded in SQL, then signalled to the running jobs' workers;
- :mod:`worker.jobs.dead_letter`: a job failed in SQL, then its entry moved aside;
- :mod:`worker.jobs.hand_back`: a held job requeued in SQL, then its entry re-published;
- :mod:`worker.jobs.republish`: open jobs no stream carries published again.

The store's half of each move is ``worker/store/crud/job_status.py``, the only code that
writes ``jobs.status`` and which only this package may import (an import contract); each of
its writes starts only from its move's sources in the transition table,
``worker/store/job_lifecycle.py``. ``worker.queue`` is Redis only and ``worker.store`` SQL
only; only this package joins them (the service and the API call it).
"""
